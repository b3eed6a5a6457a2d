//! The response cache of `kerze serve`: answers to deterministic requests (temperature 0, or
//! a fixed seed) kept in memory (the default) or as files, one per request key — the sha256
//! of the model file's sha256 (in memory: its path, the process being the model's),
//! the endpoint, backend and context, and the canonical request (its JSON with sorted keys, less `stream`,
//! `stream_options`, `user`, `model`, `cache`, and `seed` when greedy). A hit answers with no
//! slot and no forward pass, streamed like a fresh answer, its usage saying every prompt token
//! was cached. Entries live `ttl`; past `max_bytes` the least recently used go first; a file
//! that does not parse is removed, never used.

use crate::generate::{FinishReason, Usage};
use crate::openai::GenerateRequest;
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

/// Where and how long answers are kept.
#[derive(Clone, Debug)]
pub struct ResponseCacheOptions {
    /// A folder (kept across restarts), or None: in memory.
    pub dir: Option<PathBuf>,
    pub ttl: Duration,
    pub max_bytes: u64,
}

/// A kept answer.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Entry {
    /// The format's version: another one is not read.
    pub v: u32,
    pub pieces: Vec<String>,
    pub finish: FinishReason,
    pub usage: Usage,
    /// Seconds since the epoch when it was stored, with their fraction (an entry of an older
    /// build holds whole seconds, which read the same way).
    pub stored: f64,
    /// An upstream's answer as it came: the whole answer's JSON, or its stream's chunks
    /// (`pieces` is empty then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<Vec<serde_json::Value>>,
}

const VERSION: u32 = 1;

impl Entry {
    /// A local answer: its pieces, end and usage.
    pub fn local(pieces: Vec<String>, finish: FinishReason, usage: Usage) -> Self {
        Entry {
            v: VERSION,
            pieces,
            finish,
            usage,
            stored: now_s(),
            raw: None,
        }
    }

    /// An upstream's answer as it came (the whole JSON, or the stream's chunks).
    pub fn upstream(raw: Vec<serde_json::Value>) -> Self {
        Entry {
            raw: Some(raw),
            ..Entry::local(Vec::new(), FinishReason::Stop, Usage::default())
        }
    }

    /// What a file (or a shared store) holds.
    pub fn bytes(&self) -> Option<Vec<u8>> {
        serde_json::to_vec(self).ok()
    }
}

pub struct ResponseCache {
    opts: ResponseCacheOptions,
    /// The model file's sha256, hex (in memory: what names the model in this process).
    model: String,
    /// The answers kept in memory, where there is no folder.
    memory: Option<std::sync::Mutex<Memory>>,
}

/// Answers in memory: each entry's JSON (what a file would hold) and when it was last used,
/// and their bytes in all.
#[derive(Default)]
struct Memory {
    entries: std::collections::HashMap<String, (Vec<u8>, u64)>,
    bytes: u64,
    clock: u64,
}

impl Memory {
    fn remove(&mut self, key: &str) {
        if let Some((b, _)) = self.entries.remove(key) {
            self.bytes -= b.len() as u64;
        }
    }
}

/// The file of the entry `key` in the folder `dir`.
fn entry_path(dir: &std::path::Path, key: &str) -> PathBuf {
    dir.join(format!("{key}.json"))
}

/// JSON with every object's keys sorted.
pub fn canonical(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .iter()
                .map(|k| format!("{}:{}", Value::String((*k).clone()), canonical(&m[*k])))
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(canonical).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}

