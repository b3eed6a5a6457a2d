//! The prompt-prefix store of `kerze serve`: the KV snapshots (see [`crate::prefix`]) of the
//! prefixes requests share — a chat's system prompt and the turns before its last question —
//! shared by every slot, and with a directory kept across restarts. A slot whose own cache does
//! not hold a request's prefix restores the longest kept one the prompt starts with (a chat's,
//! or a plain prompt's), and saves the chat's prefix when it computed it. Past `max_bytes` the
//! least recently used go first; an entry that does not restore is removed, never used again.

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::prefix::{read_header, ENGINE_VERSION};
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Where and how much.
#[derive(Clone, Debug)]
pub struct PrefixOptions {
    /// Keep the snapshots as files here (None: in memory, for this process).
    pub dir: Option<PathBuf>,
    pub max_bytes: u64,
    /// Prefixes shorter than this are not kept.
    pub min_tokens: usize,
}

/// Where an entry's bytes are.
enum Held {
    Memory(Arc<Vec<u8>>),
    File(PathBuf),
}

struct Entry {
    ids: Vec<u32>,
    backend: String,
    size: u64,
    used: u64,
    held: Held,
}

pub struct PrefixStore {
    opts: PrefixOptions,
    /// The model's identity in the snapshots (its sha256 when kept on disk).
    model: String,
    entries: Mutex<Vec<Entry>>,
    clock: AtomicU64,
}

/// What [`PrefixStore::before`] did, for [`PrefixStore::after`].
pub struct Plan {
    /// Save the cache once these many prompt ids are in it.
    pub save_at: Option<usize>,
}

impl PrefixStore {
    /// Open the store; with a directory, index the snapshots there of this model and engine.
    pub fn open(opts: PrefixOptions, model: String) -> Result<Self> {
        let mut entries = Vec::new();
        if let Some(dir) = &opts.dir {
            std::fs::create_dir_all(dir)?;
            for f in std::fs::read_dir(dir)? {
                let path = f?.path();
                if path.extension().is_none_or(|x| x != "kv") {
                    continue;
                }
                let size = std::fs::metadata(&path).map_or(0, |m| m.len());
                let made = std::fs::File::open(&path)
                    .map_err(Error::from)
                    .and_then(|f| read_header(&mut std::io::BufReader::new(f)));
                match made {
                    Ok(m) if m.model == model && m.engine == ENGINE_VERSION => {
                        entries.push(Entry {
                            ids: m.ids,
                            backend: m.backend,
                            size,
                            used: 0,
                            held: Held::File(path),
                        })
                    }
                    // Another model's or engine's: not ours to use or remove.
                    Ok(_) => {}
                    Err(e) => {
                        eprintln!(
                            "kerze serve: {} is not a prompt prefix snapshot ({e}): removed",
                            path.display()
                        );
                        let _ = std::fs::remove_file(&path);
                    }
                }
            }
        }
        Ok(Self {
            opts,
            model,
            entries: Mutex::new(entries),
            clock: AtomicU64::new(1),
        })
    }

    /// The model's name in the snapshots.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// Entries and bytes kept.
    pub fn size(&self) -> (usize, u64) {
        self.entries
            .lock()
            .map(|e| (e.len(), e.iter().map(|x| x.size).sum()))
            .unwrap_or((0, 0))
    }

    /// Before a generation of `ids` whose first `shared` ids repeat across requests: put the
    /// longest kept prefix `ids` starts with into `engine` when its cache holds less of
    /// `ids`, and say whether to save the shared prefix once computed.
    pub fn before(&self, engine: &mut Engine, ids: &[u32], shared: usize) -> Plan {
        let mut have = engine.cached_common(ids);
        let backend = engine.info().backend;
        let found = self.entries.lock().ok().and_then(|mut es| {
            let best = es
                .iter_mut()
                .filter(|e| {
                    e.backend == backend
                        && e.ids.len() > have
                        && e.ids.len() < ids.len()
                        && ids.starts_with(&e.ids)
                })
                .max_by_key(|e| e.ids.len())?;
            best.used = self.clock.fetch_add(1, Ordering::Relaxed);
            let held = match &best.held {
                Held::Memory(b) => Held::Memory(Arc::clone(b)),
                Held::File(p) => Held::File(p.clone()),
            };
            Some((best.ids.len(), held))
        });
        if let Some((n, held)) = found {
            // The file is read with the index unlocked: other slots go on meanwhile.
            let bytes = match held {
                Held::Memory(b) => Ok(b),
                Held::File(p) => std::fs::read(p).map(Arc::new).map_err(Error::from),
            };
            match bytes.and_then(|b| engine.restore_prefix(&b, &self.model, ids)) {
                Ok(got) => have = got,
                Err(e) => {
                    eprintln!(
                        "kerze serve: a saved prompt prefix was dropped and is computed again: {e}"
                    );
                    self.remove(backend, &ids[..n]);
                }
            }
        }
        let keep = shared >= self.opts.min_tokens.max(1) && shared < ids.len() && have < shared;
        Plan {
            save_at: keep.then_some(shared),
        }
    }

