//! Prompt-prefix snapshots: the keys and values of a fixed system prompt or few-shot prefix,
//! saved once it is computed and put back into a session's cache instead of computing it again
//! (in another page visit, a restarted server, another server slot).
//!
//! A snapshot is exact: the f32 keys and values as this backend computed them, so a request
//! after a restored prefix gives bit for bit what it gives after computing it. It is used only
//! by the same engine version, backend and model (a different backend's kernels round
//! differently); anything else, a truncated or altered file, is a [`Error::Snapshot`] and the
//! caller computes the prefix.
//!
//! Layout: `KZKV`, the format (u32 LE), the header's length (u32 LE) and the header (JSON:
//! engine, backend, model, ids, each layer's slots and width), every layer's keys then values
//! (f32 LE), and a 64-bit digest of everything before it.

use crate::backend::KvRows;
use crate::error::{Error, Result};

const MAGIC: &[u8; 4] = b"KZKV";
const FORMAT: u32 = 1;
/// The engine that wrote a snapshot: another version may compute other values.
pub const ENGINE_VERSION: &str = env!("CARGO_PKG_VERSION");
/// A header is ids and a few numbers per layer: more is not a snapshot.
const HEADER_MAX: usize = 4 << 20;

/// What a snapshot must have been made by to be used here.
#[derive(Clone, Copy, Debug)]
pub struct Identity<'a> {
    /// The model file's sha256 (or another name the caller keeps stable for it).
    pub model: &'a str,
    /// `EngineInfo::backend`.
    pub backend: &'a str,
}

