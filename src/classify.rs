//! Classification: a text → `[{ label, score }]`, sorted, the scores summing to 1.
//!
//! - **Zero-shot** (encoder): the text's embedding against each label's (its name or a
//!   description), cosine similarities → softmax at `temperature`. One encoder pass per text
//!   whatever the label count: label embeddings are computed once and kept by the session.
//! - **Few-shot** (encoder): label → example texts; nearest centroid (the normalised mean of
//!   the examples' embeddings, scored like zero-shot) or a multinomial logistic regression
//!   trained on the examples at call time (full-batch gradient descent in f64, fixed steps:
//!   deterministic, so a Python twin decides the same).
//! - **Generative** (decoder): each label's log-likelihood as the continuation of a prompt
//!   that shows the text and the labels; the prompt's KV is computed once and all the labels
//!   continue from it in one batched pass (branches that share the prompt's KV: see
//!   [`crate::score`]). Calibrated by the same scores after a content-free text ("contextual
//!   calibration"): a label the model likes whatever the text loses that bias.
//!
//! The math here is backend-free; a [`Session`] runs the model.

use crate::backend::Backend;
use crate::config::MAX_LABELS;
use crate::error::{Error, Result};
use crate::logits::softmax;
use crate::score::{ScoreUsage, MAX_LABEL_IDS};
use crate::session::Session;

/// The labels of a call.
#[derive(Clone, Debug, PartialEq)]
pub enum Labels {
    /// Names or descriptions (zero-shot).
    Names(Vec<String>),
    /// Label → example texts (few-shot), in the caller's order.
    Examples(Vec<(String, Vec<String>)>),
    /// The model's own labels, scored by its classification head (a
    /// `…ForSequenceClassification` model: no labels given).
    Head,
}

impl Labels {
    pub fn names(&self) -> Vec<&str> {
        match self {
            Self::Names(n) => n.iter().map(String::as_str).collect(),
            Self::Examples(e) => e.iter().map(|(l, _)| l.as_str()).collect(),
            Self::Head => Vec::new(),
        }
    }

    /// Empty, duplicate, blank or too many labels, or a label without examples: a typed
    /// error that names it.
    pub fn check(&self) -> Result<()> {
        if *self == Self::Head {
            return Ok(());
        }
        let names = self.names();
        if names.is_empty() {
            return Err(bad("labels: give at least one label".into()));
        }
        if names.len() > MAX_LABELS {
            return Err(bad(format!(
                "labels: {} labels, at most {MAX_LABELS}",
                names.len()
            )));
        }
        let mut seen = std::collections::HashSet::new();
        for n in &names {
            if n.trim().is_empty() {
                return Err(bad("labels: a label is empty".into()));
            }
            if !seen.insert(*n) {
                return Err(bad(format!("labels: \"{n}\" is given twice")));
            }
        }
        if let Self::Examples(e) = self {
            for (l, ex) in e {
                if ex.is_empty() {
                    return Err(bad(format!("labels: \"{l}\" has no example texts")));
                }
                if ex.iter().any(|t| t.trim().is_empty()) {
                    return Err(bad(format!("labels: an example of \"{l}\" is empty")));
                }
            }
        }
        Ok(())
    }
}

/// How few-shot examples become a decision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FewShot {
    /// Nearest centroid of the examples' embeddings.
    #[default]
    Centroid,
    /// A logistic-regression head trained on the examples.
    Logistic,
}

/// Options of a classification call (besides the labels).
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct ClassifyOptions {
    /// Few-shot method (ignored for label names).
    pub method: FewShot,
    /// Softmax temperature of cosine similarities (zero-shot and centroid).
    pub temperature: f64,
    /// Zero-shot on an encoder: the text embedded for a label, `{label}` replaced by it.
    pub label_template: String,
    /// Decoder: the prompt, `{labels}` (comma-separated) and `{text}` replaced.
    pub prompt: String,
    /// Decoder: subtract the labels' scores after a content-free text.
    pub calibrate: bool,
}

impl Default for ClassifyOptions {
    fn default() -> Self {
        Self {
            method: FewShot::Centroid,
            temperature: DEFAULT_TEMPERATURE,
            label_template: "{label}".into(),
            prompt: DEFAULT_PROMPT.into(),
            calibrate: true,
        }
    }
}

