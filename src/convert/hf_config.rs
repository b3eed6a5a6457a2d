//! What a Hugging Face encoder's `config.json` says, with sentence-transformers' pooling and
//! length beside it, checked for what the loader would refuse.

use super::error::bad;
use crate::error::{Error, Result};
use serde_json::Value as Json;

/// llama.cpp's pooling types.
pub const POOLING_MEAN: u32 = 1;
pub const POOLING_CLS: u32 = 2;
pub const POOLING_LAST: u32 = 3;

/// What `config.json` (and sentence-transformers' files beside it) say about an encoder.
pub struct HfConfig {
    /// DistilBERT: the same block under other names, no token types.
    pub distil: bool,
    pub n_embd: u32,
    pub n_layer: u32,
    pub n_head: u32,
    pub n_ff: u32,
    pub n_pos: u32,
    pub n_types: u32,
    pub n_vocab: Option<u32>,
    pub eps: f32,
    pub pooling: Option<u32>,
    pub max_seq: Option<u32>,
    pub name: String,
    /// A sequence-classification model's labels in id order (`id2label`), or empty.
    pub labels: Vec<String>,
    /// `problem_type`: `single_label_classification` (softmax, the default),
    /// `multi_label_classification` (sigmoid per label) or `regression`.
    pub problem_type: String,
    /// `architectures` names a `…ForSequenceClassification`.
    pub classifier: bool,
}

/// Read `config.json` (`cfg`), `1_Pooling/config.json` and `sentence_bert_config.json`.
pub fn read_config(cfg: &Json, pooling: Option<&Json>, sbert: Option<&Json>) -> Result<HfConfig> {
    let distil = match cfg["model_type"].as_str() {
        Some("bert") => false,
        Some("distilbert") => true,
        other => return Err(Error::UnsupportedArch {
            arch: crate::error::excerpt(other.unwrap_or("(none)"), 64),
            supported:
                "BERT-family encoders (config.json model_type bert or distilbert) in kerze convert",
        }),
    };
    let hp = |k: &str| -> Result<u32> {
        cfg[k]
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| bad(format!("config.json: {k} is missing")))
    };
    let key = |bert: &'static str, distilbert: &'static str| if distil { distilbert } else { bert };
    let (n_embd, n_layer, n_head, n_ff, n_pos) = (
        hp(key("hidden_size", "dim"))?,
        hp(key("num_hidden_layers", "n_layers"))?,
        hp(key("num_attention_heads", "n_heads"))?,
        hp(key("intermediate_size", "hidden_dim"))?,
        hp("max_position_embeddings")?,
    );
    // What the loader would refuse in the file (config.rs), refused here, before a file is
    // written that no engine loads.
    if n_head == 0 || n_embd % n_head != 0 {
        return Err(bad(format!(
            "config.json: {} {n_embd} is not a multiple of {} {n_head}",
            key("hidden_size", "dim"),
            key("num_attention_heads", "n_heads")
        )));
    }
    let eps = cfg["layer_norm_eps"].as_f64().unwrap_or(1e-12) as f32;
    if !(eps > 0.0 && eps < 1.0) {
        return Err(bad(format!(
            "config.json: layer_norm_eps {eps} is not between 0 and 1"
        )));
    }
    if distil && cfg["sinusoidal_pos_embds"] == true {
        return Err(bad(
            "config.json: sinusoidal position embeddings are not supported",
        ));
    }
    match cfg[key("hidden_act", "activation")]
        .as_str()
        .unwrap_or("gelu")
    {
        "gelu" => {}
        other => return Err(bad(format!("config.json: hidden_act {other} (only gelu)"))),
    }
    if cfg["position_embedding_type"]
        .as_str()
        .unwrap_or("absolute")
        != "absolute"
    {
        return Err(bad("config.json: only absolute position embeddings"));
    }
    let pooling = match pooling {
        None => None,
        Some(p) if p["pooling_mode_mean_tokens"] == true => Some(POOLING_MEAN),
        Some(p) if p["pooling_mode_cls_token"] == true => Some(POOLING_CLS),
        Some(p) if p["pooling_mode_lasttoken"] == true => Some(POOLING_LAST),
        Some(p) => {
            return Err(bad(format!(
                "1_Pooling/config.json: no supported pooling mode in {p}"
            )))
        }
    };
    let max_seq = sbert
        .and_then(|s| s["max_seq_length"].as_u64())
        .map(|m| (m.min(u64::from(u32::MAX)) as u32).min(n_pos));
    let name = cfg["_name_or_path"]
        .as_str()
        .filter(|s| !s.is_empty())
        .unwrap_or("bert")
        .to_string();
    let classifier = cfg["architectures"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|a| {
            a.as_str()
                .is_some_and(|a| a.ends_with("ForSequenceClassification"))
        });
    let mut labels = Vec::new();
    if let Some(m) = cfg["id2label"].as_object() {
        let mut by_id: Vec<(u64, String)> = Vec::with_capacity(m.len());
        for (k, v) in m {
            let id = k
                .parse::<u64>()
                .map_err(|_| bad(format!("config.json: id2label key {k:?} is not a number")))?;
            let l = v
                .as_str()
                .ok_or_else(|| bad(format!("config.json: id2label[{k}] is not a string")))?;
            by_id.push((id, l.to_string()));
        }
        by_id.sort();
        if by_id.iter().enumerate().any(|(i, (id, _))| *id != i as u64) {
            return Err(bad("config.json: id2label's ids are not 0, 1, 2, …"));
        }
        labels = by_id.into_iter().map(|(_, l)| l).collect();
    }
    let problem_type = cfg["problem_type"]
        .as_str()
        .unwrap_or("single_label_classification")
        .to_string();
    if !matches!(
        problem_type.as_str(),
        "single_label_classification" | "multi_label_classification" | "regression"
    ) {
        return Err(bad(format!("config.json: problem_type {problem_type}")));
    }
    Ok(HfConfig {
        distil,
        n_embd,
        n_layer,
        n_head,
        n_ff,
        n_pos,
        n_types: if distil {
            1
        } else {
            hp("type_vocab_size").unwrap_or(2)
        },
        n_vocab: hp("vocab_size").ok(),
        eps,
        pooling,
        max_seq,
        name,
        labels,
        problem_type,
        classifier,
    })
}
