//! Llama and the decoders that share its block: pre-norm attention and SiLU-gated FFN with
//! plain residuals, grouped-query attention over every earlier position, RMSNorm, an LM head
//! of its own or tied to the token embedding. The families differ only in what the config
//! says: Llama 2/3.x, SmolLM and TinyLlama (normal RoPE; Llama 3 scales it with the
//! `rope_freqs.weight` frequency factors), Qwen2/2.5 (NeoX RoPE, q/k/v biases), Qwen3 (NeoX
//! RoPE, q and k RMS-normed per head before RoPE).

use super::pass::matmuls;
use super::{host_vector, Cache, Progress, Rows, Span, Want};
use crate::backend::{AttnParams, Backend, Rope};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::gguf::{ByteSource, Gguf};

/// One transformer block's weights.
pub struct Layer<B: Backend> {
    pub attn_norm: B::Weight,      // (n_embd)
    pub wq: B::Weight,             // (n_head * head_dim, n_embd)
    pub wk: B::Weight,             // (n_head_kv * head_dim, n_embd)
    pub wv: B::Weight,             // (n_head_kv * head_dim, n_embd)
    pub bq: Option<B::Weight>,     // (n_head * head_dim): Qwen2
    pub bk: Option<B::Weight>,     // (n_head_kv * head_dim): Qwen2
    pub bv: Option<B::Weight>,     // (n_head_kv * head_dim): Qwen2
    pub q_norm: Option<B::Weight>, // (head_dim): Qwen3
    pub k_norm: Option<B::Weight>, // (head_dim): Qwen3
    pub wo: B::Weight,             // (n_embd, n_head * head_dim)
    pub ffn_norm: B::Weight,       // (n_embd)
    pub w_gate: B::Weight,         // (n_ff, n_embd)
    pub w_up: B::Weight,           // (n_ff, n_embd)
    pub w_down: B::Weight,         // (n_embd, n_ff)
}

/// The model: config and weights.
pub struct Llama<B: Backend> {
    pub cfg: ModelConfig,
    pub token_embd: B::Weight,     // (n_vocab, n_embd)
    pub output_norm: B::Weight,    // (n_embd)
    pub output: Option<B::Weight>, // (n_vocab, n_embd); None: tied to token_embd
    pub layers: Vec<Layer<B>>,
    pub rope: Rope,
}

impl<B: Backend> Llama<B> {
    /// Check every tensor's presence and shape, then copy the weights tensor by tensor.
    pub async fn load(
        be: &mut B,
        g: &Gguf,
        src: &dyn ByteSource,
        cfg: ModelConfig,
        progress: Progress<'_>,
    ) -> Result<Self> {
        let c = &cfg;
        let q_w = c.n_head * c.head_dim;
        let kv_w = c.n_head_kv * c.head_dim;
        let embd = Want::new("token_embd.weight", &[c.n_embd, c.n_vocab]);
        let mut wanted = vec![
            if c.untied_output { embd } else { embd.head() },
            Want::new("output_norm.weight", &[c.n_embd]),
        ];
        if c.untied_output {
            wanted.push(Want::new("output.weight", &[c.n_embd, c.n_vocab]).head());
        }
        for il in 0..c.n_layer {
            let t = |n: &str, d: &[usize]| Want::new(&format!("blk.{il}.{n}"), d);
            // Present exactly when the config says so: a file with biases in some layers only
            // is refused rather than half-read.
            let maybe = |on: bool, n: &str, d: &[usize]| {
                let mut w = Want::new(&format!("blk.{il}.{n}"), d);
                w.required = on;
                w
            };
            wanted.extend([
                t("attn_norm.weight", &[c.n_embd]),
                t("attn_q.weight", &[c.n_embd, q_w]),
                t("attn_k.weight", &[c.n_embd, kv_w]),
                t("attn_v.weight", &[c.n_embd, kv_w]),
                maybe(c.attn_bias, "attn_q.bias", &[q_w]),
                maybe(c.attn_bias, "attn_k.bias", &[kv_w]),
                maybe(c.attn_bias, "attn_v.bias", &[kv_w]),
                maybe(c.qk_norm, "attn_q_norm.weight", &[c.head_dim]),
                maybe(c.qk_norm, "attn_k_norm.weight", &[c.head_dim]),
                t("attn_output.weight", &[q_w, c.n_embd]),
                t("ffn_norm.weight", &[c.n_embd]),
                t("ffn_gate.weight", &[c.n_embd, c.n_ff]),
                t("ffn_up.weight", &[c.n_embd, c.n_ff]),
                t("ffn_down.weight", &[c.n_ff, c.n_embd]),
            ]);
        }
        let factors = host_vector(g, src, "rope_freqs.weight", c.head_dim / 2)?;
        let rope = Rope::new(
            c.head_dim,
            c.rope_base_global,
            c.rope_freq_scale,
            factors.as_deref(),
            c.rope_neox,
        );
        let mut w = super::load_weights(be, g, src, &wanted, progress).await?;
        let token_embd = w.next_required()?;
        let output_norm = w.next_required()?;
        let output = if c.untied_output {
            Some(w.next_required()?)
        } else {
            None
        };
        let mut layers = Vec::with_capacity(c.n_layer);
        for _ in 0..c.n_layer {
            let attn_norm = w.next_required()?;
            let (wq, wk, wv) = (w.next_required()?, w.next_required()?, w.next_required()?);
            let (bq, bk, bv) = (w.next_optional()?, w.next_optional()?, w.next_optional()?);
            let (q_norm, k_norm) = (w.next_optional()?, w.next_optional()?);
            if bq.is_some() != c.attn_bias || q_norm.is_some() != c.qk_norm {
                return Err(Error::Config(
                    "the layers disagree on attention biases or QK-norm".into(),
                ));
            }
            layers.push(Layer {
                attn_norm,
                wq,
                wk,
                wv,
                bq,
                bk,
                bv,
                q_norm,
                k_norm,
                wo: w.next_required()?,
                ffn_norm: w.next_required()?,
                w_gate: w.next_required()?,
                w_up: w.next_required()?,
                w_down: w.next_required()?,
            });
        }
        Ok(Self {
            cfg,
            token_embd,
            output_norm,
            output,
            layers,
            rope,
        })
    }

