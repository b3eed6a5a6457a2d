//! Random weights in a real model's shape: Qwen2.5-0.5B's dimensions and Q4_K_M layout with
//! a real vocabulary, or any GGUF's metadata and tensor index. A model's speed where its file
//! cannot go.

use super::vocab::write_byte_level;
use super::weights::{encode, norm, quantize};
use crate::error::{Error, Result};
use crate::gguf::{GgmlType, Value, Writer};
use crate::rng::Rng;

/// The weight type llama.cpp's Q4_K_M recipe gives a Qwen2-block tensor: Q6_K for the token
/// embedding and for attn_v / ffn_down in the "more bits" layers, Q4_K elsewhere; a K-quant on
/// rows that are not whole 256-value blocks falls back as llama.cpp does (Q4_K → Q5_0,
/// Q6_K → Q8_0), which is most of Qwen2.5-0.5B's tensors (n_embd 896).
pub fn q4_k_m_type(name: &str, layer: Option<usize>, n_layer: usize, cols: usize) -> GgmlType {
    let more_bits =
        |i: usize| i < n_layer / 8 || i >= 7 * n_layer / 8 || (i - n_layer / 8) % 3 == 2;
    let k = match (name, layer) {
        ("token_embd.weight", _) => GgmlType::Q6_K,
        (n, Some(i)) if (n == "attn_v.weight" || n == "ffn_down.weight") && more_bits(i) => {
            GgmlType::Q6_K
        }
        _ => GgmlType::Q4_K,
    };
    match (k, cols.is_multiple_of(256)) {
        (k, true) => k,
        (GgmlType::Q6_K, false) => GgmlType::Q8_0,
        (_, false) => GgmlType::Q5_0,
    }
}

/// A file with the dimensions and Q4_K_M layout of Qwen2.5-0.5B-Instruct (24 layers, n_embd
/// 896, 14 heads / 2 KV heads, n_ff 4864, q/k/v biases, tied embedding) with random weights
/// and a real vocabulary: the tokens, merges and added tokens of a Qwen `tokenizer.json`,
/// padded to 151 936 as Qwen's converter does. For speed measurements beside peers (~400 MB).
pub fn qwen25_05b_like(tokenizer_json: &[u8]) -> Result<Vec<u8>> {
    const N_VOCAB: usize = 151_936;
    let (n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff) = (896, 24, 14, 2, 64, 4864);
    let bad = |what: &str| Error::InvalidArgument(format!("tokenizer.json: {what}"));
    let t: serde_json::Value =
        serde_json::from_slice(tokenizer_json).map_err(|e| bad(&e.to_string()))?;
    let vocab = t["model"]["vocab"]
        .as_object()
        .ok_or_else(|| bad("no model.vocab"))?;
    let mut tokens: Vec<String> = (0..N_VOCAB).map(|i| format!("[PAD{i}]")).collect();
    let mut types = vec![5i32; N_VOCAB];
    for (piece, id) in vocab {
        let id = id.as_u64().ok_or_else(|| bad("an id is not a number"))? as usize;
        if id < N_VOCAB {
            tokens[id] = piece.clone();
            types[id] = 1;
        }
    }
    for a in t["added_tokens"]
        .as_array()
        .ok_or_else(|| bad("no added_tokens"))?
    {
        let id = a["id"].as_u64().unwrap_or(0) as usize;
        let content = a["content"].as_str().unwrap_or("");
        if id < N_VOCAB {
            tokens[id] = content.to_string();
            let looks = content.starts_with("<|") && content.ends_with("|>");
            types[id] = if a["special"].as_bool() == Some(true) || looks {
                3
            } else {
                4
            };
        }
    }
    let merges: Vec<String> = t["model"]["merges"]
        .as_array()
        .ok_or_else(|| bad("no merges"))?
        .iter()
        .filter_map(|m| match m {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Array(p) => Some(format!("{} {}", p[0].as_str()?, p[1].as_str()?)),
            _ => None,
        })
        .collect();
    let mut w = Writer::new();
    let u32v = |x: usize| Value::U32(x as u32);
    w.kv("general.architecture", Value::String("qwen2".into()))
        .kv(
            "general.name",
            Value::String(
                "kerze synthetic, Qwen2.5-0.5B-Instruct dimensions, Q4_K_M layout".into(),
            ),
        )
        .kv("qwen2.context_length", u32v(32768))
        .kv("qwen2.embedding_length", u32v(n_embd))
        .kv("qwen2.block_count", u32v(n_layer))
        .kv("qwen2.feed_forward_length", u32v(n_ff))
        .kv("qwen2.attention.head_count", u32v(n_head))
        .kv("qwen2.attention.head_count_kv", u32v(n_head_kv))
        .kv("qwen2.attention.layer_norm_rms_epsilon", Value::F32(1e-6))
        .kv("qwen2.rope.freq_base", Value::F32(1_000_000.0));
    write_byte_level(&mut w, &tokens, &types, &merges);
    let mut rng = Rng::new(0x5157_454e);
    let dims = |rows: usize, cols: usize| [cols as u64, rows as u64];
    let embd_ty = q4_k_m_type("token_embd.weight", None, n_layer, n_embd);
    w.tensor(
        "token_embd.weight",
        embd_ty,
        &dims(N_VOCAB, n_embd),
        quantize(&mut rng, N_VOCAB, n_embd, 0.05, embd_ty)?,
    );
    w.tensor(
        "output_norm.weight",
        GgmlType::F32,
        &[n_embd as u64],
        norm(&mut rng, n_embd),
    );
    let (q_w, kv_w) = (n_head * head_dim, n_head_kv * head_dim);
    for il in 0..n_layer {
        for (n, rows, cols) in [
            ("attn_q.weight", q_w, n_embd),
            ("attn_k.weight", kv_w, n_embd),
            ("attn_v.weight", kv_w, n_embd),
            ("attn_output.weight", n_embd, q_w),
            ("ffn_gate.weight", n_ff, n_embd),
            ("ffn_up.weight", n_ff, n_embd),
            ("ffn_down.weight", n_embd, n_ff),
        ] {
            let ty = q4_k_m_type(n, Some(il), n_layer, cols);
            let data = quantize(&mut rng, rows, cols, 1.0 / (cols as f32).sqrt(), ty)?;
            w.tensor(&format!("blk.{il}.{n}"), ty, &dims(rows, cols), data);
        }
        for (n, len) in [("attn_norm.weight", n_embd), ("ffn_norm.weight", n_embd)] {
            w.tensor(
                &format!("blk.{il}.{n}"),
                GgmlType::F32,
                &[len as u64],
                norm(&mut rng, len),
            );
        }
        for (n, len) in [
            ("attn_q.bias", q_w),
            ("attn_k.bias", kv_w),
            ("attn_v.bias", kv_w),
        ] {
            let b: Vec<u8> = (0..len)
                .flat_map(|_| (0.1 * rng.normal()).to_le_bytes())
                .collect();
            w.tensor(&format!("blk.{il}.{n}"), GgmlType::F32, &[len as u64], b);
        }
    }
    Ok(w.to_bytes())
}

