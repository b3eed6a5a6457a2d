//! `kerze embed` (sentence embeddings) and `kerze classify` (labels and scores per text),
//! one input per `--text` or per line of stdin.

use super::load::{load, ModelArgs};
use crate::{Error, Result};
use std::io::Read;

#[derive(clap::Args, Debug)]
pub(super) struct EmbedArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// A text to embed (repeat for more); without it, one text per line of stdin
    #[arg(long)]
    text: Vec<String>,
    /// Leave the vectors unnormalised (default: unit length)
    #[arg(long)]
    no_normalize: bool,
    /// A text longer than the model's max_seq_length: truncate (as sentence-transformers),
    /// error, or chunk (average of windows)
    #[arg(long, default_value = "truncate", value_parser = ["truncate", "error", "chunk"])]
    overflow: String,
    /// {"data":[{"index","embedding"}],"model","usage"} (the OpenAI shape)
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
pub(super) struct ClassifyArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Label names or descriptions, comma-separated (zero-shot; a decoder scores these).
    /// Without labels, a sequence-classification model scores its own (its head)
    #[arg(long, value_delimiter = ',')]
    labels: Vec<String>,
    /// One more label that may hold a comma (repeat)
    #[arg(long)]
    label: Vec<String>,
    /// Few-shot instead: a JSON file {"label": ["example text", …], …} (encoders)
    #[arg(long, conflicts_with_all = ["labels", "label"])]
    examples: Option<std::path::PathBuf>,
    /// Few-shot: nearest centroid or a logistic-regression head on the examples
    #[arg(long, default_value = "centroid", value_parser = ["centroid", "logistic"])]
    method: String,
    /// Softmax temperature of the cosine similarities (zero-shot, centroid)
    #[arg(long, default_value_t = crate::classify::DEFAULT_TEMPERATURE)]
    temperature: f64,
    /// Decoder: the prompt, {labels} and {text} replaced
    #[arg(long)]
    prompt: Option<String>,
    /// Decoder: raw log-likelihoods, without the content-free calibration
    #[arg(long)]
    no_calibrate: bool,
    /// A text to classify (repeat for more); without it, one text per line of stdin
    #[arg(long)]
    text: Vec<String>,
    /// {"results":[[{"label","score"},…]],"model","usage"}
    #[arg(long)]
    json: bool,
}

pub(super) fn cmd_classify(a: &ClassifyArgs) -> Result<()> {
    use crate::classify::{ClassifyOptions, FewShot, Labels};
    let labels = match &a.examples {
        Some(path) => {
            let raw = std::fs::read_to_string(path)?;
            let v: serde_json::Value = serde_json::from_str(&raw).map_err(|e| {
                Error::InvalidArgument(format!("--examples {}: {e}", path.display()))
            })?;
            crate::classify::labels_from_json(&v)?
        }
        // No labels: a classification model's own (its head).
        None if a.labels.is_empty() && a.label.is_empty() => Labels::Head,
        None => Labels::Names(
            a.labels
                .iter()
                .chain(&a.label)
                .map(|l| l.trim().to_string())
                .collect(),
        ),
    };
    let texts = texts_or_stdin(&a.text)?;
    let mut opts = ClassifyOptions {
        method: if a.method == "logistic" {
            FewShot::Logistic
        } else {
            FewShot::Centroid
        },
        temperature: a.temperature,
        calibrate: !a.no_calibrate,
        ..Default::default()
    };
    if let Some(p) = &a.prompt {
        opts.prompt = p.clone();
    }
    let (mut engine, info) = load(&a.model)?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let c = pollster::block_on(engine.classify(&refs, &labels, &opts))?;
    if a.json {
        let u = &c.usage;
        let v = serde_json::json!({
            "results": c.results,
            "model": info.model,
            "usage": {
                "prompt_tokens": u.prompt_tokens,
                "texts_encoded": u.texts_encoded,
                "labels_encoded": u.labels_encoded,
                "decoder_passes": u.decoder_passes,
                "ms": u.ms,
            },
        });
        println!("{v}");
    } else {
        for (t, r) in texts.iter().zip(&c.results) {
            let top: Vec<String> = r
                .iter()
                .take(3)
                .map(|s| format!("{} {:.3}", s.label, s.score))
                .collect();
            println!("{}  {t}", top.join(" · "));
        }
        eprintln!(
            "[{} texts, {} label texts encoded, {} tokens, {:.1} ms]",
            texts.len(),
            c.usage.labels_encoded,
            c.usage.prompt_tokens,
            c.usage.ms
        );
    }
    Ok(())
}

/// The `--text` values, or else one text per line of stdin.
fn texts_or_stdin(given: &[String]) -> Result<Vec<String>> {
    if !given.is_empty() {
        return Ok(given.to_vec());
    }
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s)?;
    Ok(s.lines().map(str::to_string).collect())
}

pub(super) fn cmd_embed(a: &EmbedArgs) -> Result<()> {
    use crate::embed::{EmbedOptions, Overflow};
    let texts = texts_or_stdin(&a.text)?;
    let (mut engine, info) = load(&a.model)?;
    let opts = EmbedOptions {
        normalize: !a.no_normalize,
        overflow: match a.overflow.as_str() {
            "error" => Overflow::Error,
            "chunk" => Overflow::Chunk,
            _ => Overflow::Truncate,
        },
    };
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let e = pollster::block_on(engine.embed(&refs, &opts))?;
    if a.json {
        let data: Vec<serde_json::Value> = e
            .data
            .iter()
            .enumerate()
            .map(|(i, v)| serde_json::json!({ "object": "embedding", "index": i, "embedding": v }))
            .collect();
        let v = serde_json::json!({
            "object": "list",
            "data": data,
            "model": info.model,
            "usage": {
                "prompt_tokens": e.usage.prompt_tokens,
                "total_tokens": e.usage.prompt_tokens,
                "truncated": e.usage.truncated,
                "truncated_tokens": e.usage.truncated_tokens,
            },
        });
        println!("{v}");
    } else {
        for (t, v) in texts.iter().zip(&e.data) {
            let head: Vec<String> = v.iter().take(4).map(|x| format!("{x:.4}")).collect();
            println!("{} dims [{} …]  {t}", v.len(), head.join(", "));
        }
        eprintln!(
            "[{} texts, {} tokens ({} truncated), {:.1} ms]",
            texts.len(),
            e.usage.prompt_tokens,
            e.usage.truncated,
            e.usage.encode_ms
        );
    }
    Ok(())
}