impl ClassifyOptions {
    pub fn check(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return Err(bad(format!(
                "temperature must be a positive number, not {}",
                self.temperature
            )));
        }
        if !self.label_template.contains("{label}") {
            return Err(bad("labelTemplate must contain {label}".into()));
        }
        if !self.prompt.contains("{text}") {
            return Err(bad("prompt must contain {text}".into()));
        }
        Ok(())
    }
}

/// Cosine similarities of unit vectors lie in [-1, 1]; MiniLM's for a fitting label sit
/// ~0.1–0.2 above the others, so 0.05 turns that into a clear but not certain winner.
pub const DEFAULT_TEMPERATURE: f64 = 0.05;

/// The decoder prompt: the label list, the text, and the answer's start; each label follows
/// as `" " + label`.
pub const DEFAULT_PROMPT: &str =
    "Classify the text into one of these categories: {labels}.\n\nText: {text}\nCategory:";

/// The content-free text of calibration.
pub const CONTENT_FREE: &str = "N/A";

/// One label's score.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Scored {
    pub label: String,
    pub score: f64,
}

/// Work a classification did, for the caller and the tests that count passes.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClassifyUsage {
    /// Texts the encoder ran for the inputs (one per text).
    pub texts_encoded: usize,
    /// Labels or examples the encoder ran (those not already kept).
    pub labels_encoded: usize,
    /// Tokens the model ran.
    pub prompt_tokens: usize,
    /// Forward passes the decoder ran (generative): the prompt's, then one for all the
    /// labels' continuations.
    pub decoder_passes: usize,
    pub ms: f64,
}

/// Per text, its labels best first.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Classified {
    pub results: Vec<Vec<Scored>>,
    pub usage: ClassifyUsage,
}

fn bad(msg: String) -> Error {
    Error::InvalidArgument(format!("classify: {msg}"))
}

/// Labels with their scores, best first (ties keep the labels' order).
pub fn ranked(names: &[&str], scores: &[f64]) -> Vec<Scored> {
    let mut out: Vec<Scored> = names
        .iter()
        .zip(scores)
        .map(|(l, &s)| Scored {
            label: (*l).to_string(),
            score: s,
        })
        .collect();
    out.sort_by(|a, b| b.score.total_cmp(&a.score));
    out
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum()
}

/// Scores of a unit text vector against unit label vectors: softmax(cos / temperature).
pub fn by_similarity(text: &[f32], labels: &[Vec<f32>], temperature: f64) -> Vec<f64> {
    let logits: Vec<f64> = labels.iter().map(|l| dot(text, l) / temperature).collect();
    softmax(&logits)
}

/// The normalised mean of unit vectors.
pub fn centroid(vectors: &[&[f32]]) -> Vec<f32> {
    let d = vectors.first().map_or(0, |v| v.len());
    let mut acc = vec![0f64; d];
    for v in vectors {
        for (a, &x) in acc.iter_mut().zip(v.iter()) {
            *a += f64::from(x);
        }
    }
    let n = acc.iter().map(|x| x * x).sum::<f64>().sqrt();
    acc.iter()
        .map(|x| if n > 0.0 { (x / n) as f32 } else { 0.0 })
        .collect()
}

/// A multinomial logistic regression: `softmax(W x + b)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Logistic {
    /// `(classes, dim)`, row-major.
    pub w: Vec<f64>,
    pub b: Vec<f64>,
    pub dim: usize,
}

/// Training constants (the Python twin in `tests/classify/reference.py` uses the same).
pub const LOGISTIC_STEPS: usize = 300;
pub const LOGISTIC_RATE: f64 = 2.0;
pub const LOGISTIC_L2: f64 = 1e-3;

