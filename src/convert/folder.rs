//! A Hugging Face folder (`config.json`, `model.safetensors`, `tokenizer.json`) → GGUF:
//! its safetensors read with every offset checked, its tensors renamed to llama.cpp's.

use super::error::bad;
use super::hf_config::read_config;
use super::writer::{ggml_type, header, put, OutType};
use crate::error::Result;
use serde_json::Value as Json;
use std::collections::BTreeMap;
use std::path::Path;

/// One tensor of a safetensors file.
struct StTensor<'a> {
    dtype: String,
    shape: Vec<usize>,
    data: &'a [u8],
}

/// The tensors of a safetensors file (8-byte header length, JSON header, data), every
/// offset checked against the file.
fn read_safetensors(bytes: &[u8]) -> Result<BTreeMap<String, StTensor<'_>>> {
    let len = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
        .ok_or_else(|| bad("safetensors: shorter than its header length"))?;
    let header_end = usize::try_from(len)
        .ok()
        .and_then(|l| l.checked_add(8))
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| bad("safetensors: the header passes the end of the file"))?;
    let header: serde_json::Map<String, Json> = serde_json::from_slice(&bytes[8..header_end])
        .map_err(|e| bad(format!("safetensors header: {e}")))?;
    let data = &bytes[header_end..];
    let mut out = BTreeMap::new();
    for (name, t) in header {
        if name == "__metadata__" {
            continue;
        }
        let dtype = t["dtype"].as_str().unwrap_or("").to_string();
        let usizes = |v: &Json| -> Vec<usize> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|d| d.as_u64().map(|d| d as usize))
                        .collect()
                })
                .unwrap_or_default()
        };
        let shape = usizes(&t["shape"]);
        let offs = usizes(&t["data_offsets"]);
        let (start, end) = match offs[..] {
            [s, e] if s <= e && e <= data.len() => (s, e),
            _ => return Err(bad(format!("safetensors: {name}: bad data_offsets"))),
        };
        let width = match dtype.as_str() {
            "F64" | "I64" | "U64" => 8,
            "F32" | "I32" | "U32" => 4,
            "F16" | "BF16" | "I16" | "U16" => 2,
            "I8" | "U8" | "BOOL" => 1,
            other => return Err(bad(format!("safetensors: {name}: unknown dtype {other}"))),
        };
        let count = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if count.and_then(|c| c.checked_mul(width)) != Some(end - start) {
            return Err(bad(format!(
                "safetensors: {name}: shape {shape:?} does not match its bytes"
            )));
        }
        out.insert(
            name,
            StTensor {
                dtype,
                shape,
                data: &data[start..end],
            },
        );
    }
    Ok(out)
}

impl StTensor<'_> {
    /// The values as f32 (weights are F32, F16 or BF16; others are not weights).
    fn to_f32(&self, name: &str) -> Result<Vec<f32>> {
        Ok(match self.dtype.as_str() {
            "F32" => self
                .data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            "F16" => self
                .data
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            "BF16" => self
                .data
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => return Err(bad(format!("{name}: dtype {other} is not a weight type"))),
        })
    }
}