/// The cache of a session after exactly `ids`.
#[derive(Clone, Debug, PartialEq)]
pub struct Prefix {
    pub ids: Vec<u32>,
    pub layers: Vec<KvRows>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Header {
    engine: String,
    backend: String,
    model: String,
    ids: Vec<u32>,
    /// `[n_slots, width, used]` per layer.
    layers: Vec<[usize; 3]>,
}

/// A fast 64-bit digest (words mixed one by one): catches truncation and altered bytes, not
/// an adversary (a page's own storage is not one).
fn digest(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ bytes.len() as u64;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
        h = (h ^ w).wrapping_mul(0x0100_0000_01b3);
        h ^= h >> 29;
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn bad(why: impl Into<String>) -> Error {
    Error::Snapshot(why.into())
}

/// Who made a snapshot and for which ids: its header, read without its keys and values.
#[derive(Clone, Debug, PartialEq)]
pub struct Made {
    pub engine: String,
    pub backend: String,
    pub model: String,
    pub ids: Vec<u32>,
}

/// The header of the snapshot `r` starts with (a file: only its first bytes are read).
pub fn read_header(r: &mut impl std::io::Read) -> Result<Made> {
    let mut head = [0u8; 12];
    r.read_exact(&mut head)
        .map_err(|e| bad(format!("its first bytes: {e}")))?;
    if &head[..4] != MAGIC {
        return Err(bad("not a kerze prefix snapshot"));
    }
    let format = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    if format != FORMAT {
        return Err(bad(format!(
            "format {format}, this engine reads format {FORMAT}"
        )));
    }
    let hlen = u32::from_le_bytes([head[8], head[9], head[10], head[11]]) as usize;
    if hlen > HEADER_MAX {
        return Err(bad(format!("a header of {hlen} bytes")));
    }
    let mut h = vec![0u8; hlen];
    r.read_exact(&mut h)
        .map_err(|e| bad(format!("its header: {e}")))?;
    let h: Header = serde_json::from_slice(&h).map_err(|e| bad(format!("its header: {e}")))?;
    Ok(Made {
        engine: h.engine,
        backend: h.backend,
        model: h.model,
        ids: h.ids,
    })
}

impl Prefix {
    /// Bytes of the snapshot made by `id`.
    pub fn to_bytes(&self, id: Identity) -> Vec<u8> {
        let header = Header {
            engine: ENGINE_VERSION.into(),
            backend: id.backend.into(),
            model: id.model.into(),
            ids: self.ids.clone(),
            layers: self
                .layers
                .iter()
                .map(|l| [l.n_slots, l.width, l.used()])
                .collect(),
        };
        let header = serde_json::to_vec(&header).unwrap_or_default();
        let floats: usize = self.layers.iter().map(|l| l.k.len() + l.v.len()).sum();
        let mut out = Vec::with_capacity(12 + header.len() + floats * 4 + 8);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT.to_le_bytes());
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        out.extend_from_slice(&header);
        for l in &self.layers {
            for x in l.k.iter().chain(&l.v) {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        let d = digest(&out);
        out.extend_from_slice(&d.to_le_bytes());
        out
    }

    /// The snapshot in `bytes`, if `id` made it and it is whole.
    pub fn from_bytes(bytes: &[u8], id: Identity) -> Result<Self> {
        if bytes.len() < 20 || &bytes[..4] != MAGIC {
            return Err(bad("not a kerze prefix snapshot"));
        }
        let word = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let format = word(4);
        if format != FORMAT {
            return Err(bad(format!(
                "format {format}, this engine reads format {FORMAT}"
            )));
        }
        let (body, tail) = bytes.split_at(bytes.len() - 8);
        let stored = u64::from_le_bytes(tail.try_into().unwrap_or([0; 8]));
        if digest(body) != stored {
            return Err(bad(format!(
                "its digest does not match its {} bytes: truncated or altered",
                bytes.len()
            )));
        }
        let hlen = word(8) as usize;
        if hlen > HEADER_MAX || 12 + hlen > body.len() {
            return Err(bad(format!("a header of {hlen} bytes does not fit")));
        }
        let h: Header = serde_json::from_slice(&body[12..12 + hlen])
            .map_err(|e| bad(format!("its header: {e}")))?;
        if h.engine != ENGINE_VERSION {
            return Err(bad(format!(
                "made by engine {}, this is {ENGINE_VERSION}",
                h.engine
            )));
        }
        if h.backend != id.backend {
            return Err(bad(format!(
                "made on the {} backend, this engine runs {}",
                h.backend, id.backend
            )));
        }
        if h.model != id.model {
            return Err(bad(format!(
                "made for model {}, this is {}",
                h.model, id.model
            )));
        }
        let mut need: usize = 0;
        for &[n_slots, width, used] in &h.layers {
            if used > n_slots || used > h.ids.len() {
                return Err(bad(format!(
                    "a layer holds {used} of {n_slots} slots for {} ids",
                    h.ids.len()
                )));
            }
            need = used
                .checked_mul(width)
                .and_then(|n| n.checked_mul(8))
                .and_then(|n| n.checked_add(need))
                .ok_or_else(|| bad("its layer sizes overflow"))?;
        }
        let data = &body[12 + hlen..];
        if data.len() != need {
            return Err(bad(format!(
                "{} bytes of keys and values, its header says {need}",
                data.len()
            )));
        }
        let mut floats = data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let layers = h
            .layers
            .iter()
            .map(|&[n_slots, width, used]| {
                let k = floats.by_ref().take(used * width).collect();
                let v = floats.by_ref().take(used * width).collect();
                KvRows {
                    n_slots,
                    width,
                    k,
                    v,
                }
            })
            .collect();
        Ok(Self { ids: h.ids, layers })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Prefix {
        Prefix {
            ids: vec![2, 10, 11],
            layers: vec![
                KvRows {
                    n_slots: 2,
                    width: 2,
                    k: vec![1.0, -2.0, 3.5, f32::MIN_POSITIVE],
                    v: vec![0.0, -0.0, 7.0, 8.0],
                },
                KvRows {
                    n_slots: 8,
                    width: 1,
                    k: vec![1.0, 2.0, 3.0],
                    v: vec![4.0, 5.0, 6.0],
                },
            ],
        }
    }

    const ID: Identity = Identity {
        model: "abc",
        backend: "cpu-native",
    };

    #[test]
    fn a_snapshot_reads_back_bit_for_bit() {
        let p = sample();
        let b = p.to_bytes(ID);
        let q = Prefix::from_bytes(&b, ID).unwrap();
        assert_eq!(q, p);
        assert_eq!(q.layers[0].v[1].to_bits(), (-0.0f32).to_bits());
        let made = read_header(&mut &b[..]).unwrap();
        assert_eq!(
            (
                made.engine.as_str(),
                made.backend.as_str(),
                made.model.as_str(),
                made.ids
            ),
            (ENGINE_VERSION, "cpu-native", "abc", p.ids)
        );
        assert!(read_header(&mut &b[..14]).is_err());
    }

    #[test]
    fn truncated_altered_or_foreign_snapshots_are_refused() {
        let b = sample().to_bytes(ID);
        let kind = |r: Result<Prefix>| r.err().map(|e| e.kind());
        for n in [0, 3, 19, b.len() / 2, b.len() - 1] {
            assert_eq!(
                kind(Prefix::from_bytes(&b[..n], ID)),
                Some("SnapshotError"),
                "{n}"
            );
        }
        let mut c = b.clone();
        let at = c.len() - 12;
        c[at] ^= 1;
        assert_eq!(kind(Prefix::from_bytes(&c, ID)), Some("SnapshotError"));
        let other = Identity { model: "abd", ..ID };
        let e = Prefix::from_bytes(&b, other).unwrap_err().to_string();
        assert!(e.contains("made for model abc"), "{e}");
        let gpu = Identity {
            backend: "webgpu",
            ..ID
        };
        assert!(Prefix::from_bytes(&b, gpu).is_err());
        // A header that claims more than the bytes hold (its digest made to match).
        let mut p = sample();
        p.layers[1].n_slots = 1;
        let b = p.to_bytes(ID);
        let e = Prefix::from_bytes(&b, ID).unwrap_err().to_string();
        assert!(e.contains("holds 3 of 1 slots"), "{e}");
    }
}
