//! BERT-family encoders (BERT, MiniLM, BGE/E5-style; DistilBERT, which has no token types):
//! token + position (+ token-type) embeddings and a LayerNorm, then post-LN blocks — bidirectional attention with biases,
//! residual, LayerNorm; a GELU (erf) feed-forward with biases, residual, LayerNorm. No KV
//! cache: a batch of texts runs packed (rows of all texts one after another, each attending
//! only within itself), so nothing is padded. Pooling and normalisation are the caller's
//! (embed.rs); this returns every token's state.

use super::{Progress, Want};
use crate::backend::{AttnParams, Backend, Then};
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

/// How a classification head's outputs become scores (`problem_type` of `config.json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Problem {
    /// Softmax over the labels (the default).
    SingleLabel,
    /// A sigmoid per label: each score on its own.
    MultiLabel,
    /// The raw outputs.
    Regression,
}

/// A sequence-classification head (`BertForSequenceClassification`): the `[CLS]` state →
/// pooler → tanh (DistilBERT: pre-classifier → ReLU) → classifier. A few thousand
/// multiply-adds per text, so it runs on the host in f32, on any backend.
pub struct Head {
    /// `(n_embd × n_embd, n_embd)` and whether ReLU (else tanh) follows; `None`: the
    /// classifier reads the `[CLS]` state itself.
    pub pooler: Option<(Vec<f32>, Vec<f32>, bool)>,
    /// `(n_labels × n_embd, n_labels)`.
    pub out: (Vec<f32>, Vec<f32>),
    pub labels: Vec<String>,
    pub problem: Problem,
}

impl Head {
    /// The head's outputs for one `[CLS]` state.
    pub fn logits(&self, cls: &[f32]) -> Vec<f64> {
        let affine = |w: &[f32], b: &[f32], x: &[f32]| -> Vec<f32> {
            b.iter()
                .zip(w.chunks_exact(x.len()))
                .map(|(&b, row)| {
                    let dot: f64 = row
                        .iter()
                        .zip(x)
                        .map(|(&w, &x)| f64::from(w) * f64::from(x))
                        .sum();
                    (dot + f64::from(b)) as f32
                })
                .collect()
        };
        let pooled = match &self.pooler {
            Some((w, b, relu)) => affine(w, b, cls)
                .into_iter()
                .map(|v| if *relu { v.max(0.0) } else { v.tanh() })
                .collect(),
            None => cls.to_vec(),
        };
        affine(&self.out.0, &self.out.1, &pooled)
            .into_iter()
            .map(f64::from)
            .collect()
    }

    /// Scores from [`Head::logits`]: softmax, sigmoids or the values themselves.
    pub fn scores(&self, logits: &[f64]) -> Vec<f64> {
        match self.problem {
            Problem::SingleLabel => crate::logits::softmax(logits),
            Problem::MultiLabel => logits.iter().map(|&z| 1.0 / (1.0 + (-z).exp())).collect(),
            Problem::Regression => logits.to_vec(),
        }
    }

    /// The head of file `g`, if it has one (`cls.output.*`, and `cls.*` for the pooler).
    pub fn load(g: &Gguf, src: &dyn ByteSource, n_embd: usize) -> Result<Option<Self>> {
        use crate::config::{KEY_HEAD_ACTIVATION, KEY_LABELS, KEY_PROBLEM_TYPE, MAX_LABELS};
        let Some(out_w) = g.tensor("cls.output.weight") else {
            return Ok(None);
        };
        let n = out_w.dims.get(1).copied().unwrap_or(0) as usize;
        if n == 0 || n > MAX_LABELS {
            return Err(Error::Config(format!(
                "cls.output.weight: {n} labels (1 to {})",
                MAX_LABELS
            )));
        }
        let read = |name: &str, dims: &[usize]| super::host_f32(g, src, name, dims);
        let out = (
            read("cls.output.weight", &[n_embd, n])?,
            read("cls.output.bias", &[n])?,
        );
        let act = g
            .get(KEY_HEAD_ACTIVATION)
            .and_then(|v| v.as_str())
            .unwrap_or("tanh");
        let pooler = match (act, g.tensor("cls.weight")) {
            ("none", _) | (_, None) => None,
            (a @ ("tanh" | "relu"), Some(_)) => Some((
                read("cls.weight", &[n_embd, n_embd])?,
                read("cls.bias", &[n_embd])?,
                a == "relu",
            )),
            (other, _) => {
                return Err(Error::Config(format!(
                    "{KEY_HEAD_ACTIVATION} {other} (tanh, relu or none)"
                )))
            }
        };
        let labels: Vec<String> = match g
            .get(KEY_LABELS)
            .and_then(|v| v.as_array())
            .and_then(|a| a.strings())
        {
            Some(s) if s.len() == n => s.iter().map(str::to_string).collect(),
            Some(s) => {
                return Err(Error::Config(format!(
                    "{KEY_LABELS} has {} labels, the classifier {n} outputs",
                    s.len()
                )))
            }
            None => (0..n).map(|i| format!("LABEL_{i}")).collect(),
        };
        let problem = match g.get(KEY_PROBLEM_TYPE).and_then(|v| v.as_str()) {
            None | Some("single_label_classification") => Problem::SingleLabel,
            Some("multi_label_classification") => Problem::MultiLabel,
            Some("regression") => Problem::Regression,
            Some(other) => return Err(Error::Config(format!("{KEY_PROBLEM_TYPE} {other}"))),
        };
        Ok(Some(Self {
            pooler,
            out,
            labels,
            problem,
        }))
    }
}

pub struct Bert<B: Backend> {
    pub cfg: ModelConfig,
    /// A sequence-classification head, when the file has one.
    pub head: Option<Head>,
    pub token_embd: B::Weight,             // (n_vocab, n_embd)
    pub position_embd: B::Weight,          // (n_ctx_train, n_embd)
    pub token_types: Option<B::Weight>,    // (n_token_types, n_embd); None: DistilBERT
    pub embd_norm: (B::Weight, B::Weight), // (n_embd), (n_embd)
    pub layers: Vec<Layer<B>>,
}

impl<B: Backend> Bert<B> {
    /// Check every tensor's presence and shape, then copy the weights tensor by tensor.
    pub async fn load(
        be: &mut B,
        g: &Gguf,
        src: &dyn ByteSource,
        cfg: ModelConfig,
        progress: Progress<'_>,
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
        let head = Head::load(g, src, e)?;
        let mut w = super::load_weights(be, g, src, &wanted, progress).await?;
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
            head,
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
            let qkv = [&l.q, &l.k, &l.v].map(|l| (&l.w, &l.b));
            let [q, k, v]: [B::Tensor; 3] = be
                .linears(&x, &qkv)?
                .try_into()
                .map_err(|_| Error::Backend("linears: not one output per layer".into()))?;
            let a = be.attention_packed(&q, &k, &v, &lens, ap)?; // (n_tok, n_embd)
            let h = be.linear_then(&a, &l.o.w, &l.o.b, Then::Add(&x))?; // x + o(a)
            x = norm(be, &h, &l.attn_norm)?;
            // feed-forward, then the residual and a LayerNorm
            let u = be.linear_then(&x, &l.up.w, &l.up.b, Then::Gelu)?; // (n_tok, n_ff)
            let h = be.linear_then(&u, &l.down.w, &l.down.b, Then::Add(&x))?; // x + down(u)
            x = norm(be, &h, &l.out_norm)?;
        }
        Ok(x)
    }
}
