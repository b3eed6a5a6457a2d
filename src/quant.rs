//! Storage formats of weights, apart from any backend: how a file's bytes hold a matrix.
//! Today the int8 rows of ONNX exports (a scale and a zero point per row); the file readers
//! (`onnx/`) and the backends both read them through here.

use crate::error::{Error, Result};
use crate::gguf::{ByteSource, GgmlType, TensorInfo};

/// Int8 rows (`scale.len()` of them) with a scale and zero per row, as f32:
/// `(v − zero) · scale`, `DequantizeLinear`'s value (the difference is an exact small integer).
pub fn dequantize_int8_rows(values: &[i8], scale: &[f32], zero: &[f32]) -> Vec<f32> {
    let cols = values.len().checked_div(scale.len()).unwrap_or(0);
    let mut out = Vec::with_capacity(values.len());
    for (row, (&s, &z)) in values.chunks_exact(cols.max(1)).zip(scale.iter().zip(zero)) {
        out.extend(row.iter().map(|&v| (f32::from(v) - z) * s));
    }
    out
}

/// The values of an I8 matrix `(rows, cols)` with a scale and zero per row, checked.
pub fn int8_rows(
    info: &TensorInfo,
    scale: &[f32],
    zero: &[f32],
    src: &dyn ByteSource,
) -> Result<Vec<i8>> {
    let (rows, cols) = info.rows_cols();
    if info.ty != GgmlType::I8
        || info.dims.len() != 2
        || scale.len() != rows
        || zero.len() != rows
        || info.n_bytes != rows as u64 * cols as u64
    {
        return Err(Error::Config(format!(
            "tensor {}: an int8 matrix {:?} ({}) with {} scales and {} zeros",
            info.name,
            info.dims,
            info.ty,
            scale.len(),
            zero.len()
        )));
    }
    let mut buf = vec![0u8; rows * cols];
    src.read_at(info.offset, &mut buf)?;
    Ok(buf.into_iter().map(|b| b as i8).collect())
}
