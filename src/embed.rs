//! Embeddings: texts → tokens (`[CLS]` … `[SEP]`; longer than the model's `max_seq` →
//! truncated there with `[SEP]` kept last, as sentence-transformers does, or an error, or
//! chunks) → the encoder in packed batches → pooling (mean / CLS / last, summed in f64) →
//! L2 normalisation. Backend-independent: the backend returns token states, this does the rest
//! (a [`Session`] on an encoder runs it: [`Session::embed`], [`Session::head_logits`]).

use crate::backend::Backend;
use crate::clock::now_ms;
use crate::config::Pooling;
use crate::error::{Error, Result};
use crate::session::Session;

/// What to do with a text longer than the model's `max_seq` tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Overflow {
    /// Keep the first `max_seq - 1` tokens and `[SEP]` (sentence-transformers).
    #[default]
    Truncate,
    /// A typed error (`ContextFullError`).
    Error,
    /// Embed windows of `max_seq` tokens and average them, weighted by their tokens.
    Chunk,
}

/// Options of an embedding call.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct EmbedOptions {
    /// Unit length (cosine similarity = dot product). Default true.
    pub normalize: bool,
    pub overflow: Overflow,
}

impl Default for EmbedOptions {
    fn default() -> Self {
        Self {
            normalize: true,
            overflow: Overflow::Truncate,
        }
    }
}

/// Token counts of an embedding call.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EmbedUsage {
    /// Tokens the encoder ran, `[CLS]` and `[SEP]` included.
    pub prompt_tokens: usize,
    /// Texts cut at `max_seq` (with `Overflow::Truncate`).
    pub truncated: usize,
    /// Tokens cut off those texts.
    pub truncated_tokens: usize,
    pub encode_ms: f64,
}

/// One vector per text, in order.
#[derive(Clone, Debug, PartialEq)]
pub struct Embeddings {
    pub data: Vec<Vec<f32>>,
    pub usage: EmbedUsage,
}

/// The most rows one forward pass runs (its activations are rows × n_ff floats).
pub const BATCH_TOKENS: usize = 256;

/// How a tokenized text enters the encoder: the pieces it runs as and their weights.
pub struct Planned {
    pub pieces: Vec<Vec<u32>>,
}

/// Fit one text's ids (`[CLS]` first, `[SEP]` last) into `max_seq`.
pub fn plan(
    ids: Vec<u32>,
    max_seq: usize,
    overflow: Overflow,
    usage: &mut EmbedUsage,
) -> Result<Planned> {
    if ids.len() <= max_seq {
        return Ok(Planned { pieces: vec![ids] });
    }
    match overflow {
        Overflow::Error => Err(Error::ContextFull {
            needed: ids.len(),
            n_ctx: max_seq,
        }),
        Overflow::Truncate => {
            usage.truncated += 1;
            usage.truncated_tokens += ids.len() - max_seq;
            let last = ids[ids.len() - 1];
            let mut t = ids[..max_seq - 1].to_vec();
            t.push(last);
            Ok(Planned { pieces: vec![t] })
        }
        Overflow::Chunk => {
            let (first, last) = (ids[0], ids[ids.len() - 1]);
            let body = &ids[1..ids.len() - 1];
            let pieces = body
                .chunks(max_seq - 2)
                .map(|c| {
                    let mut p = Vec::with_capacity(c.len() + 2);
                    p.push(first);
                    p.extend_from_slice(c);
                    p.push(last);
                    p
                })
                .collect();
            Ok(Planned { pieces })
        }
    }
}

/// Pool each text's rows of `hidden` (`(Σ lens, width)`, packed) into one vector.
pub fn pool(hidden: &[f32], width: usize, lens: &[usize], pooling: Pooling) -> Vec<Vec<f32>> {
    let mut out = Vec::with_capacity(lens.len());
    let mut start = 0;
    for &n in lens {
        let rows = &hidden[start * width..(start + n) * width];
        let v = match pooling {
            Pooling::Cls => rows[..width].to_vec(),
            Pooling::Last => rows[(n - 1) * width..].to_vec(),
            Pooling::Mean => {
                let mut acc = vec![0f64; width];
                for r in rows.chunks_exact(width) {
                    for (a, &x) in acc.iter_mut().zip(r) {
                        *a += f64::from(x);
                    }
                }
                acc.iter().map(|a| (a / n as f64) as f32).collect()
            }
        };
        out.push(v);
        start += n;
    }
    out
}

/// Scale to unit length (a zero vector stays zero), the sum in f64.
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    if norm > 0.0 {
        for x in v {
            *x = (f64::from(*x) / norm) as f32;
        }
    }
}

/// The cosine similarity of two vectors (f64 sums).
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let na: f64 = a.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// Batches of consecutive pieces with at most [`BATCH_TOKENS`] rows (a longer piece alone).
pub fn batches(pieces: &[Vec<u32>]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut rows) = (0, 0);
    for (i, p) in pieces.iter().enumerate() {
        if i > start && rows + p.len() > BATCH_TOKENS {
            out.push(start..i);
            start = i;
            rows = 0;
        }
        rows += p.len();
    }
    if start < pieces.len() {
        out.push(start..pieces.len());
    }
    out
}

