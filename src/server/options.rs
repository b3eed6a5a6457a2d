//! How to serve: the options `kerze serve` gives, and the default number of slots.

use super::upstream::UpstreamConfig;
use super::{prefixes, responses};
use crate::engine::LoadOptions;
use std::path::PathBuf;
use std::time::Duration;

/// How to serve.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The model file.
    pub path: PathBuf,
    /// The name `/v1/models` lists and requests may give (the catalog id or the file name
    /// without `.gguf`).
    pub model_id: String,
    pub load: LoadOptions,
    pub host: String,
    pub port: u16,
    pub api_key: Option<String>,
    /// Origins a browser page may call from (`*`: any); none: no CORS headers.
    pub cors_origins: Vec<String>,
    pub slots: usize,
    pub queue: usize,
    /// Per request, from its arrival to its last token (queueing counts).
    pub timeout: Duration,
    /// The largest request body.
    pub max_body: usize,
    /// How long a request's body may take to arrive (408 after).
    pub body_timeout: Duration,
    /// Keep answers to deterministic requests here (None: no response cache).
    pub response_cache: Option<responses::ResponseCacheOptions>,
    /// Redis or Valkey (`redis://…`) that several gateways share: the response cache (this
    /// process's own in memory when it is down) and the upstreams' counters.
    pub shared: Option<String>,
    /// Keep the KV of chats' shared prefixes (None: only in each slot's own cache).
    pub prefix_cache: Option<prefixes::PrefixOptions>,
    /// Build the constraint engine's token trie before the server is ready.
    pub prepare_constraints: bool,
    /// Where requests go that the local model should not or cannot answer.
    pub upstreams: Vec<UpstreamConfig>,
}

/// Slots by default: 2 when the machine has 2 cores or more (a burst interleaves instead of
/// waiting), up to 4.
pub fn default_slots() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / 2).clamp(2, 4).min(cores.max(1))
}
