//! Model hyper-parameters from GGUF metadata, validated once; plus the values the file does
//! not carry. GGUF key strings live here and in gguf/ and tokenizer/ only.

use crate::error::{Error, Result};
use crate::gguf::{Gguf, Value};

/// Architectures this build runs, as the error for any other says (the names of
/// [`Family::ALL`]).
pub const SUPPORTED_ARCHS: &str = "gemma3, llama, qwen2, qwen3, bert";

/// The model families this build runs: `general.architecture` read once, here; the forward
/// pass of each is chosen in `model/mod.rs`, the one place that matches on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// Gemma 3: sliding-window layers, QK-norm, post-norms, GELU, scaled embeddings.
    Gemma3,
    /// Llama 2/3.x, SmolLM/SmolLM2, TinyLlama: normal RoPE (Llama 3's frequency factors).
    Llama,
    /// Qwen2 / Qwen2.5: NeoX RoPE, q/k/v biases.
    Qwen2,
    /// Qwen3: NeoX RoPE, QK-norm, no biases.
    Qwen3,
    /// BERT-family encoders (BERT, MiniLM, BGE/E5-style): embeddings, not text.
    Bert,
}

impl Family {
    pub const ALL: &'static [Family] = &[
        Family::Gemma3,
        Family::Llama,
        Family::Qwen2,
        Family::Qwen3,
        Family::Bert,
    ];

    /// The `general.architecture` value of the family.
    pub fn arch(self) -> &'static str {
        match self {
            Family::Gemma3 => "gemma3",
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Bert => "bert",
        }
    }

    /// An encoder: bidirectional attention, pooled into one vector per text; no KV cache,
    /// no next token.
    pub fn is_encoder(self) -> bool {
        self == Family::Bert
    }

    /// The family of `general.architecture = arch`, or the typed error naming what runs.
    pub fn from_arch(arch: &str) -> Result<Family> {
        Self::ALL
            .iter()
            .copied()
            .find(|f| f.arch() == arch)
            .ok_or_else(|| Error::UnsupportedArch {
                arch: crate::error::excerpt(arch, 64),
                supported: SUPPORTED_ARCHS,
            })
    }
}

/// Default context window when the caller does not ask for one: the KV cache of the global
/// layers grows with it (Gemma 3 270M: 3 layers × n_ctx × 2 KiB × 2), so the file's 32 768
/// would cost 200 MB in a browser tab.
pub const DEFAULT_N_CTX: usize = 4096;

/// The most labels one call takes: each costs an embedding (or a continuation on a decoder),
/// and a result list longer than this is not a classification any more.
pub const MAX_LABELS: usize = 256;

/// A classification head's metadata in a GGUF (`kerze convert` writes them): its labels, the
/// activation between pooler and classifier, and the problem type.
pub const KEY_LABELS: &str = "bert.classifier.output_labels";
pub const KEY_HEAD_ACTIVATION: &str = "kerze.classifier.activation";
pub const KEY_PROBLEM_TYPE: &str = "kerze.classifier.problem_type";

/// How an encoder's token states become one vector (`{arch}.pooling_type`, llama.cpp's
/// numbering: 1 mean, 2 CLS, 3 last).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pooling {
    /// The average over the text's tokens, `[CLS]` and `[SEP]` included (sentence-transformers).
    Mean,
    /// The first token's state.
    Cls,
    /// The last token's state.
    Last,
}

/// The gate's activation in a gated feed-forward product.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Glu {
    /// GELU, tanh approximation (Gemma).
    GeluTanh,
    /// SiLU, `x·σ(x)` (Llama, Qwen, SmolLM).
    Silu,
}