/// Seconds since the epoch, with their fraction: in whole seconds an entry stored late in a
/// second would expire up to a second early (with `--response-cache-ttl 1`, at once).
fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl ResponseCache {
    /// The cache in `opts.dir` (made if missing), or in memory, for the model whose sha256
    /// is `model`.
    pub fn open(opts: ResponseCacheOptions, model: String) -> std::io::Result<Self> {
        let memory = match &opts.dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                None
            }
            None => Some(std::sync::Mutex::new(Memory::default())),
        };
        Ok(Self {
            opts,
            model,
            memory,
        })
    }

    fn memory(&self) -> Option<std::sync::MutexGuard<'_, Memory>> {
        self.memory
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// How long an entry stays valid.
    pub fn ttl(&self) -> Duration {
        self.opts.ttl
    }

    /// A kept entry's JSON, if it parses, is this version's and is still live.
    pub fn live(&self, bytes: &[u8]) -> Option<Entry> {
        serde_json::from_slice::<Entry>(bytes)
            .ok()
            .filter(|e| e.v == VERSION && e.stored + self.opts.ttl.as_secs_f64() > now_s())
    }

    /// The key of a request with body `body` in `scope` (the endpoint, the backend and the
    /// context: what else decides the answer), or None when it is not deterministic or asks
    /// for no caching (`"cache": false`).
    pub fn key(
        &self,
        scope: &str,
        body: &serde_json::Value,
        g: &GenerateRequest,
    ) -> Option<String> {
        self.key_of(scope, body, g.temperature == Some(0.0), g.seed.is_some())
    }

    /// The key of a request read as JSON only (one for an upstream, which kerze's own parser
    /// need not accept): deterministic when `temperature` is 0 or it gives a `seed`.
    pub fn key_json(&self, scope: &str, body: &serde_json::Value) -> Option<String> {
        let greedy = body.get("temperature").and_then(|t| t.as_f64()) == Some(0.0);
        let seeded = body.get("seed").is_some_and(|s| !s.is_null());
        self.key_of(scope, body, greedy, seeded)
    }

    fn key_of(
        &self,
        scope: &str,
        body: &serde_json::Value,
        greedy: bool,
        seeded: bool,
    ) -> Option<String> {
        if !(greedy || seeded) || body.get("cache") == Some(&serde_json::Value::Bool(false)) {
            return None;
        }
        let mut b = body.clone();
        if let Some(m) = b.as_object_mut() {
            for k in ["stream", "stream_options", "user", "model", "cache"] {
                m.remove(k);
            }
            if greedy {
                m.remove("seed");
            }
        }
        let mut h = Sha256::new();
        h.update(format!("v{VERSION}|{}|{scope}|", self.model));
        h.update(canonical(&b));
        Some(format!("{:x}", h.finalize()))
    }

    /// The live entry for `key`; an expired or unreadable one is removed.
    pub fn get(&self, key: &str) -> Option<Entry> {
        if let Some(mut m) = self.memory() {
            let found = m.entries.get(key).map(|(b, _)| self.live(b));
            return match found? {
                Some(e) => {
                    m.clock += 1;
                    let now = m.clock;
                    if let Some(slot) = m.entries.get_mut(key) {
                        slot.1 = now;
                    }
                    Some(e)
                }
                None => {
                    m.remove(key);
                    None
                }
            };
        }
        let p = entry_path(self.opts.dir.as_deref()?, key);
        let bytes = std::fs::read(&p).ok()?;
        match self.live(&bytes) {
            Some(e) => {
                // Recently used: the size cap removes the files least recently touched first.
                if let Ok(f) = std::fs::File::options().append(true).open(&p) {
                    let _ = f.set_modified(SystemTime::now());
                }
                Some(e)
            }
            _ => {
                let _ = std::fs::remove_file(&p);
                None
            }
        }
    }

    /// Keep a local answer.
    pub fn put(&self, key: &str, pieces: Vec<String>, finish: FinishReason, usage: Usage) {
        self.store(key, &Entry::local(pieces, finish, usage))
    }

    /// Keep `e` under `key` (written whole, then renamed: a reader never sees half a file),
    /// then remove the least recently used past the size cap.
    pub fn store(&self, key: &str, e: &Entry) {
        let Some(bytes) = e.bytes() else {
            return;
        };
        if bytes.len() as u64 > self.opts.max_bytes {
            return;
        }
        if let Some(mut m) = self.memory() {
            m.remove(key);
            m.clock += 1;
            let now = m.clock;
            m.bytes += bytes.len() as u64;
            m.entries.insert(key.to_string(), (bytes, now));
            // The least recently used first, until the rest fit.
            while m.bytes > self.opts.max_bytes {
                let Some(oldest) = m
                    .entries
                    .iter()
                    .min_by_key(|(_, v)| v.1)
                    .map(|(k, _)| k.clone())
                else {
                    break;
                };
                m.remove(&oldest);
            }
            return;
        }
        let Some(dir) = self.opts.dir.as_deref() else {
            return;
        };
        let tmp = dir.join(format!(".{key}.{}.tmp", std::process::id()));
        if std::fs::write(&tmp, &bytes).is_ok()
            && std::fs::rename(&tmp, entry_path(dir, key)).is_err()
        {
            let _ = std::fs::remove_file(&tmp);
        }
        self.evict(dir);
    }

    fn evict(&self, dir: &std::path::Path) {
        let Ok(dir) = std::fs::read_dir(dir) else {
            return;
        };
        let mut files: Vec<(SystemTime, u64, PathBuf)> = dir
            .flatten()
            .filter(|d| d.file_name().to_string_lossy().ends_with(".json"))
            .filter_map(|d| {
                let m = d.metadata().ok()?;
                Some((m.modified().ok()?, m.len(), d.path()))
            })
            .collect();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        files.sort();
        for (_, len, p) in files {
            if total <= self.opts.max_bytes {
                break;
            }
            if std::fs::remove_file(&p).is_ok() {
                total -= len;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(dir: &std::path::Path, max_bytes: u64, ttl: u64) -> ResponseCache {
        ResponseCache::open(
            ResponseCacheOptions {
                dir: Some(dir.to_path_buf()),
                ttl: Duration::from_secs(ttl),
                max_bytes,
            },
            "ab".repeat(32),
        )
        .unwrap()
    }

    fn req(v: &serde_json::Value) -> GenerateRequest {
        serde_json::from_value(v.clone()).unwrap_or_default()
    }

    #[test]
    fn keys_are_canonical_and_only_for_deterministic_requests() {
        let dir = std::env::temp_dir().join(format!("kerze-rc-keys-{}", std::process::id()));
        let c = cache(&dir, 1 << 20, 60);
        let a = serde_json::json!({"messages": [{"role": "user", "content": "hi"}], "temperature": 0, "max_tokens": 4, "stream": true, "seed": 3});
        let b = serde_json::json!({"max_tokens": 4, "temperature": 0, "messages": [{"content": "hi", "role": "user"}], "seed": 9});
        let ka = c.key(
            "chat",
            &a,
            &GenerateRequest {
                temperature: Some(0.0),
                seed: Some(3),
                ..Default::default()
            },
        );
        let kb = c.key(
            "chat",
            &b,
            &GenerateRequest {
                temperature: Some(0.0),
                seed: Some(9),
                ..Default::default()
            },
        );
        assert!(ka.is_some());
        assert_eq!(
            ka, kb,
            "key order, stream and a greedy request's seed do not matter"
        );
        assert_ne!(
            ka,
            c.key(
                "completions",
                &a,
                &GenerateRequest {
                    temperature: Some(0.0),
                    ..Default::default()
                }
            )
        );
        let sampled = serde_json::json!({"messages": [], "temperature": 0.7});
        assert_eq!(
            c.key("chat", &sampled, &req(&sampled)),
            None,
            "sampled without a seed"
        );
        let seeded = serde_json::json!({"messages": [], "temperature": 0.7, "seed": 1});
        let other = serde_json::json!({"messages": [], "temperature": 0.7, "seed": 2});
        assert_ne!(
            c.key(
                "chat",
                &seeded,
                &GenerateRequest {
                    temperature: Some(0.7),
                    seed: Some(1),
                    ..Default::default()
                }
            ),
            c.key(
                "chat",
                &other,
                &GenerateRequest {
                    temperature: Some(0.7),
                    seed: Some(2),
                    ..Default::default()
                }
            ),
            "a sampled request's seed matters"
        );
        let off = serde_json::json!({"messages": [], "temperature": 0, "cache": false});
        assert_eq!(
            c.key(
                "chat",
                &off,
                &GenerateRequest {
                    temperature: Some(0.0),
                    ..Default::default()
                }
            ),
            None
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn entries_expire_are_capped_and_corrupt_files_are_dropped() {
        let dir = std::env::temp_dir().join(format!("kerze-rc-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let c = cache(&dir, 1 << 20, 60);
        c.put(
            "k1",
            vec!["a".into(), "b".into()],
            FinishReason::Length,
            Usage::default(),
        );
        let e = c.get("k1").unwrap();
        assert_eq!(
            (e.pieces.concat(), e.finish),
            ("ab".to_string(), FinishReason::Length)
        );
        std::fs::write(entry_path(&dir, "k2"), b"{not json").unwrap();
        assert!(
            c.get("k2").is_none() && !entry_path(&dir, "k2").exists(),
            "a corrupt file is removed"
        );
        let gone = cache(&dir, 1 << 20, 0);
        assert!(gone.get("k1").is_none(), "past its TTL");
        let one = std::fs::metadata(entry_path(&dir, "k1"))
            .map(|m| m.len())
            .unwrap_or(0);
        assert_eq!(one, 0, "an expired entry is removed");
        c.put(
            "a",
            vec!["x".repeat(60)],
            FinishReason::Stop,
            Usage::default(),
        );
        let len = std::fs::metadata(entry_path(&dir, "a")).unwrap().len();
        let small = cache(&dir, len * 3 / 2, 60);
        std::thread::sleep(Duration::from_millis(20));
        small.put(
            "b",
            vec!["y".repeat(60)],
            FinishReason::Stop,
            Usage::default(),
        );
        assert!(
            small.get("a").is_none() && small.get("b").is_some(),
            "the cap removes the older"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// In memory (the default): a kept answer comes back, a short TTL expires it, and past the
    /// cap the least recently used goes first (one read makes an entry recent).
    #[test]
    fn in_memory_entries_expire_and_the_least_recently_used_go_first() {
        let mem = |max_bytes, ttl| {
            ResponseCache::open(
                ResponseCacheOptions {
                    dir: None,
                    ttl: Duration::from_secs(ttl),
                    max_bytes,
                },
                "model.gguf".into(),
            )
            .unwrap()
        };
        let put = |c: &ResponseCache, k: &str, text: &str| {
            c.put(k, vec![text.into()], FinishReason::Stop, Usage::default())
        };
        let c = mem(1 << 20, 60);
        assert!(c.memory().is_some());
        put(&c, "k1", "hello");
        assert_eq!(c.get("k1").unwrap().pieces, vec!["hello".to_string()]);
        assert!(c.get("k2").is_none());
        let gone = mem(1 << 20, 0);
        put(&gone, "k1", "hello");
        assert!(gone.get("k1").is_none(), "past its TTL");
        assert_eq!(
            gone.memory().unwrap().bytes,
            0,
            "an expired entry is removed"
        );
        let one = serde_json::to_vec(&Entry {
            v: VERSION,
            pieces: vec!["x".repeat(60)],
            finish: FinishReason::Stop,
            usage: Usage::default(),
            stored: now_s(),
            raw: None,
        })
        .unwrap()
        .len() as u64;
        let small = mem(one * 5 / 2, 60);
        put(&small, "a", &"x".repeat(60));
        put(&small, "b", &"y".repeat(60));
        assert!(small.get("a").is_some(), "a read makes `a` the more recent");
        put(&small, "c", &"z".repeat(60));
        assert!(
            small.get("a").is_some() && small.get("b").is_none() && small.get("c").is_some(),
            "the cap removes the least recently used"
        );
        assert!(small.memory().unwrap().bytes <= one * 5 / 2);
    }
}
