//! Starting and stopping: the listener, the caches opened, the model loaded on slot 0 while
//! `/health` says 503, and shutdown on SIGTERM or Ctrl-C after the requests in flight.

use super::metrics::Metrics;
use super::options::ServeOptions;
use super::routes::router;
use super::shared::Shared;
use super::slots::{Admission, Pool};
use super::state::{AppState, Loaded};
use super::upstream::Upstreams;
use super::{prefixes, responses};
use crate::error::Error;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Serve until SIGTERM or Ctrl-C. Prints `kerze serve: listening on http://HOST:PORT` once
/// the port is bound (the model may still be loading: `/health` says when it is ready).
pub fn run(opts: ServeOptions) -> crate::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(serve(opts))
}

async fn serve(opts: ServeOptions) -> crate::Result<()> {
    let shared = match &opts.shared {
        Some(url) => Some(Arc::new(Shared::open(url).map_err(|e| {
            Error::InvalidArgument(format!("the shared response cache: {e}"))
        })?)),
        None => None,
    };
    // A bad upstream stops the server before it listens.
    let upstreams = Upstreams::new(&opts.upstreams, &opts.model_id, shared.clone())
        .map_err(|e| Error::InvalidArgument(format!("the config's upstreams: {e}")))?;
    let addr = format!("{}:{}", opts.host, opts.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| Error::InvalidArgument(format!("cannot listen on {addr}: {e}")))?;
    let local = listener.local_addr()?;
    // The model file's sha256 names it in what is kept on disk or shared (hashed once, when
    // needed).
    let needs_sha = opts.shared.is_some()
        || opts
            .response_cache
            .as_ref()
            .is_some_and(|r| r.dir.is_some())
        || opts.prefix_cache.as_ref().is_some_and(|p| p.dir.is_some());
    let sha = if needs_sha {
        crate::catalog::sha256_file(&opts.path)?
    } else {
        opts.path.display().to_string()
    };
    let prefixes = match &opts.prefix_cache {
        Some(pc) => Some(Arc::new(
            prefixes::PrefixStore::open(pc.clone(), sha.clone()).map_err(|e| {
                Error::InvalidArgument(format!(
                    "the prefix cache {} cannot be used: {e}",
                    pc.dir
                        .as_deref()
                        .unwrap_or(std::path::Path::new(""))
                        .display()
                ))
            })?,
        )),
        None => None,
    };
    let responses = match &opts.response_cache {
        Some(rc) => {
            let c = responses::ResponseCache::open(rc.clone(), sha.clone()).map_err(|e| {
                Error::InvalidArgument(format!(
                    "the response cache {} cannot be used: {e}",
                    rc.dir
                        .as_deref()
                        .unwrap_or(std::path::Path::new(""))
                        .display()
                ))
            })?;
            Some(Arc::new(c))
        }
        None => None,
    };
    let (pool, ready) = Pool::start(
        opts.path.clone(),
        opts.load.clone(),
        opts.slots.max(1),
        prefixes,
        opts.prepare_constraints,
    );
    let state = Arc::new(AppState {
        admission: Admission::new(opts.slots.max(1) + opts.queue),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        opts,
        loaded: OnceLock::new(),
        pool: Arc::clone(&pool),
        draining: AtomicBool::new(false),
        ids: AtomicU64::new(0),
        responses,
        upstreams,
        shared,
        metrics: Metrics::new()
            .map_err(|e| Error::Backend(format!("the metrics did not start: {e}")))?,
    });
    eprintln!(
        "kerze serve: listening on http://{local} (loading {})",
        state.opts.model_id
    );
    for u in state.upstreams.all() {
        let when: Vec<&str> = u.cfg.when.iter().map(|r| r.as_str()).collect();
        eprintln!(
            "kerze serve: upstream {} ({:?}, {}) takes: {}{}",
            u.name(),
            u.cfg.kind,
            u.cfg.url.as_deref().unwrap_or(""),
            when.join(", "),
            if u.cfg.serves.is_empty() {
                String::new()
            } else {
                format!("; serves {}", u.cfg.serves.join(", "))
            }
        );
    }

    // The load runs on slot 0's thread; a failed load ends the server.
    let (fail_tx, mut fail_rx) = tokio::sync::mpsc::channel::<Error>(1);
    {
        let state = Arc::clone(&state);
        std::thread::spawn(move || match ready.recv() {
            Ok(Ok(info)) => {
                eprintln!(
                    "kerze serve: ready: {} ({}, {}; {} slots, queue {}, n_ctx {})",
                    state.opts.model_id,
                    info.backend,
                    info.reason,
                    state.opts.slots.max(1),
                    state.opts.queue,
                    info.n_ctx
                );
                let _ = state.loaded.set(Loaded { info });
            }
            Ok(Err(e)) => {
                let _ = fail_tx.blocking_send(e);
            }
            Err(_) => {
                let _ =
                    fail_tx.blocking_send(Error::Backend("the slots stopped while loading".into()));
            }
        });
    }

    let app = router(Arc::clone(&state));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let failed = Arc::new(OnceLock::<Error>::new());
    {
        let (state, failed) = (Arc::clone(&state), Arc::clone(&failed));
        tokio::spawn(async move {
            tokio::select! {
                _ = terminated() => eprintln!("kerze serve: shutting down: finishing the requests in flight"),
                Some(e) = fail_rx.recv() => {
                    eprintln!("kerze serve: the model did not load: {e}");
                    let _ = failed.set(e);
                }
            }
            state.draining.store(true, Ordering::SeqCst);
            let _ = stop_tx.send(true);
        });
    }
    let mut stop = stop_rx.clone();
    let shutdown = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    let server = axum::serve(listener, app).with_graceful_shutdown(shutdown);
    // In-flight requests get their timeout to finish, then the process goes anyway.
    let grace = state.opts.timeout + Duration::from_secs(1);
    let mut stop = stop_rx;
    tokio::select! {
        r = server => r?,
        _ = async move {
            let _ = stop.wait_for(|s| *s).await;
            tokio::time::sleep(grace).await;
        } => eprintln!("kerze serve: requests still open after {} s: closing them", grace.as_secs()),
    }
    // Slots finish their job (their clients are gone now) and exit.
    tokio::task::spawn_blocking(move || pool.stop()).await.ok();
    if let Some(e) = Arc::try_unwrap(failed).ok().and_then(|f| f.into_inner()) {
        return Err(e);
    }
    eprintln!("kerze serve: stopped");
    Ok(())
}

/// SIGTERM or Ctrl-C.
async fn terminated() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
