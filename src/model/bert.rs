//! BERT-family encoders (BERT, MiniLM, BGE/E5-style; DistilBERT, which has no token types):
//! token + position (+ token-type) embeddings and a LayerNorm, then post-LN blocks — bidirectional attention with biases,
//! residual, LayerNorm; a GELU (erf) feed-forward with biases, residual, LayerNorm. No KV
//! cache: a batch of texts runs packed (rows of all texts one after another, each attending
//! only within itself), so nothing is padded. Pooling and normalisation are the caller's
//! (embed.rs); this returns every token's state.

use super::{Progress, Want};
use crate::backend::{AttnParams, Backend};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::gguf::{ByteSource, Gguf};

/// A weight and its bias.
pub struct Linear<B: Backend> {
    pub w: B::Weight, // (out, in)
    pub b: B::Weight, // (out)
}

/// One block's weights.
pub struct Layer<B: Backend> {
    pub q: Linear<B>,                      // (n_embd, n_embd)
    pub k: Linear<B>,                      // (n_embd, n_embd)
    pub v: Linear<B>,                      // (n_embd, n_embd)
    pub o: Linear<B>,                      // (n_embd, n_embd)
    pub attn_norm: (B::Weight, B::Weight), // (n_embd), (n_embd)
    pub up: Linear<B>,                     // (n_ff, n_embd)
    pub down: Linear<B>,                   // (n_embd, n_ff)
    pub out_norm: (B::Weight, B::Weight),  // (n_embd), (n_embd)
}

pub struct Bert<B: Backend> {
    pub cfg: ModelConfig,
    pub token_embd: B::Weight,             // (n_vocab, n_embd)
    pub position_embd: B::Weight,          // (n_ctx_train, n_embd)
    pub token_types: Option<B::Weight>,    // (n_token_types, n_embd); None: DistilBERT
    pub embd_norm: (B::Weight, B::Weight), // (n_embd), (n_embd)
    pub layers: Vec<Layer<B>>,
}

impl<B: Backend> Bert<B> {
    /// Check every tensor's presence and shape, then copy the weights tensor by tensor.
    pub fn load(
        be: &mut B,
        g: &Gguf,
        src: &dyn ByteSource,
        cfg: ModelConfig,
        progress: Progress,
    ) -> Result<Self> {
        let c = &cfg;
        let (e, f) = (c.n_embd, c.n_ff);
        let mut wanted = vec![
            Want::new("token_embd.weight", &[e, c.n_vocab]),
            Want::new("position_embd.weight", &[e, c.n_ctx_train]),
            Want::optional("token_types.weight", &[e, c.n_token_types]),
            Want::new("token_embd_norm.weight", &[e]),
            Want::new("token_embd_norm.bias", &[e]),
        ];
        for il in 0..c.n_layer {
            let t = |n: &str, d: &[usize]| Want::new(&format!("blk.{il}.{n}"), d);
            for (name, cols, rows) in [
                ("attn_q", e, e),
                ("attn_k", e, e),
                ("attn_v", e, e),
                ("attn_output", e, e),
            ] {
                wanted.push(t(&format!("{name}.weight"), &[cols, rows]));
                wanted.push(t(&format!("{name}.bias"), &[rows]));
            }
            wanted.extend([
                t("attn_output_norm.weight", &[e]),
                t("attn_output_norm.bias", &[e]),
                t("ffn_up.weight", &[e, f]),
                t("ffn_up.bias", &[f]),
                t("ffn_down.weight", &[f, e]),
                t("ffn_down.bias", &[e]),
                t("layer_output_norm.weight", &[e]),
                t("layer_output_norm.bias", &[e]),
            ]);
        }
        let mut w = super::load_weights(be, g, src, &wanted, progress)?;
        let token_embd = w.next_required()?;
        let position_embd = w.next_required()?;
        let token_types = w.next_optional()?;
        let mut next = || w.next_required();
        let embd_norm = (next()?, next()?);
        let mut layers = Vec::with_capacity(c.n_layer);
        for _ in 0..c.n_layer {
            let mut linear = || -> Result<Linear<B>> {
                Ok(Linear {
                    w: next()?,
                    b: next()?,
                })
            };
            let (q, k, v, o) = (linear()?, linear()?, linear()?, linear()?);
            let attn_norm = (next()?, next()?);
            let up = Linear {
                w: next()?,
                b: next()?,
            };
            let down = Linear {
                w: next()?,
                b: next()?,
            };
            let out_norm = (next()?, next()?);
            layers.push(Layer {
                q,
                k,
                v,
                o,
                attn_norm,
                up,
                down,
                out_norm,
            });
        }
        Ok(Self {
            cfg,
            token_embd,
            position_embd,
            token_types,
            embd_norm,
            layers,
        })
    }