/// Hyper-parameters of a transformer, in the one dimension vocabulary.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ModelConfig {
    pub family: Family,
    pub arch: String,
    pub name: String,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_layer: usize,
    pub n_vocab: usize,
    /// Context the engine runs with (≤ `n_ctx_train`).
    pub n_ctx: usize,
    /// Context the model was trained for, from the file.
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    /// RoPE base of the global layers (from the file).
    pub rope_base_global: f32,
    /// RoPE base of the sliding-window layers (Gemma 3: 10 000, not in the file).
    pub rope_base_local: f32,
    /// NeoX pairs (Gemma, Qwen) or normal pairs (Llama).
    pub rope_neox: bool,
    /// Positions are multiplied by this (`rope.scaling.type = linear`: 1 / factor).
    pub rope_freq_scale: f32,
    /// Tokens a sliding-window layer sees, itself included (None: every layer is global).
    pub sliding_window: Option<usize>,
    /// Every `sliding_pattern`-th layer is global (Gemma 3: 6).
    pub sliding_pattern: usize,
    /// The gate's activation in the feed-forward product.
    pub glu: Glu,
    /// The file has `output.weight`; else the LM head is the token embedding.
    pub untied_output: bool,
    /// q, k and v have biases (Qwen2).
    pub attn_bias: bool,
    /// q and k are RMS-normed per head before RoPE (Gemma 3, Qwen3).
    pub qk_norm: bool,
    /// Scale of q·k (Gemma 3: 1/sqrt(head_dim)).
    pub attn_scale: f32,
    /// Scale of the token embeddings (Gemma: sqrt(n_embd)).
    pub embd_scale: f32,
    /// Encoders: how token states become one vector (None for decoders).
    pub pooling: Option<Pooling>,
    /// Encoders: the longest text in tokens, `[CLS]` and `[SEP]` included; longer ones are
    /// truncated to it (`kerze.max_seq_length`, as sentence-transformers' `max_seq_length`;
    /// absent: the trained context).
    pub max_seq: usize,
    /// Encoders: rows of `token_types.weight` (BERT's segment embeddings; 0: none, as in
    /// DistilBERT).
    pub n_token_types: usize,
}

impl ModelConfig {
    /// Read and validate the config. `n_ctx`: the context to run with (None: the default,
    /// capped by the file's).
    pub fn from_gguf(g: &Gguf, n_ctx: Option<usize>) -> Result<Self> {
        let arch = g.architecture()?.to_string();
        let family = Family::from_arch(&arch)?;
        let key = |k: &str| format!("{arch}.{k}");
        let int = |k: &str| -> Result<usize> {
            let full = key(k);
            g.get(&full)
                .and_then(Value::as_u64)
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| {
                    Error::Config(format!("metadata {full} is missing or not an integer"))
                })
        };
        let float = |k: &str| -> Result<Option<f64>> {
            let full = key(k);
            match g.get(&full) {
                None => Ok(None),
                Some(v) => v
                    .as_f64()
                    .filter(|x| x.is_finite())
                    .map(Some)
                    .ok_or_else(|| {
                        Error::Config(format!("metadata {full} is not a finite number"))
                    }),
            }
        };
        let n_embd = int("embedding_length")?;
        let n_head = int("attention.head_count")?;
        let n_head_kv = int("attention.head_count_kv").unwrap_or(n_head);
        let head_dim = match int("attention.key_length") {
            Ok(d) => d,
            Err(_) if n_head > 0 => n_embd / n_head,
            Err(e) => return Err(e),
        };
        let v_dim = int("attention.value_length").unwrap_or(head_dim);
        let n_ff = int("feed_forward_length")?;
        let n_layer = int("block_count")?;
        let n_ctx_train = int("context_length")?;
        let gemma = family == Family::Gemma3;
        // Gemma 3 slides in 5 of 6 layers and says how far; the others attend globally.
        let sliding_window = if gemma {
            Some(int("attention.sliding_window")?)
        } else {
            None
        };
        let encoder = family.is_encoder();
        // The norm's epsilon: RMSNorm for decoders, LayerNorm for encoders.
        let rms_eps = if encoder {
            float("attention.layer_norm_epsilon")?.unwrap_or(1e-12)
        } else {
            float("attention.layer_norm_rms_epsilon")?.unwrap_or(if gemma { 1e-6 } else { 1e-5 })
        } as f32;
        let rope_base_global = float("rope.freq_base")?.unwrap_or(match family {
            Family::Gemma3 | Family::Qwen2 | Family::Qwen3 => 1_000_000.0,
            Family::Llama | Family::Bert => 10_000.0,
        }) as f32;
        if encoder && g.get(&key("attention.causal")).and_then(Value::as_u64) == Some(1) {
            return Err(Error::Config(
                "a causal encoder (attention.causal = true) is not supported".into(),
            ));
        }
        let pooling = if encoder {
            Some(match g.get(&key("pooling_type")).and_then(Value::as_u64) {
                None | Some(1) => Pooling::Mean,
                Some(2) => Pooling::Cls,
                Some(3) => Pooling::Last,
                Some(p) => {
                    return Err(Error::Config(format!(
                        "pooling_type {p} is not supported (1 mean, 2 CLS, 3 last)"
                    )))
                }
            })
        } else {
            None
        };
        let scaling = g
            .get(&key("rope.scaling.type"))
            .map(|v| v.as_str().unwrap_or("?"))
            .unwrap_or("none");
        let rope_freq_scale = match scaling {
            "none" => 1.0,
            "linear" => {
                let f = float("rope.scaling.factor")?.unwrap_or(1.0);
                if !(1.0..=1024.0).contains(&f) {
                    return Err(Error::Config(format!(
                        "rope.scaling.factor {f} is outside 1..=1024"
                    )));
                }
                (1.0 / f) as f32
            }
            other => {
                return Err(Error::Config(format!(
                    "rope scaling `{other}` is not supported (none, linear; Llama 3's frequency factors)"
                )))
            }
        };
        let has = |name: &str| g.tensor(name).is_some();
        let token_embd = g
            .tensor("token_embd.weight")
            .ok_or_else(|| Error::Config("tensor token_embd.weight is missing".into()))?;
        let n_vocab = token_embd.rows_cols().0;

