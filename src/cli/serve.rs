//! `kerze serve`: the flags of the OpenAI-compatible server, turned into its options.

use super::load::{device, log, ModelArgs};
use crate::{catalog, LoadOptions, Result};

#[derive(clap::Args, Debug)]
pub(super) struct ServeArgs {
    /// A TOML file that sets any of these flags (`snake_case` keys; a flag given here wins) and
    /// declares the gateway's `[[upstream]]` tables (docs/gateway.md)
    #[arg(long, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on (0.0.0.0: every interface)
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port (0: any free one; the line `listening on http://…` names it)
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on /v1/* (also from $KERZE_API_KEY)
    #[arg(long, env = "KERZE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// An origin browser pages may call from (repeat for more; `*`: any)
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    cors_origin: Vec<String>,
    /// Requests that generate at the same time (one KV cache each; default: 2 to 4 by cores)
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    slots: Option<u16>,
    /// Requests that wait for a slot; the next one gets 429
    #[arg(long, default_value_t = 16)]
    queue: usize,
    /// Seconds a request may take from its arrival to its last token (504 after)
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
    /// The largest request body in bytes (413 past it)
    #[arg(long, default_value_t = 2 << 20)]
    max_body: usize,
    /// Seconds a request's body may take to arrive (408 after: a client that sends less than
    /// its content-length promises does not hold a connection)
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    body_timeout: u64,
    /// Keep answers to deterministic requests (temperature 0 or a seed) in this folder, across
    /// restarts (without it: in memory), and answer repeats from them with no forward pass
    /// (`"cache": false` in a request: not that one). A `redis://HOST:PORT[/DB]` URL: Redis or
    /// Valkey, shared with other gateways, with the upstreams' rate limits and budgets (this
    /// process's own memory while it is down)
    #[arg(long, value_name = "DIR|URL")]
    response_cache: Option<String>,
    /// Seconds a kept answer stays valid
    #[arg(long, default_value_t = 86_400, value_parser = clap::value_parser!(u64).range(1..))]
    response_cache_ttl: u64,
    /// Megabytes the kept answers may take (the least recently used go first; 0: keep none)
    #[arg(long, default_value_t = 64)]
    response_cache_mb: u64,
    /// Keep the KV snapshots of chats' shared prefixes (system prompt and earlier turns) in
    /// this folder, across restarts; without it they are kept in memory, shared by the slots
    #[arg(long, value_name = "DIR")]
    prefix_cache: Option<std::path::PathBuf>,
    /// Megabytes the kept prefixes may take (the least recently used go first; 0: keep none)
    #[arg(long, default_value_t = 256)]
    prefix_cache_mb: u64,
    /// Prefixes shorter than this many tokens are not kept
    #[arg(long, default_value_t = 32)]
    prefix_cache_min_tokens: usize,
    /// Build the constraint engine's token trie at start (~1 s and ~120 MB for Gemma 3), so
    /// that the first request with response_format, tools or choices does not wait for it
    #[arg(long)]
    prepare_constraints: bool,
}

fn is_redis(c: &str) -> bool {
    c.starts_with("redis://") || c.starts_with("valkey://")
}

pub(super) fn cmd_serve(a: &ServeArgs) -> Result<()> {
    let upstreams = match &a.config {
        Some(p) => super::config::upstreams(p).map_err(crate::Error::InvalidArgument)?,
        None => Vec::new(),
    };
    let path = catalog::resolve(&a.model.model, &mut |s| log(s))?;
    // The catalog id when the model was named by one, else the file's name.
    let model_id = if catalog::find(&a.model.model)?.is_some() {
        a.model.model.clone()
    } else {
        path.file_name()
            .map(|f| f.to_string_lossy().trim_end_matches(".gguf").to_string())
            .unwrap_or_else(|| a.model.model.clone())
    };
    crate::server::run(crate::server::ServeOptions {
        path,
        model_id,
        load: LoadOptions {
            no_gpu: None,
            device: device(a.model.device),
            n_ctx: a.model.n_ctx,
            exact: a.model.exact,
        },
        host: a.host.clone(),
        port: a.port,
        api_key: a.api_key.clone().filter(|k| !k.is_empty()),
        cors_origins: a.cors_origin.clone(),
        slots: a
            .slots
            .map_or_else(crate::server::default_slots, usize::from),
        queue: a.queue,
        timeout: std::time::Duration::from_secs(a.timeout),
        max_body: a.max_body,
        body_timeout: std::time::Duration::from_secs(a.body_timeout),
        response_cache: (a.response_cache_mb > 0).then(|| {
            crate::server::responses::ResponseCacheOptions {
                dir: a
                    .response_cache
                    .as_ref()
                    .filter(|c| !is_redis(c))
                    .map(std::path::PathBuf::from),
                ttl: std::time::Duration::from_secs(a.response_cache_ttl),
                max_bytes: a.response_cache_mb << 20,
            }
        }),
        prefix_cache: (a.prefix_cache_mb > 0).then(|| crate::server::prefixes::PrefixOptions {
            dir: a.prefix_cache.clone(),
            max_bytes: a.prefix_cache_mb << 20,
            min_tokens: a.prefix_cache_min_tokens,
        }),
        prepare_constraints: a.prepare_constraints,
        shared: a
            .response_cache
            .clone()
            .filter(|c| is_redis(c) && a.response_cache_mb > 0),
        upstreams,
    })
}