impl Logistic {
    /// Train on `(vector, class)` pairs by full-batch gradient descent on the mean
    /// cross-entropy plus `L2/2 · |W|²` from zero weights: deterministic, and on unit vectors
    /// (curvature ≤ 1/2) a step of 2 is stable.
    pub fn train(examples: &[(&[f32], usize)], classes: usize) -> Self {
        let dim = examples.first().map_or(0, |(v, _)| v.len());
        let mut w = vec![0f64; classes * dim];
        let mut b = vec![0f64; classes];
        let n = examples.len().max(1) as f64;
        let mut gw = vec![0f64; classes * dim];
        let mut gb = vec![0f64; classes];
        for _ in 0..LOGISTIC_STEPS {
            gw.iter_mut().for_each(|g| *g = 0.0);
            gb.iter_mut().for_each(|g| *g = 0.0);
            for &(x, y) in examples {
                let p = softmax(&logits(&w, &b, dim, x));
                for c in 0..classes {
                    let d = p[c] - f64::from(u8::from(c == y));
                    gb[c] += d;
                    for (g, &xi) in gw[c * dim..(c + 1) * dim].iter_mut().zip(x) {
                        *g += d * f64::from(xi);
                    }
                }
            }
            for (wi, gi) in w.iter_mut().zip(&gw) {
                *wi -= LOGISTIC_RATE * (gi / n + LOGISTIC_L2 * *wi);
            }
            for (bi, gi) in b.iter_mut().zip(&gb) {
                *bi -= LOGISTIC_RATE * gi / n;
            }
        }
        Self { w, b, dim }
    }

    pub fn predict(&self, x: &[f32]) -> Vec<f64> {
        softmax(&logits(&self.w, &self.b, self.dim, x))
    }
}

fn logits(w: &[f64], b: &[f64], dim: usize, x: &[f32]) -> Vec<f64> {
    b.iter()
        .enumerate()
        .map(|(c, bc)| {
            bc + w[c * dim..(c + 1) * dim]
                .iter()
                .zip(x)
                .map(|(wi, &xi)| wi * f64::from(xi))
                .sum::<f64>()
        })
        .collect()
}

/// The decoder prompt for one text.
pub fn prompt(template: &str, labels: &[&str], text: &str) -> String {
    template
        .replace("{labels}", &labels.join(", "))
        .replace("{text}", text)
}

/// How many label and example embeddings a session keeps (then it starts over).
const KEPT_EMBEDDINGS: usize = 4096;

impl<B: Backend> Session<B> {
    /// Classify `texts` against `labels`: on an encoder by embeddings (zero- or few-shot), on a
    /// decoder by the labels' calibrated log-likelihoods.
    pub async fn classify(
        &mut self,
        texts: &[&str],
        labels: &Labels,
        opts: &ClassifyOptions,
    ) -> Result<Classified> {
        labels.check()?;
        opts.check()?;
        if texts.is_empty() {
            return Err(bad("no texts".into()));
        }
        let t0 = crate::clock::now_ms();
        let mut out = if *labels == Labels::Head {
            self.classify_by_head(texts).await?
        } else if self.model.cfg().family.is_encoder() {
            self.classify_by_embeddings(texts, labels, opts).await?
        } else {
            self.classify_by_likelihood(texts, labels, opts).await?
        };
        out.usage.ms = crate::clock::now_ms() - t0;
        Ok(out)
    }

    /// Scores by the model's own head: softmax over its labels (sigmoids for a multi-label
    /// head, the raw values for regression).
    async fn classify_by_head(&mut self, texts: &[&str]) -> Result<Classified> {
        let (logits, e) = self.head_logits(texts).await?;
        let head = self
            .model
            .head()
            .ok_or_else(|| Error::Backend("classify: no head".into()))?;
        let names: Vec<&str> = head.labels.iter().map(String::as_str).collect();
        let results = logits
            .iter()
            .map(|l| ranked(&names, &head.scores(l)))
            .collect();
        Ok(Classified {
            results,
            usage: ClassifyUsage {
                texts_encoded: texts.len(),
                prompt_tokens: e.prompt_tokens,
                ..Default::default()
            },
        })
    }