        let check = |ok: bool, what: String| if ok { Ok(()) } else { Err(Error::Config(what)) };
        let in_range = |name: &str, v: usize, max: usize| {
            check(
                (1..=max).contains(&v),
                format!("{name} = {v} is outside 1..={max}"),
            )
        };
        in_range("n_embd", n_embd, 1 << 16)?;
        in_range("n_head", n_head, 1024)?;
        in_range("n_head_kv", n_head_kv, 1024)?;
        in_range("head_dim", head_dim, 1024)?;
        in_range("n_ff", n_ff, 1 << 18)?;
        in_range("n_layer", n_layer, 1024)?;
        in_range("n_vocab", n_vocab, 1 << 22)?;
        in_range("n_ctx_train", n_ctx_train, 1 << 24)?;
        if let Some(w) = sliding_window {
            in_range("sliding_window", w, 1 << 24)?;
        }
        check(
            n_head % n_head_kv == 0,
            format!("n_head {n_head} is not a multiple of n_head_kv {n_head_kv}"),
        )?;
        check(
            encoder || head_dim % 2 == 0,
            format!("head_dim {head_dim} is odd: RoPE needs pairs"),
        )?;
        check(
            !encoder || n_head * head_dim == n_embd,
            format!("n_head {n_head} × head_dim {head_dim} is not n_embd {n_embd}"),
        )?;
        check(
            v_dim == head_dim,
            format!("value_length {v_dim} differs from key_length {head_dim}"),
        )?;
        check(
            rms_eps > 0.0 && rms_eps < 1.0,
            format!("rms epsilon {rms_eps} is out of range"),
        )?;
        check(
            rope_base_global > 1.0,
            format!("rope.freq_base {rope_base_global} is out of range"),
        )?;