    /// Every token's final state for a batch of texts (ids with `[CLS]`…`[SEP]`, each at most
    /// the trained context), packed: `(Σ len, n_embd)`, the texts' rows one after another.
    pub fn forward(&self, be: &mut B, texts: &[Vec<u32>]) -> Result<B::Tensor> {
        let c = &self.cfg;
        if texts.is_empty() || texts.iter().any(Vec::is_empty) {
            return Err(Error::InvalidArgument(
                "an encoder batch needs texts with tokens".into(),
            ));
        }
        if let Some(t) = texts.iter().find(|t| t.len() > c.n_ctx_train) {
            return Err(Error::ContextFull {
                needed: t.len(),
                n_ctx: c.n_ctx_train,
            });
        }
        let lens: Vec<usize> = texts.iter().map(Vec::len).collect();
        let ids: Vec<u32> = texts.concat();
        let pos: Vec<u32> = lens.iter().flat_map(|&n| 0..n as u32).collect();
        let types = vec![0u32; ids.len()];
        let lin = |be: &mut B, x: &B::Tensor, l: &Linear<B>| -> Result<B::Tensor> {
            let y = be.matmul(x, &l.w)?;
            be.add_bias(&y, &l.b)
        };
        let norm = |be: &mut B, x: &B::Tensor, n: &(B::Weight, B::Weight)| {
            be.layer_norm(x, &n.0, &n.1, c.rms_eps)
        };
        let x = be.embed(&self.token_embd, &ids, 1.0)?; // (n_tok, n_embd)
        let p = be.embed(&self.position_embd, &pos, 1.0)?; // (n_tok, n_embd)
        let mut x = be.add(&x, &p)?;
        if let Some(tt) = &self.token_types {
            let t = be.embed(tt, &types, 1.0)?; // (n_tok, n_embd)
            x = be.add(&x, &t)?;
        }
        let mut x = norm(be, &x, &self.embd_norm)?;
        let ap = AttnParams {
            n_head: c.n_head,
            n_head_kv: c.n_head,
            head_dim: c.head_dim,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
            window: usize::MAX,
        };
        for l in &self.layers {
            // attention, then the residual and a LayerNorm (post-LN)
            let q = lin(be, &x, &l.q)?; // (n_tok, n_embd)
            let k = lin(be, &x, &l.k)?; // (n_tok, n_embd)
            let v = lin(be, &x, &l.v)?; // (n_tok, n_embd)
            let a = be.attention_packed(&q, &k, &v, &lens, ap)?; // (n_tok, n_embd)
            let a = lin(be, &a, &l.o)?; // (n_tok, n_embd)
            let h = be.add(&x, &a)?;
            x = norm(be, &h, &l.attn_norm)?;
            // feed-forward, then the residual and a LayerNorm
            let u = lin(be, &x, &l.up)?; // (n_tok, n_ff)
            let u = be.gelu(&u)?;
            let d = lin(be, &u, &l.down)?; // (n_tok, n_embd)
            let h = be.add(&x, &d)?;
            x = norm(be, &h, &l.out_norm)?;
        }
        Ok(x)
    }
}