impl<B: Backend> Session<B> {
    /// One vector per text from an encoder (see the module's doc).
    pub async fn embed(&mut self, texts: &[&str], opts: &EmbedOptions) -> Result<Embeddings> {
        let pooling = self
            .model
            .cfg()
            .pooling
            .ok_or_else(|| self.not_an_encoder())?;
        let t0 = now_ms();
        let (mut data, mut usage) = self.pooled(texts, opts.overflow, pooling).await?;
        if opts.normalize {
            data.iter_mut().for_each(|v| normalize(v));
        }
        usage.encode_ms = now_ms() - t0;
        Ok(Embeddings { data, usage })
    }

    fn not_an_encoder(&self) -> Error {
        Error::InvalidArgument(format!(
            "{} is a decoder: embeddings come from an encoder model (bert)",
            self.model.cfg().arch
        ))
    }

    /// One pooled, unnormalised vector per text; a text in chunks gets its pieces' vectors
    /// averaged, weighted by their tokens.
    pub(crate) async fn pooled(
        &mut self,
        texts: &[&str],
        overflow: Overflow,
        pooling: Pooling,
    ) -> Result<(Vec<Vec<f32>>, EmbedUsage)> {
        let cfg = self.model.cfg().clone();
        if cfg.pooling.is_none() {
            return Err(self.not_an_encoder());
        }
        if texts.is_empty() {
            return Err(Error::InvalidArgument("embed: no texts".into()));
        }
        let mut usage = EmbedUsage::default();
        // Each text's pieces (one, or its chunks), and which text each piece belongs to.
        let mut pieces: Vec<Vec<u32>> = Vec::new();
        let mut owner: Vec<usize> = Vec::new();
        for (i, t) in texts.iter().enumerate() {
            let ids = self.tok.encode_user(t, true)?;
            for p in plan(ids, cfg.max_seq, overflow, &mut usage)?.pieces {
                owner.push(i);
                pieces.push(p);
            }
        }
        let mut vectors: Vec<Vec<f32>> = Vec::with_capacity(pieces.len());
        for r in batches(&pieces) {
            let batch = &pieces[r];
            let h = self.model.encode(&mut self.be, batch)?;
            let rows = self.be.read(&h).await?;
            let lens: Vec<usize> = batch.iter().map(Vec::len).collect();
            vectors.extend(pool(&rows, cfg.n_embd, &lens, pooling));
        }
        usage.prompt_tokens = pieces.iter().map(Vec::len).sum();
        let mut data = vec![vec![0f64; cfg.n_embd]; texts.len()];
        let mut weight = vec![0f64; texts.len()];
        for ((v, &i), p) in vectors.iter().zip(&owner).zip(&pieces) {
            let w = p.len() as f64;
            for (a, &x) in data[i].iter_mut().zip(v) {
                *a += w * f64::from(x);
            }
            weight[i] += w;
        }
        let data = data
            .into_iter()
            .zip(weight)
            .map(|(v, w)| v.iter().map(|x| (x / w) as f32).collect())
            .collect();
        Ok((data, usage))
    }

    /// The classification head's outputs per text (its `[CLS]` state, the text truncated
    /// to the model's length): the logits, before softmax or sigmoid.
    pub async fn head_logits(&mut self, texts: &[&str]) -> Result<(Vec<Vec<f64>>, EmbedUsage)> {
        if self.model.head().is_none() {
            return Err(Error::InvalidArgument(
                "classify: this model has no classification head: give labels (names or examples)"
                    .into(),
            ));
        }
        let (cls, usage) = self.pooled(texts, Overflow::Truncate, Pooling::Cls).await?;
        let head = self
            .model
            .head()
            .ok_or_else(|| Error::Backend("head gone".into()))?;
        Ok((cls.iter().map(|c| head.logits(c)).collect(), usage))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_sep_and_chunks_cover_the_text() {
        let ids: Vec<u32> = std::iter::once(101).chain(1..=10).chain([102]).collect();
        let mut u = EmbedUsage::default();
        let t = plan(ids.clone(), 6, Overflow::Truncate, &mut u).unwrap();
        assert_eq!(t.pieces, vec![vec![101, 1, 2, 3, 4, 102]]);
        assert_eq!((u.truncated, u.truncated_tokens), (1, 6));
        let c = plan(ids.clone(), 6, Overflow::Chunk, &mut u).unwrap();
        assert_eq!(c.pieces.len(), 3);
        assert!(c
            .pieces
            .iter()
            .all(|p| p[0] == 101 && *p.last().unwrap() == 102 && p.len() <= 6));
        assert!(matches!(
            plan(ids, 6, Overflow::Error, &mut u),
            Err(Error::ContextFull { .. })
        ));
    }

    #[test]
    fn pooling_and_batches() {
        let h = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        assert_eq!(
            pool(&h, 2, &[2, 1], Pooling::Mean),
            vec![vec![2.0, 3.0], vec![5.0, 6.0]]
        );
        assert_eq!(
            pool(&h, 2, &[2, 1], Pooling::Cls),
            vec![vec![1.0, 2.0], vec![5.0, 6.0]]
        );
        assert_eq!(
            pool(&h, 2, &[2, 1], Pooling::Last),
            vec![vec![3.0, 4.0], vec![5.0, 6.0]]
        );
        let mut v = vec![3.0, 4.0];
        normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8]);
        let pieces = vec![vec![0; 1500], vec![0; 1000], vec![0; 3000], vec![0; 10]];
        assert_eq!(batches(&pieces), vec![0..1, 1..2, 2..3, 3..4]);
        assert_eq!(batches(&[vec![0; 10], vec![0; 10]]), vec![0..2]);
    }
}