/// The most tensor data [`shaped_like`] writes (the file is made in memory).
pub const SHAPED_MAX_BYTES: u64 = 8 << 30;

/// Values [`shaped_like`] draws and quantizes at a time (64 MiB of f32).
const SHAPED_CHUNK_VALUES: usize = 1 << 24;

/// A file of `shape`'s metadata (its vocabulary, its chat template, every key; the name
/// marked synthetic) and tensors (names, types, dims, in its order) with random weights from
/// `seed`: a model's speed without its weights, e.g. on a machine the model file cannot reach
/// (`kerze synth --shape-of`, from the header alone: [`crate::gguf::Gguf::read_index`]).
/// Matrices are normal with std 1/√cols (0.05 for the token embedding), norms and frequency
/// factors near 1, other vectors near 0; quantized by candle into each tensor's type, a run
/// of whole rows at a time. A shape of more than [`SHAPED_MAX_BYTES`] is refused.
pub fn shaped_like(shape: &crate::gguf::Gguf, seed: u64) -> Result<Vec<u8>> {
    let total = shape
        .tensors
        .iter()
        .fold(0u64, |a, t| a.saturating_add(t.n_bytes));
    if total > SHAPED_MAX_BYTES {
        return Err(Error::InvalidArgument(format!(
            "synth: the shape holds {:.1} GiB of tensors, more than the {} GiB a file made in memory may",
            total as f64 / (1u64 << 30) as f64,
            SHAPED_MAX_BYTES >> 30
        )));
    }
    let mut w = Writer::new();
    for (k, v) in &shape.metadata {
        // The writer aligns the data to its default.
        if k == "general.alignment" {
            continue;
        }
        let v = match (k.as_str(), v) {
            ("general.name", Value::String(s)) => Value::String(format!(
                "kerze synthetic, random weights in the shape of {s}"
            )),
            _ => v.clone(),
        };
        w.kv(k, v);
    }
    if !shape.metadata.contains_key("general.name") {
        w.kv(
            "general.name",
            Value::String("kerze synthetic, random weights".into()),
        );
    }
    // The normal values are drawn on one thread and quantized on this one, a run of rows at
    // a time in the same order (the file is the same for a seed): the 270M shape took 9.5 s
    // with both on one thread.
    let runs = |t: &crate::gguf::TensorInfo| {
        let (rows, cols) = t.rows_cols();
        let step = (SHAPED_CHUNK_VALUES / cols.max(1)).max(1);
        (0..rows)
            .step_by(step)
            .map(move |start| step.min(rows - start))
    };
    let tensors = &shape.tensors;
    std::thread::scope(|scope| -> Result<()> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<f32>>(2);
        scope.spawn(move || {
            let mut rng = Rng::new(seed);
            for t in tensors {
                let (_, cols) = t.rows_cols();
                let (mean, std) = if t.dims.len() == 1 {
                    let near_one = t.name.contains("norm") || t.name.starts_with("rope_");
                    (if near_one { 1.0 } else { 0.0 }, 0.1)
                } else if t.name == "token_embd.weight" {
                    (0.0, 0.05)
                } else {
                    (0.0, 1.0 / (cols as f32).sqrt())
                };
                for n in runs(t) {
                    let v = (0..n * cols).map(|_| mean + std * rng.normal()).collect();
                    if tx.send(v).is_err() {
                        return; // the encoder failed
                    }
                }
            }
        });
        for t in tensors {
            let (_, cols) = t.rows_cols();
            let mut data = Vec::with_capacity(t.n_bytes as usize);
            for n in runs(t) {
                let v = rx.recv().map_err(|_| {
                    Error::Backend("synth: the thread drawing the values stopped".into())
                })?;
                data.extend(encode(v, n, cols, t.ty)?);
            }
            if data.len() as u64 != t.n_bytes {
                return Err(Error::InvalidArgument(format!(
                    "synth: {} as {} came to {} bytes, not the {} of its shape",
                    t.name,
                    t.ty,
                    data.len(),
                    t.n_bytes
                )));
            }
            w.tensor(&t.name, t.ty, &t.dims, data);
        }
        Ok(())
    })?;
    Ok(w.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{Gguf, TensorInfo};
    use crate::synth::tiny::tiny_gemma3;

    #[test]
    fn a_shape_gives_its_tensors_and_metadata_with_other_weights() {
        let tiny = tiny_gemma3().unwrap();
        let g = Gguf::read(tiny.as_slice()).unwrap();
        let header = &tiny[..g.data_offset as usize];
        let a = shaped_like(&Gguf::read_index(header).unwrap(), 3).unwrap();
        assert_eq!(
            a,
            shaped_like(&g, 3).unwrap(),
            "the header alone or the whole file"
        );
        let s = Gguf::read(a.as_slice()).unwrap();
        let index = |g: &Gguf| -> Vec<(String, GgmlType, Vec<u64>, u64)> {
            g.tensors
                .iter()
                .map(|t| (t.name.clone(), t.ty, t.dims.clone(), t.n_bytes))
                .collect()
        };
        assert_eq!(index(&s), index(&g));
        let mut meta = s.metadata.clone();
        assert!(meta["general.name"]
            .as_str()
            .unwrap()
            .starts_with("kerze synthetic"));
        meta.remove("general.name");
        let mut want = g.metadata.clone();
        want.remove("general.name");
        assert_eq!(meta, want);
        // Other weights: no tensor's bytes are the original's.
        for (t, u) in s.tensors.iter().zip(&g.tensors) {
            let (x, y) = (t.offset as usize, u.offset as usize);
            let n = t.n_bytes as usize;
            assert_ne!(a[x..x + n], tiny[y..y + n], "{}", t.name);
        }
    }

    #[test]
    fn a_shape_too_large_to_make_in_memory_is_refused() {
        let g = Gguf {
            version: 3,
            metadata: Default::default(),
            tensors: vec![TensorInfo {
                name: "w".into(),
                ty: GgmlType::Q8_0,
                dims: vec![1 << 16, 1 << 18],
                offset: 0,
                n_bytes: (1u64 << 34) / 32 * 34,
            }],
            data_offset: 0,
            file_len: 0,
        };
        let e = shaped_like(&g, 1).unwrap_err().to_string();
        assert!(e.contains("GiB"), "{e}");
    }
}
