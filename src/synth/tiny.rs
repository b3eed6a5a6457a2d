//! The tiny models: a Gemma 3 and one of each Llama-block family, their dimensions and the
//! weight types of their matrices.

use super::vocab::{byte_level_vocab, vocab, write_byte_level};
use super::weights::{norm, quantize};
use crate::config::Family;
use crate::error::Result;
use crate::gguf::{Array, GgmlType, Value, Writer};
use crate::rng::Rng;

/// The tiny model's dimensions.
pub const N_EMBD: usize = 256;
pub const N_HEAD: usize = 4;
pub const N_HEAD_KV: usize = 1;
pub const HEAD_DIM: usize = 64;
pub const N_FF: usize = 512;
pub const N_LAYER: usize = 6;
/// Small, so that short prompts already wrap the ring.
pub const SLIDING_WINDOW: usize = 8;
pub const N_CTX: usize = 512;

/// The tiny model as GGUF bytes (about 2.5 MB).
pub fn tiny_gemma3() -> Result<Vec<u8>> {
    let voc = vocab();
    let n_vocab = voc.len();
    let mut rng = Rng::new(0x6b65727a65);
    let mut w = Writer::new();
    let u32v = |x: usize| Value::U32(x as u32);
    w.kv("general.architecture", Value::String("gemma3".into()))
        .kv(
            "general.name",
            Value::String("kerze tiny gemma3 (synthetic)".into()),
        )
        .kv("gemma3.context_length", u32v(N_CTX))
        .kv("gemma3.embedding_length", u32v(N_EMBD))
        .kv("gemma3.block_count", u32v(N_LAYER))
        .kv("gemma3.feed_forward_length", u32v(N_FF))
        .kv("gemma3.attention.head_count", u32v(N_HEAD))
        .kv("gemma3.attention.head_count_kv", u32v(N_HEAD_KV))
        .kv("gemma3.attention.key_length", u32v(HEAD_DIM))
        .kv("gemma3.attention.value_length", u32v(HEAD_DIM))
        .kv("gemma3.attention.layer_norm_rms_epsilon", Value::F32(1e-6))
        .kv("gemma3.rope.freq_base", Value::F32(1_000_000.0))
        .kv("gemma3.attention.sliding_window", u32v(SLIDING_WINDOW))
        .kv("tokenizer.ggml.model", Value::String("llama".into()))
        .kv(
            "tokenizer.ggml.tokens",
            Value::Array(Array::Str(voc.iter().map(|t| t.0.as_str()).collect())),
        )
        .kv(
            "tokenizer.ggml.scores",
            Value::Array(Array::F32(voc.iter().map(|t| t.1).collect())),
        )
        .kv(
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(voc.iter().map(|t| t.2).collect())),
        )
        .kv("tokenizer.ggml.bos_token_id", Value::U32(2))
        .kv("tokenizer.ggml.eos_token_id", Value::U32(1))
        .kv("tokenizer.ggml.add_bos_token", Value::Bool(true))
        .kv("tokenizer.ggml.add_space_prefix", Value::Bool(false));
    let q_w = N_HEAD * HEAD_DIM;
    let kv_w = N_HEAD_KV * HEAD_DIM;
    let fan = |n: usize| 1.0 / (n as f32).sqrt();
    w.tensor(
        "token_embd.weight",
        GgmlType::Q8_0,
        &[N_EMBD as u64, n_vocab as u64],
        quantize(&mut rng, n_vocab, N_EMBD, 0.05, GgmlType::Q8_0)?,
    );
    w.tensor(
        "output_norm.weight",
        GgmlType::F32,
        &[N_EMBD as u64],
        norm(&mut rng, N_EMBD),
    );
    for il in 0..N_LAYER {
        let name = |n: &str| format!("blk.{il}.{n}.weight");
        let mut mat =
            |w: &mut Writer, n: &str, rows: usize, cols: usize, ty: GgmlType| -> Result<()> {
                let data = quantize(&mut rng, rows, cols, fan(cols), ty)?;
                w.tensor(&name(n), ty, &[cols as u64, rows as u64], data);
                Ok(())
            };
        mat(&mut w, "attn_q", q_w, N_EMBD, GgmlType::Q5_0)?;
        mat(&mut w, "attn_k", kv_w, N_EMBD, GgmlType::Q5_0)?;
        mat(&mut w, "attn_v", kv_w, N_EMBD, GgmlType::Q8_0)?;
        mat(&mut w, "attn_output", N_EMBD, q_w, GgmlType::Q4_K)?;
        mat(&mut w, "ffn_gate", N_FF, N_EMBD, GgmlType::Q5_0)?;
        mat(&mut w, "ffn_up", N_FF, N_EMBD, GgmlType::Q5_0)?;
        mat(&mut w, "ffn_down", N_EMBD, N_FF, GgmlType::Q6_K)?;
        for (n, len) in [
            ("attn_norm", N_EMBD),
            ("attn_q_norm", HEAD_DIM),
            ("attn_k_norm", HEAD_DIM),
            ("post_attention_norm", N_EMBD),
            ("ffn_norm", N_EMBD),
            ("post_ffw_norm", N_EMBD),
        ] {
            w.tensor(&name(n), GgmlType::F32, &[len as u64], norm(&mut rng, len));
        }
    }
    Ok(w.to_bytes())
}