    /// Run `ids` placed by `rows` after what `cache` holds and return the final-normed hidden
    /// states `(n_tok, n_embd)`. The caller chunks long prompts.
    pub fn forward(
        &self,
        be: &mut B,
        ids: &[u32],
        rows: Rows,
        cache: &mut Cache<B>,
    ) -> Result<B::Tensor> {
        let c = &self.cfg;
        let span = Span::new(c, cache, ids, rows)?;
        let pos = &span.pos;
        let bias = |be: &mut B, x: B::Tensor, b: &Option<B::Weight>| match b {
            Some(b) => be.add_bias(&x, b),
            None => Ok(x),
        };
        let norm = |be: &mut B, x: B::Tensor, w: &Option<B::Weight>| match w {
            Some(w) => be.rms_norm(&x, w, c.rms_eps),
            None => Ok(x),
        };
        let mut x = be.embed(&self.token_embd, ids, c.embd_scale)?; // (n_tok, n_embd)
        for (il, (l, kv)) in self.layers.iter().zip(cache.layers.iter_mut()).enumerate() {
            // attention
            let h = be.rms_norm(&x, &l.attn_norm, c.rms_eps)?; // (n_tok, n_embd)
                                                               // q: (n_tok, n_head * head_dim); k and v: (n_tok, n_head_kv * head_dim)
            let [q, k, v] = matmuls(be, &h, [&l.wq, &l.wk, &l.wv])?;
            let q = bias(be, q, &l.bq)?;
            let k = bias(be, k, &l.bk)?;
            let v = bias(be, v, &l.bv)?;
            let q = norm(be, q, &l.q_norm)?; // per head
            let k = norm(be, k, &l.k_norm)?; // per head
            let q = be.rope(&q, pos, &self.rope)?;
            let k = be.rope(&k, pos, &self.rope)?;
            let p = AttnParams {
                n_head: c.n_head,
                n_head_kv: c.n_head_kv,
                head_dim: c.head_dim,
                scale: c.attn_scale,
                window: c.window(il).unwrap_or(usize::MAX),
            };
            let a = span.attend(be, &q, &k, &v, kv, p)?; // (n_tok, n_head * head_dim)
            let a = be.matmul(&a, &l.wo)?; // (n_tok, n_embd)
            x = be.add(&x, &a)?; // residual
                                 // feed-forward
            let h = be.rms_norm(&x, &l.ffn_norm, c.rms_eps)?;
            let [gate, up] = matmuls(be, &h, [&l.w_gate, &l.w_up])?; // (n_tok, n_ff) each
            let f = be.glu(&gate, &up, c.glu)?; // (n_tok, n_ff)
            let f = be.matmul(&f, &l.w_down)?; // (n_tok, n_embd)
            x = be.add(&x, &f)?; // residual
        }
        span.done(cache);
        be.rms_norm(&x, &self.output_norm, c.rms_eps)
    }

    /// The LM head `(n_vocab, n_embd)`: `output.weight`, or the token embedding where they
    /// are tied.
    pub fn head(&self) -> &B::Weight {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }
}
