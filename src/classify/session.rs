//! [`Session::classify`]: the labels scored on the session's model, by its head, by
//! embeddings (zero- or few-shot, label embeddings kept) or by the labels' calibrated
//! log-likelihoods on a decoder.

use super::call::{
    bad, prompt, Classified, ClassifyOptions, ClassifyUsage, FewShot, Labels, CONTENT_FREE,
};
use super::math::{by_similarity, centroid, ranked, Logistic};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::logits::softmax;
use crate::score::{ScoreUsage, MAX_LABEL_IDS};
use crate::session::Session;

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