/// Weight types of a tiny decoder: the token embedding, the attention and FFN matrices (q,
/// k, v, gate, up), and the output projections (attention output, down, LM head).
#[derive(Clone, Copy, Debug)]
pub struct Quants {
    pub embd: GgmlType,
    pub inner: GgmlType,
    pub outer: GgmlType,
}

impl Quants {
    /// Every matrix in one type.
    pub fn all(ty: GgmlType) -> Self {
        Self {
            embd: ty,
            inner: ty,
            outer: ty,
        }
    }
}

/// Dimensions of the tiny Llama-block decoders: Qwen3's head size is not n_embd / n_head.
pub fn decoder_dims(family: Family) -> (usize, usize, usize, usize) {
    // (n_head, n_head_kv, head_dim, n_layer)
    match family {
        Family::Qwen3 => (8, 2, 64, 3),
        _ => (4, 2, 64, 3),
    }
}

/// A tiny decoder of `family` (Llama, Qwen2 or Qwen3) as GGUF bytes, with the SentencePiece
/// vocabulary of [`vocab`] (a Llama 2-style file).
pub fn tiny_decoder(family: Family, q: Quants, seed: u64) -> Result<Vec<u8>> {
    tiny_decoder_with(family, q, seed, false)
}

/// [`tiny_decoder`] with, when `byte_level`, the GPT-2 byte-level vocabulary of
/// [`byte_level_vocab`] (pre `qwen2`), its ChatML template and `<|im_end|>` as eos.
pub fn tiny_decoder_with(
    family: Family,
    q: Quants,
    seed: u64,
    byte_level: bool,
) -> Result<Vec<u8>> {
    if family == Family::Gemma3 {
        return tiny_gemma3();
    }
    let voc = vocab();
    let bl = byte_level_vocab();
    let n_vocab = if byte_level { bl.0.len() } else { voc.len() };
    let arch = family.arch();
    let (n_head, n_head_kv, head_dim, n_layer) = decoder_dims(family);
    let mut rng = Rng::new(seed);
    let mut w = Writer::new();
    let u32v = |x: usize| Value::U32(x as u32);
    let k = |s: &str| format!("{arch}.{s}");
    w.kv("general.architecture", Value::String(arch.into()))
        .kv(
            "general.name",
            Value::String(format!("kerze tiny {arch} (synthetic)")),
        )
        .kv(&k("context_length"), u32v(N_CTX))
        .kv(&k("embedding_length"), u32v(N_EMBD))
        .kv(&k("block_count"), u32v(n_layer))
        .kv(&k("feed_forward_length"), u32v(N_FF))
        .kv(&k("attention.head_count"), u32v(n_head))
        .kv(&k("attention.head_count_kv"), u32v(n_head_kv))
        .kv(&k("attention.layer_norm_rms_epsilon"), Value::F32(1e-5))
        .kv(
            &k("rope.freq_base"),
            Value::F32(if family == Family::Llama {
                500_000.0
            } else {
                1_000_000.0
            }),
        );
    if family == Family::Qwen3 {
        w.kv(&k("attention.key_length"), u32v(head_dim))
            .kv(&k("attention.value_length"), u32v(head_dim));
    }
    if byte_level {
        let (tokens, types, merges) = &bl;
        write_byte_level(&mut w, tokens, types, merges);
    } else {
        w.kv("tokenizer.ggml.model", Value::String("llama".into()))
            .kv(
                "tokenizer.ggml.tokens",
                Value::Array(Array::Str(voc.iter().map(|t| t.0.as_str()).collect())),
            )
            .kv(
                "tokenizer.ggml.scores",
                Value::Array(Array::F32(voc.iter().map(|t| t.1).collect())),
            )
            .kv(
                "tokenizer.ggml.token_type",
                Value::Array(Array::I32(voc.iter().map(|t| t.2).collect())),
            )
            .kv("tokenizer.ggml.bos_token_id", Value::U32(2))
            .kv("tokenizer.ggml.eos_token_id", Value::U32(1))
            .kv("tokenizer.ggml.add_bos_token", Value::Bool(true));
    }
    let q_w = n_head * head_dim;
    let kv_w = n_head_kv * head_dim;
    let fan = |n: usize| 1.0 / (n as f32).sqrt();
    let dims = |rows: usize, cols: usize| [cols as u64, rows as u64];
    w.tensor(
        "token_embd.weight",
        q.embd,
        &dims(n_vocab, N_EMBD),
        quantize(&mut rng, n_vocab, N_EMBD, 0.5, q.embd)?,
    );
    w.tensor(
        "output_norm.weight",
        GgmlType::F32,
        &[N_EMBD as u64],
        norm(&mut rng, N_EMBD),
    );
    if family == Family::Llama {
        w.tensor(
            "output.weight",
            q.outer,
            &dims(n_vocab, N_EMBD),
            quantize(&mut rng, n_vocab, N_EMBD, 0.1, q.outer)?,
        );
        // Llama 3's long-context factors: 1 for high frequencies, up to 8 for low ones.
        let half = head_dim / 2;
        let factors: Vec<u8> = (0..half)
            .flat_map(|i| (1.0 + 7.0 * (i as f32 / (half - 1) as f32).powi(2)).to_le_bytes())
            .collect();
        w.tensor("rope_freqs.weight", GgmlType::F32, &[half as u64], factors);
    }
    for il in 0..n_layer {
        let name = |n: &str| format!("blk.{il}.{n}");
        let mut mat =
            |w: &mut Writer, n: &str, rows: usize, cols: usize, ty: GgmlType| -> Result<()> {
                let data = quantize(&mut rng, rows, cols, fan(cols), ty)?;
                w.tensor(&name(n), ty, &dims(rows, cols), data);
                Ok(())
            };
        mat(&mut w, "attn_q.weight", q_w, N_EMBD, q.inner)?;
        mat(&mut w, "attn_k.weight", kv_w, N_EMBD, q.inner)?;
        mat(&mut w, "attn_v.weight", kv_w, N_EMBD, q.inner)?;
        mat(&mut w, "attn_output.weight", N_EMBD, q_w, q.outer)?;
        mat(&mut w, "ffn_gate.weight", N_FF, N_EMBD, q.inner)?;
        mat(&mut w, "ffn_up.weight", N_FF, N_EMBD, q.inner)?;
        mat(&mut w, "ffn_down.weight", N_EMBD, N_FF, q.outer)?;
        let mut vectors = vec![("attn_norm.weight", N_EMBD), ("ffn_norm.weight", N_EMBD)];
        if family == Family::Qwen3 {
            vectors.extend([
                ("attn_q_norm.weight", head_dim),
                ("attn_k_norm.weight", head_dim),
            ]);
        }
        for (n, len) in vectors {
            w.tensor(&name(n), GgmlType::F32, &[len as u64], norm(&mut rng, len));
        }
        if family == Family::Qwen2 {
            for (n, len) in [
                ("attn_q.bias", q_w),
                ("attn_k.bias", kv_w),
                ("attn_v.bias", kv_w),
            ] {
                let b: Vec<u8> = (0..len)
                    .flat_map(|_| (0.5 * rng.normal()).to_le_bytes())
                    .collect();
                w.tensor(&name(n), GgmlType::F32, &[len as u64], b);
            }
        }
    }
    Ok(w.to_bytes())
}
