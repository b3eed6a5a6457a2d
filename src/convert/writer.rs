//! The GGUF being written: the matrices' output type, each tensor encoded in its type, and
//! the encoder's metadata header (llama.cpp's `bert` names, the head, the tokenizer).

use super::error::bad;
use super::hf_config::{HfConfig, POOLING_CLS, POOLING_MEAN};
use super::vocab::tokenizer_metadata;
use crate::config::{KEY_HEAD_ACTIVATION, KEY_LABELS, KEY_PROBLEM_TYPE};
use crate::error::Result;
use crate::gguf::{Array, GgmlType, Value, Writer};

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

/// A GGUF writer with an encoder's metadata; `head`: the classification head's activation
/// between pooler and classifier (`"tanh"`, `"relu"`, or `"none"` without a pooler) when
/// the model has one, with `n_labels` outputs.
pub(super) fn header(
    c: &HfConfig,
    tokenizer: &[u8],
    eps: f32,
    head: Option<(&str, usize)>,
) -> Result<Writer> {
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
pub(super) fn put(
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

pub(super) fn ggml_type(ty: OutType) -> GgmlType {
    match ty {
        OutType::F32 => GgmlType::F32,
        OutType::F16 => GgmlType::F16,
        OutType::Q8_0 => GgmlType::Q8_0,
        OutType::I8 => GgmlType::I8,
    }
}

/// An int8 matrix (`shape`: rows, cols) as I8 with its `.scale` and `.zero` rows.
pub(super) fn put_int8(
    w: &mut Writer,
    name: &str,
    shape: &[usize],
    q: &crate::onnx::Int8Rows,
) -> Result<()> {
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