        let n_ctx = n_ctx.unwrap_or(DEFAULT_N_CTX.min(n_ctx_train));
        let (max_seq, n_token_types) = if encoder {
            let max = g
                .get("kerze.max_seq_length")
                .and_then(Value::as_u64)
                .map_or(n_ctx_train, |m| (m as usize).min(n_ctx_train))
                .min(n_ctx);
            in_range("max_seq_length", max, 1 << 24)?;
            let types = g
                .tensor("token_types.weight")
                .map_or(0, |t| t.rows_cols().0);
            (max.max(2), types)
        } else {
            (n_ctx, 0)
        };
        check(
            (1..=n_ctx_train).contains(&n_ctx),
            format!(
                "n_ctx {n_ctx} is outside 1..={n_ctx_train}, the context the model was trained for"
            ),
        )?;
        let name = g
            .get("general.name")
            .and_then(Value::as_str)
            .unwrap_or("unnamed")
            .to_string();
        Ok(Self {
            family,
            arch,
            name,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            n_layer,
            n_vocab,
            n_ctx,
            n_ctx_train,
            rms_eps,
            rope_base_global,
            rope_base_local: 10_000.0,
            rope_neox: family != Family::Llama,
            rope_freq_scale,
            sliding_window,
            sliding_pattern: 6,
            glu: if gemma { Glu::GeluTanh } else { Glu::Silu },
            untied_output: has("output.weight"),
            attn_bias: family == Family::Qwen2 || has("blk.0.attn_q.bias"),
            qk_norm: gemma || family == Family::Qwen3,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            embd_scale: if gemma { (n_embd as f32).sqrt() } else { 1.0 },
            pooling,
            max_seq,
            n_token_types,
        })
    }

    /// KV cache slots of layer `il`: a ring of `sliding_window` for sliding layers, `n_ctx`
    /// for global ones.
    pub fn kv_slots(&self, il: usize) -> usize {
        match self.window(il) {
            Some(w) => w.min(self.n_ctx),
            None => self.n_ctx,
        }
    }

    /// Bytes of the whole KV cache as the CPU backend holds it (f16 keys and values; the
    /// GPU's buffers are f32, twice this), saturating.
    pub fn kv_cache_bytes(&self) -> u64 {
        if self.family.is_encoder() {
            return 0;
        }
        let per_slot = (self.n_head_kv * self.head_dim) as u64 * 2 * 2;
        (0..self.n_layer)
            .map(|il| self.kv_slots(il) as u64)
            .sum::<u64>()
            .saturating_mul(per_slot)
    }

    /// Refuse a KV cache out of proportion to the weights (a tiny hostile file must not make
    /// us allocate gigabytes): at most twice the weights, or 256 MiB.
    pub fn check_kv_cache(&self, weight_bytes: u64) -> Result<()> {
        let need = self.kv_cache_bytes();
        let limit = weight_bytes.saturating_mul(2).max(256 << 20);
        if need > limit {
            return Err(Error::Config(format!(
                "a context of {} tokens needs {} MB of KV cache, more than this model's {} MB of weights justify (limit {} MB): load it with a smaller n_ctx",
                self.n_ctx,
                need >> 20,
                weight_bytes >> 20,
                limit >> 20
            )));
        }
        Ok(())
    }

    /// Gemma 3: layers 5, 11, 17, ... attend globally, the rest through a sliding window;
    /// without a window every layer is global.
    pub fn is_global(&self, il: usize) -> bool {
        self.sliding_window.is_none() || (il + 1).is_multiple_of(self.sliding_pattern)
    }

    /// The sliding window of layer `il` (None: it attends to everything before it).
    pub fn window(&self, il: usize) -> Option<usize> {
        self.sliding_window.filter(|_| !self.is_global(il))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supported_archs_names_every_family() {
        let names: Vec<&str> = Family::ALL.iter().map(|f| f.arch()).collect();
        assert_eq!(names.join(", "), SUPPORTED_ARCHS);
        for f in Family::ALL {
            assert_eq!(Family::from_arch(f.arch()).ok(), Some(*f));
        }
        assert!(matches!(
            Family::from_arch("mamba"),
            Err(Error::UnsupportedArch {
                supported: SUPPORTED_ARCHS,
                ..
            })
        ));
        // A file's megabyte-long name is named by its start.
        let long = format!("é{}", "x".repeat(1 << 20));
        let Err(Error::UnsupportedArch { arch, .. }) = Family::from_arch(&long) else {
            panic!("a long name is no family")
        };
        assert_eq!(arch, format!("é{}…", "x".repeat(62)));
    }
}