    /// Unit embeddings of `texts` from the kept ones, the rest encoded in one call.
    async fn kept(&mut self, texts: &[String], usage: &mut ClassifyUsage) -> Result<Vec<Vec<f32>>> {
        // The kept vectors are taken first (a clear below cannot lose them); each missing text
        // is encoded once, in one call.
        let kept: Vec<Option<Vec<f32>>> = texts
            .iter()
            .map(|t| self.kept_embeddings.get(t).cloned())
            .collect();
        let mut seen = std::collections::HashSet::new();
        let missing: Vec<&str> = texts
            .iter()
            .zip(&kept)
            .filter(|(t, v)| v.is_none() && seen.insert(t.as_str()))
            .map(|(t, _)| t.as_str())
            .collect();
        let mut fresh = std::collections::HashMap::new();
        if !missing.is_empty() {
            let e = self
                .embed(&missing, &crate::embed::EmbedOptions::default())
                .await?;
            usage.labels_encoded += missing.len();
            usage.prompt_tokens += e.usage.prompt_tokens;
            if self.kept_embeddings.len() + missing.len() > KEPT_EMBEDDINGS {
                self.kept_embeddings.clear();
            }
            for (t, v) in missing.iter().zip(e.data) {
                self.kept_embeddings.insert((*t).to_string(), v.clone());
                fresh.insert(*t, v);
            }
        }
        kept.into_iter()
            .zip(texts)
            .map(|(v, t)| {
                v.or_else(|| fresh.get(t.as_str()).cloned())
                    .ok_or_else(|| Error::Backend(format!("classify: no vector for {t:?}")))
            })
            .collect()
    }

    async fn classify_by_embeddings(
        &mut self,
        texts: &[&str],
        labels: &Labels,
        opts: &ClassifyOptions,
    ) -> Result<Classified> {
        let mut usage = ClassifyUsage::default();
        let e = self
            .embed(texts, &crate::embed::EmbedOptions::default())
            .await?;
        usage.texts_encoded = texts.len();
        usage.prompt_tokens = e.usage.prompt_tokens;
        let names = labels.names();
        let scores: Vec<Vec<f64>> = match labels {
            Labels::Names(n) => {
                let shown: Vec<String> = n
                    .iter()
                    .map(|l| opts.label_template.replace("{label}", l))
                    .collect();
                let lv = self.kept(&shown, &mut usage).await?;
                e.data
                    .iter()
                    .map(|t| by_similarity(t, &lv, opts.temperature))
                    .collect()
            }
            Labels::Head => return self.classify_by_head(texts).await,
            Labels::Examples(ex) => {
                let all: Vec<String> = ex.iter().flat_map(|(_, t)| t.iter().cloned()).collect();
                let vs = self.kept(&all, &mut usage).await?;
                let mut per_label: Vec<Vec<&[f32]>> = Vec::with_capacity(ex.len());
                let mut it = vs.iter();
                for (_, t) in ex {
                    per_label.push(it.by_ref().take(t.len()).map(Vec::as_slice).collect());
                }
                match opts.method {
                    FewShot::Centroid => {
                        let cs: Vec<Vec<f32>> = per_label.iter().map(|v| centroid(v)).collect();
                        e.data
                            .iter()
                            .map(|t| by_similarity(t, &cs, opts.temperature))
                            .collect()
                    }
                    FewShot::Logistic => {
                        let train: Vec<(&[f32], usize)> = per_label
                            .iter()
                            .enumerate()
                            .flat_map(|(c, v)| v.iter().map(move |x| (*x, c)))
                            .collect();
                        let m = Logistic::train(&train, ex.len());
                        e.data.iter().map(|t| m.predict(t)).collect()
                    }
                }
            }
        };
        Ok(Classified {
            results: scores.iter().map(|s| ranked(&names, s)).collect(),
            usage,
        })
    }

