//! A tiny synthetic Gemma 3 (random weights, real architecture, a 400-token vocabulary), made
//! by our own code for fast golden tests natively and in wasm. Deterministic on every target:
//! the weights come from [`crate::sampler::Rng`], quantized by candle into the same types the
//! real 270M file uses (Q8_0, Q5_0, Q4_K, Q6_K, F32).

use crate::error::Result;
use crate::gguf::{Array, GgmlType, Value, Writer};
use crate::sampler::Rng;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

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

const WORDS: &[&str] = &[
    "▁t", "he", "▁the", "in", "▁a", "er", "an", "re", "on", "▁s", "en", "at", "▁o", "▁w", "nd",
    "ed", "▁and", "is", "▁of", "ing", "▁in", "▁to", "ou", "es", "▁b", "it", "or", "▁c", "ar", "al",
    "▁th", "▁i", "ll", "▁is", "▁h",
];

/// The vocabulary: (piece, score, token type).
pub fn vocab() -> Vec<(String, f32, i32)> {
    let mut v: Vec<(String, f32, i32)> = Vec::new();
    for c in [
        "<pad>",
        "<eos>",
        "<bos>",
        "<unk>",
        "<mask>",
        "<start_of_turn>",
        "<end_of_turn>",
    ] {
        v.push((c.to_string(), -1000.0, 3));
    }
    for u in ["\n", "\n\n", "<b>"] {
        v.push((u.to_string(), -1000.0, 4));
    }
    for b in 0..=255u32 {
        v.push((format!("<0x{b:02X}>"), 0.0, 6));
    }
    let mut normal: Vec<String> = vec!["▁".to_string()];
    normal.extend((33u8..127).map(|c| (c as char).to_string()));
    normal.extend(WORDS.iter().map(|s| s.to_string()));
    for (i, p) in normal.into_iter().enumerate() {
        // Multi-character pieces outrank single characters, as in a real SentencePiece model.
        let score = if p.chars().count() > 1 {
            -(i as f32)
        } else {
            -1000.0 - i as f32
        };
        v.push((p, score, 1));
    }
    v
}

fn quantize(rng: &mut Rng, rows: usize, cols: usize, std: f32, ty: GgmlType) -> Result<Vec<u8>> {
    let data: Vec<f32> = (0..rows * cols).map(|_| rng.normal() * std).collect();
    if ty == GgmlType::F32 {
        return Ok(data.iter().flat_map(|x| x.to_le_bytes()).collect());
    }
    let dtype = match ty {
        GgmlType::Q8_0 => GgmlDType::Q8_0,
        GgmlType::Q5_0 => GgmlDType::Q5_0,
        GgmlType::Q4_K => GgmlDType::Q4K,
        GgmlType::Q6_K => GgmlDType::Q6K,
        _ => GgmlDType::F32,
    };
    let t = Tensor::from_vec(data, (rows, cols), &Device::Cpu)?;
    Ok(QTensor::quantize(&t, dtype)?.data()?.into_owned())
}

fn norm(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|_| (1.0 + 0.1 * rng.normal()).to_le_bytes())
        .collect()
}

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
        .kv("tokenizer.ggml.add_bos_token", Value::Bool(true));
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