    /// Keep the snapshot the generation made (`bytes`, of `ids`); then the least recently
    /// used go past `max_bytes`.
    pub fn after(&self, backend: &str, ids: &[u32], bytes: Vec<u8>) {
        let size = bytes.len() as u64;
        if size > self.opts.max_bytes {
            return;
        }
        let held = match &self.opts.dir {
            None => Held::Memory(Arc::new(bytes)),
            Some(dir) => {
                let mut h = Sha256::new();
                h.update(self.model.as_bytes());
                h.update(backend.as_bytes());
                h.update(ENGINE_VERSION.as_bytes());
                for id in ids {
                    h.update(id.to_le_bytes());
                }
                let name: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
                let path = dir.join(format!("{name}.kv"));
                let tmp = dir.join(format!("{name}.kv.tmp"));
                let written =
                    std::fs::write(&tmp, &bytes).and_then(|()| std::fs::rename(&tmp, &path));
                if let Err(e) = written {
                    eprintln!(
                        "kerze serve: the prompt prefix was not saved to {}: {e}",
                        path.display()
                    );
                    let _ = std::fs::remove_file(&tmp);
                    return;
                }
                Held::File(path)
            }
        };
        let Ok(mut es) = self.entries.lock() else {
            return;
        };
        es.retain(|e| !(e.backend == backend && e.ids == ids));
        es.push(Entry {
            ids: ids.to_vec(),
            backend: backend.to_string(),
            size,
            used: self.clock.fetch_add(1, Ordering::Relaxed),
            held,
        });
        es.sort_by_key(|e| std::cmp::Reverse(e.used));
        let mut total = 0;
        es.retain(|e| {
            total += e.size;
            let keep = total <= self.opts.max_bytes;
            if !keep {
                if let Held::File(p) = &e.held {
                    let _ = std::fs::remove_file(p);
                }
            }
            keep
        });
    }

    fn remove(&self, backend: &str, ids: &[u32]) {
        if let Ok(mut es) = self.entries.lock() {
            es.retain(|e| {
                let gone = e.backend == backend && e.ids == ids;
                if gone {
                    if let Held::File(p) = &e.held {
                        let _ = std::fs::remove_file(p);
                    }
                }
                !gone
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{tiny_decoder, Quants};
    use crate::{Family, GenerateOptions, GgmlType};

    fn engine(bytes: &[u8]) -> Engine {
        Engine::load(&bytes, &Default::default(), &mut |_, _| {})
            .unwrap()
            .0
    }

    /// Generate `ids` after the store's `before`, saving through `after`: the prefill count.
    fn ask(store: &PrefixStore, e: &mut Engine, ids: &[u32], shared: usize) -> usize {
        let plan = store.before(e, ids, shared);
        let opts = GenerateOptions {
            save_prefix_at: plan.save_at,
            ..GenerateOptions::greedy_tokens(2)
        };
        let mut g = e.begin(ids.to_vec(), &opts).unwrap();
        while !pollster::block_on(e.prefill_step(&mut g)).unwrap() {}
        if let Some(b) = e.take_prefix(&mut g, &store.model) {
            store.after(e.info().backend, &ids[..plan.save_at.unwrap()], b);
        }
        g.usage.prefill_tokens
    }

    #[test]
    fn slots_and_restarts_share_kept_prefixes_and_damaged_files_go() {
        let bytes = tiny_decoder(Family::Llama, Quants::all(GgmlType::Q8_0), 3).unwrap();
        let dir = std::env::temp_dir().join(format!("kerze-prefixes-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let opts = PrefixOptions {
            dir: Some(dir.clone()),
            max_bytes: 64 << 20,
            min_tokens: 4,
        };
        let store = PrefixStore::open(opts.clone(), "m".into()).unwrap();
        let mut slot0 = engine(&bytes);
        let ids: Vec<u32> = (3..40).collect();
        let other: Vec<u32> = (3..33).chain(50..60).collect();
        assert_eq!(ask(&store, &mut slot0, &ids, 30), ids.len());
        assert_eq!(store.size().0, 1);
        // Another slot (its own cache is empty) restores it; so does a restarted server.
        let mut slot1 = engine(&bytes);
        assert_eq!(ask(&store, &mut slot1, &other, 0), other.len() - 30);
        let again = PrefixStore::open(opts.clone(), "m".into()).unwrap();
        assert_eq!(again.size().0, 1);
        let mut fresh = engine(&bytes);
        assert_eq!(ask(&again, &mut fresh, &ids, 30), ids.len() - 30);
        // Another model's server ignores the file; a damaged file is dropped and recomputed.
        assert_eq!(
            PrefixStore::open(opts.clone(), "n".into())
                .unwrap()
                .size()
                .0,
            0
        );
        let file = std::fs::read_dir(&dir)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let mut b = std::fs::read(&file).unwrap();
        let at = b.len() - 20;
        b[at] ^= 1;
        std::fs::write(&file, b).unwrap();
        let broken = PrefixStore::open(opts.clone(), "m".into()).unwrap();
        let mut fresh = engine(&bytes);
        assert_eq!(ask(&broken, &mut fresh, &ids, 30), ids.len());
        // Saved again, whole.
        let mut fresh = engine(&bytes);
        assert_eq!(ask(&broken, &mut fresh, &ids, 30), ids.len() - 30);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