    async fn classify_by_likelihood(
        &mut self,
        texts: &[&str],
        labels: &Labels,
        opts: &ClassifyOptions,
    ) -> Result<Classified> {
        let names = labels.names();
        if matches!(labels, Labels::Examples(_)) {
            return Err(bad(
                "a decoder scores label names; few-shot examples need an encoder model".into(),
            ));
        }
        let mut usage = ClassifyUsage::default();
        let label_ids = names
            .iter()
            .map(|l| self.tok.encode_user(&format!(" {}", l.trim()), false))
            .collect::<Result<Vec<_>>>()?;
        if let Some((l, ids)) = names
            .iter()
            .zip(&label_ids)
            .find(|(_, ids)| ids.is_empty() || ids.len() > MAX_LABEL_IDS)
        {
            return Err(bad(format!(
                "labels: \"{l}\" is {} tokens; a label on a decoder is 1 to {MAX_LABEL_IDS}",
                ids.len()
            )));
        }
        let mut scored = ScoreUsage::default();
        let bias = if opts.calibrate {
            let p = self.prompt_ids(&prompt(&opts.prompt, &names, CONTENT_FREE))?;
            Some(
                self.label_log_likelihoods(&p, &label_ids, &mut scored)
                    .await?,
            )
        } else {
            None
        };
        let mut results = Vec::with_capacity(texts.len());
        for t in texts {
            let p = self.prompt_ids(&prompt(&opts.prompt, &names, t))?;
            let mut ll = self
                .label_log_likelihoods(&p, &label_ids, &mut scored)
                .await?;
            if let Some(b) = &bias {
                ll.iter_mut().zip(b).for_each(|(x, b)| *x -= b);
            }
            results.push(ranked(&names, &softmax(&ll)));
        }
        usage.prompt_tokens += scored.prompt_tokens;
        usage.decoder_passes += scored.decoder_passes;
        Ok(Classified { results, usage })
    }

    fn prompt_ids(&self, text: &str) -> Result<Vec<u32>> {
        self.tok.encode_user(text, true)
    }
}

/// Labels from JSON: an array of names (zero-shot) or an object label → example texts
/// (few-shot), with typed errors for anything else.
pub fn labels_from_json(v: &serde_json::Value) -> Result<Labels> {
    use serde_json::Value;
    if v.is_null() {
        return Ok(Labels::Head);
    }
    let text = |x: &Value, what: &str| -> Result<String> {
        x.as_str()
            .map(str::to_string)
            .ok_or_else(|| bad(format!("{what} must be a string, not {x}")))
    };
    match v {
        Value::Array(a) => Ok(Labels::Names(
            a.iter()
                .map(|x| text(x, "a label"))
                .collect::<Result<_>>()?,
        )),
        Value::Object(o) => Ok(Labels::Examples(
            o.iter()
                .map(|(l, ex)| {
                    let ex = match ex {
                        Value::Array(a) => a
                            .iter()
                            .map(|x| text(x, &format!("an example of \"{l}\"")))
                            .collect::<Result<Vec<_>>>()?,
                        Value::String(s) => vec![s.clone()],
                        other => {
                            return Err(bad(format!(
                                "the examples of \"{l}\" must be an array of strings, not {other}"
                            )))
                        }
                    };
                    Ok((l.clone(), ex))
                })
                .collect::<Result<_>>()?,
        )),
        other => Err(bad(format!(
            "labels are an array of names, an object label → example texts, or null (a classification model's own labels), not {other}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_sums_to_one_and_ranks() {
        let p = softmax(&[1.0, 3.0, 2.0]);
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        let r = ranked(&["a", "b", "c"], &p);
        assert_eq!(
            r.iter().map(|s| s.label.as_str()).collect::<Vec<_>>(),
            ["b", "c", "a"]
        );
    }

    #[test]
    fn labels_are_checked() {
        let n = |v: &[&str]| Labels::Names(v.iter().map(|s| s.to_string()).collect());
        assert!(n(&[])
            .check()
            .unwrap_err()
            .to_string()
            .contains("at least one"));
        assert!(n(&["a", "a"])
            .check()
            .unwrap_err()
            .to_string()
            .contains("twice"));
        assert!(n(&["a", " "])
            .check()
            .unwrap_err()
            .to_string()
            .contains("empty"));
        let many: Vec<String> = (0..1000).map(|i| format!("l{i}")).collect();
        let e = Labels::Names(many).check().unwrap_err().to_string();
        assert!(e.contains("1000 labels"), "{e}");
        let ex = Labels::Examples(vec![("a".into(), vec![])]);
        assert!(ex.check().unwrap_err().to_string().contains("no example"));
        assert!(n(&["a", "b"]).check().is_ok());
    }

    #[test]
    fn logistic_separates_two_clusters() {
        let a = [1.0f32, 0.0];
        let b = [0.0f32, 1.0];
        let m = Logistic::train(&[(&a, 0), (&b, 1)], 2);
        assert!(m.predict(&a)[0] > 0.9);
        assert!(m.predict(&b)[1] > 0.9);
    }
}
