//! What several `kerze serve` processes behind one load balancer share through Redis or
//! Valkey (`--response-cache redis://HOST:PORT[/DB]`): the response cache, and each
//! upstream's rate-limit and budget counters.
//!
//! Redis is a help, never a dependency: a command that fails or takes longer than
//! [`COMMAND_TIMEOUT`] marks it down for [`DOWN_FOR`], with one warning, and the callers use
//! their own local state meanwhile (the in-memory cache, the process's own counters); no
//! request fails because of it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long one command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_millis(500);
/// How long Redis is left alone after it failed.
const DOWN_FOR: Duration = Duration::from_secs(5);

pub struct Shared {
    client: redis::Client,
    /// The URL without its password, for messages.
    shown: String,
    conn: tokio::sync::Mutex<Option<redis::aio::MultiplexedConnection>>,
    /// Down until then; whether that was told.
    down: Mutex<Option<Instant>>,
}

impl Shared {
    /// The store at `url` (`redis://`); nothing connects until the first command.
    pub fn open(url: &str) -> Result<Self, String> {
        let client = redis::Client::open(url).map_err(|e| format!("{url}: {e}"))?;
        let shown = match url.split_once('@') {
            Some((_, host)) => format!("redis://…@{host}"),
            None => url.to_string(),
        };
        Ok(Shared {
            client,
            shown,
            conn: tokio::sync::Mutex::new(None),
            down: Mutex::new(None),
        })
    }

    pub fn shown(&self) -> &str {
        &self.shown
    }

    fn is_down(&self) -> bool {
        let d = self.down.lock().unwrap_or_else(|e| e.into_inner());
        d.is_some_and(|t| Instant::now() < t)
    }

    fn went_down(&self, why: &str) {
        let mut d = self.down.lock().unwrap_or_else(|e| e.into_inner());
        let was_up = d.is_none_or(|t| Instant::now() >= t);
        *d = Some(Instant::now() + DOWN_FOR);
        if was_up {
            eprintln!(
                "kerze serve: warning: {} is not answering ({why}); using this process's own cache and counters meanwhile",
                self.shown
            );
        }
    }

    /// Run one command; None (and Redis marked down) when it fails.
    async fn run<T: redis::FromRedisValue>(&self, cmd: redis::Cmd) -> Option<T> {
        if self.is_down() {
            return None;
        }
        let r = tokio::time::timeout(COMMAND_TIMEOUT, async {
            let mut guard = self.conn.lock().await;
            if guard.is_none() {
                *guard = Some(
                    self.client
                        .get_multiplexed_async_connection()
                        .await
                        .map_err(|e| e.to_string())?,
                );
            }
            let mut conn = guard.as_ref().cloned().ok_or("no connection")?;
            drop(guard);
            cmd.query_async::<T>(&mut conn)
                .await
                .map_err(|e| e.to_string())
        })
        .await;
        match r {
            Ok(Ok(v)) => Some(v),
            Ok(Err(e)) => {
                *self.conn.lock().await = None;
                self.went_down(&e);
                None
            }
            Err(_) => {
                *self.conn.lock().await = None;
                self.went_down("a command took longer than 500 ms");
                None
            }
        }
    }

    /// The value at `key`: Some(None) when there is none, None when Redis is down.
    pub async fn get(&self, key: &str) -> Option<Option<Vec<u8>>> {
        let mut c = redis::cmd("GET");
        c.arg(key);
        self.run(c).await
    }

    /// Set `key` for `ttl`; false when Redis is down.
    pub async fn set(&self, key: &str, value: &[u8], ttl: Duration) -> bool {
        let mut c = redis::cmd("SET");
        c.arg(key)
            .arg(value)
            .arg("PX")
            .arg(ttl.as_millis().max(1) as u64);
        self.run::<()>(c).await.is_some()
    }

    /// Add `by` to the counter `key` (made with expiry `ttl` when new): its new value, or None
    /// when Redis is down.
    pub async fn add(&self, key: &str, by: u64, ttl: Duration) -> Option<u64> {
        let mut c = redis::cmd("EVAL");
        // One round trip: INCRBY, then the expiry where the key is new (PEXPIRE … NX needs
        // Redis 7; this works on every version).
        c.arg("local v = redis.call('INCRBY', KEYS[1], ARGV[1]); if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end; return v")
            .arg(1)
            .arg(key)
            .arg(by)
            .arg(ttl.as_millis() as u64);
        self.run::<i64>(c).await.map(|v| v.max(0) as u64)
    }

    /// The counter `key` (0 when there is none), or None when Redis is down.
    pub async fn count(&self, key: &str) -> Option<u64> {
        self.get(key).await.map(|v| {
            v.and_then(|b| String::from_utf8(b).ok())
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(0)
        })
    }
}
