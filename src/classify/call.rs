//! A classification call's inputs and outputs: the labels ([`Labels`], also from JSON), the
//! options and their defaults, the decoder prompt, and the scored results.

use crate::config::MAX_LABELS;
use crate::error::{Error, Result};

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

pub(super) fn bad(msg: String) -> Error {
    Error::InvalidArgument(format!("classify: {msg}"))
}

/// The decoder prompt for one text.
pub fn prompt(template: &str, labels: &[&str], text: &str) -> String {
    template
        .replace("{labels}", &labels.join(", "))
        .replace("{text}", text)
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
}
