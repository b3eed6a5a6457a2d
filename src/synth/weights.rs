//! Random weights for the synthetic models: normal values quantized by candle into the
//! type asked for, and norms near 1.

use crate::error::{Error, Result};
use crate::gguf::GgmlType;
use crate::rng::Rng;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

pub(super) fn quantize(
    rng: &mut Rng,
    rows: usize,
    cols: usize,
    std: f32,
    ty: GgmlType,
) -> Result<Vec<u8>> {
    encode(
        (0..rows * cols).map(|_| rng.normal() * std).collect(),
        rows,
        cols,
        ty,
    )
}

/// `data` (`rows` of `cols`) as tensor data of type `ty`.
pub(super) fn encode(data: Vec<f32>, rows: usize, cols: usize, ty: GgmlType) -> Result<Vec<u8>> {
    if ty == GgmlType::F32 {
        return Ok(data.iter().flat_map(|x| x.to_le_bytes()).collect());
    }
    let dtype = match ty {
        GgmlType::Q8_0 => GgmlDType::Q8_0,
        GgmlType::Q5_0 => GgmlDType::Q5_0,
        GgmlType::Q4_K => GgmlDType::Q4K,
        GgmlType::Q6_K => GgmlDType::Q6K,
        GgmlType::F16 => GgmlDType::F16,
        GgmlType::Q4_0 => GgmlDType::Q4_0,
        GgmlType::Q4_1 => GgmlDType::Q4_1,
        GgmlType::Q5_1 => GgmlDType::Q5_1,
        GgmlType::Q2_K => GgmlDType::Q2K,
        GgmlType::Q3_K => GgmlDType::Q3K,
        GgmlType::Q5_K => GgmlDType::Q5K,
        GgmlType::BF16 => {
            // Round to nearest even, as torch and the `gguf` package do.
            return Ok(data
                .iter()
                .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                .collect());
        }
        other => {
            return Err(Error::InvalidArgument(format!(
                "synth: no quantizer for {other}"
            )))
        }
    };
    let t = Tensor::from_vec(data, (rows, cols), &Device::Cpu)?;
    Ok(QTensor::quantize(&t, dtype)?.data()?.into_owned())
}

pub(super) fn norm(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|_| (1.0 + 0.1 * rng.normal()).to_le_bytes())
        .collect()
}
