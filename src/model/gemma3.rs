//! Gemma 3, decoder only: sliding-window attention in 5 of every 6 layers, QK-norm, GELU-tanh
//! gated FFN, norms before and after both attention and FFN, embeddings × sqrt(n_embd), LM
//! head tied to the token embedding. The (1 + w) of Gemma's RMSNorm is already baked into the
//! GGUF norm weights.

use super::pass::matmuls;
use super::{Cache, Progress, Rows, Span, Want};
use crate::backend::{AttnParams, Backend, Rope};
use crate::config::Glu;
use crate::config::ModelConfig;
use crate::error::Result;
use crate::gguf::{ByteSource, Gguf};

/// One transformer block's weights.
pub struct Layer<B: Backend> {
    pub attn_norm: B::Weight,      // (n_embd)
    pub wq: B::Weight,             // (n_head * head_dim, n_embd)
    pub wk: B::Weight,             // (n_head_kv * head_dim, n_embd)
    pub wv: B::Weight,             // (n_head_kv * head_dim, n_embd)
    pub q_norm: B::Weight,         // (head_dim)
    pub k_norm: B::Weight,         // (head_dim)
    pub wo: B::Weight,             // (n_embd, n_head * head_dim)
    pub post_attn_norm: B::Weight, // (n_embd)
    pub ffn_norm: B::Weight,       // (n_embd)
    pub w_gate: B::Weight,         // (n_ff, n_embd)
    pub w_up: B::Weight,           // (n_ff, n_embd)
    pub w_down: B::Weight,         // (n_embd, n_ff)
    pub post_ffn_norm: B::Weight,  // (n_embd)
}

/// The model: config and weights.
pub struct Gemma3<B: Backend> {
    pub cfg: ModelConfig,
    pub token_embd: B::Weight,  // (n_vocab, n_embd), also the LM head
    pub output_norm: B::Weight, // (n_embd)
    pub layers: Vec<Layer<B>>,
    /// The rotary embeddings of global and sliding-window layers (their bases differ).
    pub rope_global: Rope,
    pub rope_local: Rope,
}

impl<B: Backend> Gemma3<B> {
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
        let mut wanted = vec![
            Want::new("token_embd.weight", &[c.n_embd, c.n_vocab]).head(),
            Want::new("output_norm.weight", &[c.n_embd]),
        ];
        for il in 0..c.n_layer {
            let t = |n: &str, d: &[usize]| Want::new(&format!("blk.{il}.{n}.weight"), d);
            wanted.extend([
                t("attn_norm", &[c.n_embd]),
                t("attn_q", &[c.n_embd, q_w]),
                t("attn_k", &[c.n_embd, kv_w]),
                t("attn_v", &[c.n_embd, kv_w]),
                t("attn_q_norm", &[c.head_dim]),
                t("attn_k_norm", &[c.head_dim]),
                t("attn_output", &[q_w, c.n_embd]),
                t("post_attention_norm", &[c.n_embd]),
                t("ffn_norm", &[c.n_embd]),
                t("ffn_gate", &[c.n_embd, c.n_ff]),
                t("ffn_up", &[c.n_embd, c.n_ff]),
                t("ffn_down", &[c.n_ff, c.n_embd]),
                t("post_ffw_norm", &[c.n_embd]),
            ]);
        }
        let mut weights = super::load_weights(be, g, src, &wanted, progress).await?;
        let mut next = || weights.next_required();
        let token_embd = next()?;
        let output_norm = next()?;
        let mut layers = Vec::with_capacity(c.n_layer);
        for _ in 0..c.n_layer {
            layers.push(Layer {
                attn_norm: next()?,
                wq: next()?,
                wk: next()?,
                wv: next()?,
                q_norm: next()?,
                k_norm: next()?,
                wo: next()?,
                post_attn_norm: next()?,
                ffn_norm: next()?,
                w_gate: next()?,
                w_up: next()?,
                w_down: next()?,
                post_ffn_norm: next()?,
            });
        }
        let rope_global = Rope::new(
            c.head_dim,
            c.rope_base_global,
            c.rope_freq_scale,
            None,
            true,
        );
        let rope_local = Rope::new(c.head_dim, c.rope_base_local, c.rope_freq_scale, None, true);
        Ok(Self {
            cfg,
            token_embd,
            output_norm,
            layers,
            rope_global,
            rope_local,
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
        let mut x = be.embed(&self.token_embd, ids, c.embd_scale)?; // (n_tok, n_embd)
        for (il, (l, kv)) in self.layers.iter().zip(cache.layers.iter_mut()).enumerate() {
            let global = c.is_global(il);
            // attention
            let h = be.rms_norm(&x, &l.attn_norm, c.rms_eps)?; // (n_tok, n_embd)
                                                               // q: (n_tok, n_head * head_dim); k and v: (n_tok, n_head_kv * head_dim)
            let [q, k, v] = matmuls(be, &h, [&l.wq, &l.wk, &l.wv])?;
            let q = be.rms_norm(&q, &l.q_norm, c.rms_eps)?; // per head
            let k = be.rms_norm(&k, &l.k_norm, c.rms_eps)?; // per head
            let rope = if global {
                &self.rope_global
            } else {
                &self.rope_local
            };
            let q = be.rope(&q, pos, rope)?;
            let k = be.rope(&k, pos, rope)?;
            let p = AttnParams {
                n_head: c.n_head,
                n_head_kv: c.n_head_kv,
                head_dim: c.head_dim,
                scale: c.attn_scale,
                window: c.window(il).unwrap_or(usize::MAX),
            };
            let a = span.attend(be, &q, &k, &v, kv, p)?; // (n_tok, n_head * head_dim)
            let a = be.matmul(&a, &l.wo)?; // (n_tok, n_embd)
            x = be.add_rms_norm(&x, &a, &l.post_attn_norm, c.rms_eps)?; // residual
                                                                        // feed-forward
            let h = be.rms_norm(&x, &l.ffn_norm, c.rms_eps)?;
            let [gate, up] = matmuls(be, &h, [&l.w_gate, &l.w_up])?; // (n_tok, n_ff) each
            let f = be.glu(&gate, &up, Glu::GeluTanh)?; // (n_tok, n_ff)
            let f = be.matmul(&f, &l.w_down)?; // (n_tok, n_embd)
            x = be.add_rms_norm(&x, &f, &l.post_ffn_norm, c.rms_eps)?; // residual
        }
        span.done(cache);
        be.rms_norm(&x, &self.output_norm, c.rms_eps)
    }

    /// The LM head `(n_vocab, n_embd)`: the token embedding (63% of a decode step's work).
    pub fn head(&self) -> &B::Weight {
        &self.token_embd
    }
}
