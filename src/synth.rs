//! Tiny synthetic models (random weights, real architectures, a 400-token vocabulary), made
//! by our own code for fast golden tests natively and in wasm: a Gemma 3 ([`tiny_gemma3`]) and
//! one of each Llama-block family ([`tiny_decoder`]: Llama with its own LM head and Llama 3
//! frequency factors, Qwen2 with q/k/v biases, Qwen3 with QK-norm and a head size apart from
//! n_embd / n_head). Deterministic on every target: the weights come from
//! [`crate::rng::Rng`], quantized by candle into the types asked for.

use crate::config::Family;
use crate::error::{Error, Result};
use crate::gguf::{Array, GgmlType, Value, Writer};
use crate::rng::Rng;
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
    encode(
        (0..rows * cols).map(|_| rng.normal() * std).collect(),
        rows,
        cols,
        ty,
    )
}

/// `data` (`rows` of `cols`) as tensor data of type `ty`.
fn encode(data: Vec<f32>, rows: usize, cols: usize, ty: GgmlType) -> Result<Vec<u8>> {
    if ty == GgmlType::F32 {
        return Ok(data.iter().flat_map(|x| x.to_le_bytes()).collect());
    }
    let dtype = match ty {
        GgmlType::Q8_0 => GgmlDType::Q8_0,
        GgmlType::Q5_0 => GgmlDType::Q5_0,
        GgmlType::Q4_K => GgmlDType::Q4K,
        GgmlType::Q6_K => GgmlDType::Q6K,
        GgmlType::F16 => GgmlDType::F16,
        GgmlType::Q4_0 => GgmlDType::Q4_0,
        GgmlType::Q4_1 => GgmlDType::Q4_1,
        GgmlType::Q5_1 => GgmlDType::Q5_1,
        GgmlType::Q2_K => GgmlDType::Q2K,
        GgmlType::Q3_K => GgmlDType::Q3K,
        GgmlType::Q5_K => GgmlDType::Q5K,
        GgmlType::BF16 => {
            // Round to nearest even, as torch and the `gguf` package do.
            return Ok(data
                .iter()
                .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                .collect());
        }
        other => {
            return Err(Error::InvalidArgument(format!(
                "synth: no quantizer for {other}"
            )))
        }
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

pub use crate::tokenizer::byte_chars;

/// A Qwen-style byte-level BPE vocabulary: the 256 byte characters, merges of common English
/// pieces, ChatML's control tokens and Qwen3's `<think>` markers. (tokens, types, merges).
pub fn byte_level_vocab() -> (Vec<String>, Vec<i32>, Vec<String>) {
    let bc = byte_chars();
    let mut tokens: Vec<String> = bc.iter().map(|c| c.to_string()).collect();
    let sp = bc[b' ' as usize];
    let words = [
        "Ġt", "he", "Ġthe", "in", "er", "an", "re", "on", "Ġa", "Ġs", "en", "at", "Ġo", "Ġw", "nd",
        "ed", "Ġand", "is", "Ġof", "ing", "Ġin", "Ġto", "ou", "es", "Ġb", "it", "or", "Ġc", "ar",
        "al", "Ġth", "Ġi", "ll", "Ġis", "Ġh", "Ġhe", "Ġhello", "Ċ", "ĊĊ",
    ];
    let mut merges = Vec::new();
    for w in words {
        let w = w.replace('Ġ', &sp.to_string());
        let chars: Vec<char> = w.chars().collect();
        if chars.len() < 2 || tokens.contains(&w) {
            continue;
        }
        // The first split whose halves are both tokens already.
        for k in (1..chars.len()).rev() {
            let (l, r): (String, String) =
                (chars[..k].iter().collect(), chars[k..].iter().collect());
            if tokens.contains(&l) && tokens.contains(&r) {
                merges.push(format!("{l} {r}"));
                tokens.push(w.clone());
                break;
            }
        }
    }
    let mut types = vec![1i32; tokens.len()];
    for (t, ty) in [
        ("<|endoftext|>", 3),
        ("<|im_start|>", 3),
        ("<|im_end|>", 3),
        ("<think>", 4),
        ("</think>", 4),
    ] {
        tokens.push(t.to_string());
        types.push(ty);
    }
    (tokens, types, merges)
}

/// The ChatML template of the byte-level tiny models (Qwen2.5's shape: a default system
/// prompt when the conversation brings none).
pub const CHATML_TEMPLATE: &str = "{%- for message in messages %}{%- if loop.first and message.role != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{%- endif %}{{ '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- endif %}";

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
        let id = |t: &str| tokens.iter().position(|x| x == t).unwrap_or(0) as u32;
        w.kv("tokenizer.ggml.model", Value::String("gpt2".into()))
            .kv("tokenizer.ggml.pre", Value::String("qwen2".into()))
            .kv(
                "tokenizer.ggml.tokens",
                Value::Array(Array::Str(tokens.iter().map(String::as_str).collect())),
            )
            .kv(
                "tokenizer.ggml.token_type",
                Value::Array(Array::I32(types.clone())),
            )
            .kv(
                "tokenizer.ggml.merges",
                Value::Array(Array::Str(merges.iter().map(String::as_str).collect())),
            )
            .kv(
                "tokenizer.ggml.bos_token_id",
                Value::U32(id("<|endoftext|>")),
            )
            .kv("tokenizer.ggml.eos_token_id", Value::U32(id("<|im_end|>")))
            .kv("tokenizer.ggml.add_bos_token", Value::Bool(false))
            .kv(
                "tokenizer.chat_template",
                Value::String(CHATML_TEMPLATE.into()),
            );
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
    let id = |s: &str| tokens.iter().position(|x| x == s).unwrap_or(0) as u32;
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
        .kv("qwen2.rope.freq_base", Value::F32(1_000_000.0))
        .kv("tokenizer.ggml.model", Value::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", Value::String("qwen2".into()))
        .kv(
            "tokenizer.ggml.tokens",
            Value::Array(Array::Str(tokens.iter().map(String::as_str).collect())),
        )
        .kv(
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(types.clone())),
        )
        .kv(
            "tokenizer.ggml.merges",
            Value::Array(Array::Str(merges.iter().map(String::as_str).collect())),
        )
        .kv(
            "tokenizer.ggml.bos_token_id",
            Value::U32(id("<|endoftext|>")),
        )
        .kv("tokenizer.ggml.eos_token_id", Value::U32(id("<|im_end|>")))
        .kv("tokenizer.ggml.add_bos_token", Value::Bool(false))
        .kv(
            "tokenizer.chat_template",
            Value::String(CHATML_TEMPLATE.into()),
        );
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
    let mut rng = Rng::new(seed);
    for t in &shape.tensors {
        let (rows, cols) = t.rows_cols();
        let (mean, std) = if t.dims.len() == 1 {
            let near_one = t.name.contains("norm") || t.name.starts_with("rope_");
            (if near_one { 1.0 } else { 0.0 }, 0.1)
        } else if t.name == "token_embd.weight" {
            (0.0, 0.05)
        } else {
            (0.0, 1.0 / (cols as f32).sqrt())
        };
        let step = (SHAPED_CHUNK_VALUES / cols.max(1)).max(1);
        let mut data = Vec::with_capacity(t.n_bytes as usize);
        for start in (0..rows).step_by(step) {
            let n = step.min(rows - start);
            let v = (0..n * cols).map(|_| mean + std * rng.normal()).collect();
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
    Ok(w.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{Gguf, TensorInfo};

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
