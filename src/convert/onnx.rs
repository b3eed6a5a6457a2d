//! A BERT-family ONNX export (`model.onnx`, its `tokenizer.json` and `config.json`) → GGUF:
//! from bytes (the browser too) or, natively, from the file and its companions.

use super::error::bad;
#[cfg(not(target_arch = "wasm32"))]
use super::folder::read_opt;
use super::hf_config::read_config;
use super::writer::{ggml_type, header, put, put_int8, OutType};
use crate::error::Result;
use crate::gguf::GgmlType;
use serde_json::Value as Json;
#[cfg(not(target_arch = "wasm32"))]
use std::path::{Path, PathBuf};

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