/// A Hugging Face folder's file (or `None` when absent).
pub(super) fn read_opt(dir: &Path, name: &str) -> Result<Option<Vec<u8>>> {
    match std::fs::read(dir.join(name)) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn read_json(dir: &Path, name: &str) -> Result<Option<Json>> {
    read_opt(dir, name)?
        .map(|b| serde_json::from_slice(&b).map_err(|e| bad(format!("{name}: {e}"))))
        .transpose()
}

/// The GGUF bytes of the BERT-family model in Hugging Face folder `dir`.
pub fn convert_dir(dir: &Path, ty: OutType) -> Result<Vec<u8>> {
    if ty == OutType::I8 {
        return Err(bad(
            "--type i8 keeps an int8 ONNX export's matrices; these weights are float (f32, f16 or q8_0)",
        ));
    }
    let cfg = read_json(dir, "config.json")?
        .ok_or_else(|| bad(format!("no config.json in {}", dir.display())))?;
    // sentence-transformers' pooling and length, when the folder is one of its models.
    let c = read_config(
        &cfg,
        read_json(dir, "1_Pooling/config.json")?.as_ref(),
        read_json(dir, "sentence_bert_config.json")?.as_ref(),
    )?;
    let distil = c.distil;
    let tokenizer = read_opt(dir, "tokenizer.json")?
        .ok_or_else(|| bad(format!("no tokenizer.json in {}", dir.display())))?;
    let st_bytes = std::fs::read(dir.join("model.safetensors"))
        .map_err(|e| bad(format!("model.safetensors: {e}")))?;
    let st = read_safetensors(&st_bytes)?;
    // Names without the `bert.` prefix some checkpoints carry, `gamma`/`beta` as weight/bias.
    let mut by_name: BTreeMap<String, &StTensor> = BTreeMap::new();
    for (k, t) in &st {
        let k = k
            .strip_prefix("bert.")
            .or_else(|| k.strip_prefix("distilbert."))
            .unwrap_or(k);
        let k = if let Some(s) = k.strip_suffix(".gamma") {
            format!("{s}.weight")
        } else if let Some(s) = k.strip_suffix(".beta") {
            format!("{s}.bias")
        } else {
            k.to_string()
        };
        by_name.insert(k, t);
    }
    // A sequence-classification head: BERT's pooler → tanh → classifier, DistilBERT's
    // pre_classifier → relu → classifier.
    let head_plan: Vec<(&str, &str)> = if !by_name.contains_key("classifier.weight") {
        Vec::new()
    } else if by_name.contains_key("pooler.dense.weight") && !distil {
        vec![("pooler.dense", "cls"), ("classifier", "cls.output")]
    } else if by_name.contains_key("pre_classifier.weight") {
        vec![("pre_classifier", "cls"), ("classifier", "cls.output")]
    } else {
        vec![("classifier", "cls.output")]
    };
    let head = by_name.get("classifier.weight").map(|t| {
        let act = match head_plan.len() {
            1 => "none",
            _ if distil => "relu",
            _ => "tanh",
        };
        (act, t.shape.first().copied().unwrap_or(0))
    });
    let mut w = header(&c, &tokenizer, c.eps, head)?;
    let matrix = ggml_type(ty);
    // (Hugging Face name, GGUF name, whether it is a matrix that takes `ty`)
    let mut plan: Vec<(String, String, bool)> = vec![
        (
            "embeddings.word_embeddings.weight".into(),
            "token_embd.weight".into(),
            true,
        ),
        (
            // Kept F32, as llama.cpp's converter keeps it: the same bytes as its file.
            "embeddings.position_embeddings.weight".into(),
            "position_embd.weight".into(),
            false,
        ),
        (
            "embeddings.LayerNorm.weight".into(),
            "token_embd_norm.weight".into(),
            false,
        ),
        (
            "embeddings.LayerNorm.bias".into(),
            "token_embd_norm.bias".into(),
            false,
        ),
    ];
    if !distil {
        plan.insert(
            1,
            (
                "embeddings.token_type_embeddings.weight".into(),
                "token_types.weight".into(),
                false,
            ),
        );
    }
    for i in 0..c.n_layer {
        let hf = |s: &str| {
            if distil {
                format!("transformer.layer.{i}.{s}")
            } else {
                format!("encoder.layer.{i}.{s}")
            }
        };
        let gg = |s: &str| format!("blk.{i}.{s}");
        let names: [(&str, &str, bool); 8] = if distil {
            [
                ("attention.q_lin", "attn_q", true),
                ("attention.k_lin", "attn_k", true),
                ("attention.v_lin", "attn_v", true),
                ("attention.out_lin", "attn_output", true),
                ("sa_layer_norm", "attn_output_norm", false),
                ("ffn.lin1", "ffn_up", true),
                ("ffn.lin2", "ffn_down", true),
                ("output_layer_norm", "layer_output_norm", false),
            ]
        } else {
            [
                ("attention.self.query", "attn_q", true),
                ("attention.self.key", "attn_k", true),
                ("attention.self.value", "attn_v", true),
                ("attention.output.dense", "attn_output", true),
                ("attention.output.LayerNorm", "attn_output_norm", false),
                ("intermediate.dense", "ffn_up", true),
                ("output.dense", "ffn_down", true),
                ("output.LayerNorm", "layer_output_norm", false),
            ]
        };
        for (h, g, m) in names {
            plan.push((hf(&format!("{h}.weight")), gg(&format!("{g}.weight")), m));
            plan.push((hf(&format!("{h}.bias")), gg(&format!("{g}.bias")), false));
        }
    }
    for (hf, gg) in head_plan {
        plan.push((format!("{hf}.weight"), format!("{gg}.weight"), false));
        plan.push((format!("{hf}.bias"), format!("{gg}.bias"), false));
    }
    for (hf, gg, is_matrix) in plan {
        let t = by_name
            .get(&hf)
            .ok_or_else(|| bad(format!("model.safetensors has no {hf}")))?;
        let values = t.to_f32(&hf)?;
        if t.shape.len() > 2 || t.shape.is_empty() {
            return Err(bad(format!("{hf}: shape {:?}", t.shape)));
        }
        put(&mut w, &gg, &t.shape, &values, is_matrix, matrix)?;
    }
    Ok(w.to_bytes())
}
