//! The CPU backend: quantized matmuls and embeddings through candle-core (SIMD natively and
//! with `+simd128` in wasm), the small element-wise ops and attention in plain Rust.
//!
//! Weights are copied once from the file into candle's block storage. Q5_0 is converted to
//! Q8_0 at load: exact (same f16 scale, values q − 16 as i8), and candle has no SIMD kernel
//! for Q5_0 in wasm, while Q8_0 has one everywhere.

mod attention;
mod ops;

use crate::backend::{AttnParams, Backend};
use crate::error::{Error, Result};
use crate::gguf::{ByteSource, GgmlType, TensorInfo};
use candle_core::quantized::k_quants::{
    BlockQ4K, BlockQ4_0, BlockQ6K, BlockQ8_0, GgmlType as Block,
};
use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor, QuantizedType};
use candle_core::{Device, Module, Tensor};

use std::sync::Arc;

pub use attention::KvCache;

/// Tensor types the CPU backend runs.
pub const SUPPORTED_TYPES: &str = "F32, F16, Q4_0, Q5_0, Q8_0, Q4_K, Q6_K";

/// Activations: `n_tok` rows of `width` f32.
#[derive(Clone, Debug, PartialEq)]
pub struct Act {
    pub data: Vec<f32>,
    pub width: usize,
}

impl Act {
    pub fn n_tok(&self) -> usize {
        self.data.len().checked_div(self.width).unwrap_or(0)
    }
}

/// A weight on the CPU.
pub enum CpuWeight {
    /// A vector (norm weights), f32.
    Vector(Vec<f32>),
    /// A matrix `(rows, cols)`, quantized (or f32/f16) in candle's storage.
    Matrix {
        q: Arc<QTensor>,
        mm: QMatMul,
        rows: usize,
        cols: usize,
    },
}

/// The CPU backend.
#[derive(Default)]
pub struct CpuBackend;

impl CpuBackend {
    pub fn new() -> Self {
        Self
    }
}

fn ggml_dtype(info: &TensorInfo) -> Result<GgmlDType> {
    Ok(match info.ty {
        GgmlType::F32 => GgmlDType::F32,
        GgmlType::F16 => GgmlDType::F16,
        GgmlType::Q4_0 => GgmlDType::Q4_0,
        GgmlType::Q5_0 | GgmlType::Q8_0 => GgmlDType::Q8_0,
        GgmlType::Q4_K => GgmlDType::Q4K,
        GgmlType::Q6_K => GgmlDType::Q6K,
        other => {
            return Err(Error::UnsupportedTensorType {
                tensor: info.name.clone(),
                ty: other.name().to_string(),
                supported: SUPPORTED_TYPES,
            })
        }
    })
}

/// A zeroed vector of candle blocks covering exactly `n_bytes` of file data.
fn zeroed_blocks<T: Block>(n_bytes: usize) -> Result<Vec<T>> {
    let size = std::mem::size_of::<T>();
    if !n_bytes.is_multiple_of(size) {
        return Err(Error::Backend(format!(
            "{n_bytes} bytes are not whole {}-byte blocks",
            size
        )));
    }
    Ok(vec![T::zeros(); n_bytes / size])
}

fn blocks_as_bytes_mut<T: Block>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: candle's block types are `repr(C)` structs of f16/f32 scales and integer
    // arrays (and f32/f16 themselves): every byte pattern is a valid value, and the slice
    // covers exactly the vector's initialised memory.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// Read a tensor's bytes straight into candle's block storage: the only copy of the weights
/// (a second full-size buffer would double the peak memory in a browser tab).
fn read_blocks<T: Block>(src: &dyn ByteSource, offset: u64, n_bytes: usize) -> Result<Vec<T>> {
    let mut v = zeroed_blocks::<T>(n_bytes)?;
    src.read_at(offset, blocks_as_bytes_mut(&mut v))?;
    Ok(v)
}

/// Read `n` bytes at `offset` into an 8-byte-aligned buffer (candle views it as blocks with
/// f16 and f32 fields).
fn read_aligned(src: &dyn ByteSource, offset: u64, n: usize) -> Result<Vec<u64>> {
    let mut buf = vec![0u64; n.div_ceil(8)];
    src.read_at(offset, &mut bytemuck_bytes_mut(&mut buf)[..n])?;
    Ok(buf)
}

fn bytemuck_bytes_mut(v: &mut [u64]) -> &mut [u8] {
    // SAFETY: u8 has no alignment or validity requirements and the length covers exactly the
    // same memory as the u64 slice.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn bytes_of(v: &[u64], n: usize) -> &[u8] {
    // SAFETY: as above, read-only; n ≤ 8 · v.len() by construction in read_aligned.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), n) }
}

/// Q5_0 blocks (f16 d, u32 high bits, 16 bytes of low nibbles) → Q8_0 blocks (f16 d,
/// 32 × i8). Exact: element j is `(low | high << 4) - 16` times the same d.
pub fn q5_0_to_q8_0(src: &[u8], out: &mut [u8]) {
    for (b, o) in src.chunks_exact(22).zip(out.chunks_exact_mut(34)) {
        o[..2].copy_from_slice(&b[..2]);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let qs = &b[6..22];
        for j in 0..16 {
            let lo = (qs[j] & 0x0F) | ((((qh >> j) << 4) & 0x10) as u8);
            let hi = (qs[j] >> 4) | (((qh >> (j + 12)) & 0x10) as u8);
            o[2 + j] = (lo as i8 - 16) as u8;
            o[2 + 16 + j] = (hi as i8 - 16) as u8;
        }
    }
}

impl Backend for CpuBackend {
    type Tensor = Act;
    type Weight = CpuWeight;
    type Kv = KvCache;

    fn load_weight(&mut self, info: &TensorInfo, src: &dyn ByteSource) -> Result<CpuWeight> {
        let n = usize::try_from(info.n_bytes)
            .map_err(|_| Error::Config(format!("tensor {} is too large", info.name)))?;
        let (rows, cols) = info.rows_cols();
        if info.dims.len() == 1 {
            let floats = match info.ty {
                GgmlType::F32 => {
                    let buf = read_aligned(src, info.offset, n)?;
                    bytes_of(&buf, n)
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect()
                }
                GgmlType::F16 => {
                    let buf = read_aligned(src, info.offset, n)?;
                    bytes_of(&buf, n)
                        .chunks_exact(2)
                        .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                        .collect()
                }
                other => {
                    return Err(Error::UnsupportedTensorType {
                        tensor: info.name.clone(),
                        ty: format!("{other} (as a vector)"),
                        supported: "F32, F16",
                    })
                }
            };
            return Ok(CpuWeight::Vector(floats));
        }
        ggml_dtype(info)?;
        let storage: Box<dyn QuantizedType> = match info.ty {
            GgmlType::F32 => Box::new(read_blocks::<f32>(src, info.offset, n)?),
            GgmlType::F16 => Box::new(read_blocks::<half::f16>(src, info.offset, n)?),
            GgmlType::Q4_0 => Box::new(read_blocks::<BlockQ4_0>(src, info.offset, n)?),
            GgmlType::Q8_0 => Box::new(read_blocks::<BlockQ8_0>(src, info.offset, n)?),
            GgmlType::Q4_K => Box::new(read_blocks::<BlockQ4K>(src, info.offset, n)?),
            GgmlType::Q6_K => Box::new(read_blocks::<BlockQ6K>(src, info.offset, n)?),
            GgmlType::Q5_0 => {
                let q5 = read_aligned(src, info.offset, n)?;
                let mut q8 = zeroed_blocks::<BlockQ8_0>(n / 22 * 34)?;
                q5_0_to_q8_0(bytes_of(&q5, n), blocks_as_bytes_mut(&mut q8));
                Box::new(q8)
            }
            other => {
                return Err(Error::UnsupportedTensorType {
                    tensor: info.name.clone(),
                    ty: other.name().to_string(),
                    supported: SUPPORTED_TYPES,
                })
            }
        };
        let storage = QStorage::Cpu(storage);
        let q = Arc::new(QTensor::new(storage, (rows, cols))?);
        let mm = QMatMul::from_arc(q.clone())?;
        Ok(CpuWeight::Matrix { q, mm, rows, cols })
    }

    fn new_kv(&mut self, n_slots: usize, n_head_kv: usize, head_dim: usize) -> Result<KvCache> {
        Ok(KvCache::new(n_slots, n_head_kv * head_dim))
    }

    fn clear_kv(&mut self, kv: &mut KvCache) {
        kv.clear();
    }

    fn embed(&mut self, table: &CpuWeight, ids: &[u32], scale: f32) -> Result<Act> {
        let CpuWeight::Matrix { q, rows, cols, .. } = table else {
            return Err(Error::Backend("embedding table is not a matrix".into()));
        };
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= *rows) {
            return Err(Error::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary of {rows} tokens"
            )));
        }
        let ids_t = Tensor::from_vec(ids.to_vec(), ids.len(), &Device::Cpu)?;
        let mut data = q.embedding(&ids_t)?.flatten_all()?.to_vec1::<f32>()?;
        ops::scale(&mut data, scale);
        Ok(Act { data, width: *cols })
    }

    fn rms_norm(&mut self, x: &Act, w: &CpuWeight, eps: f32) -> Result<Act> {
        let CpuWeight::Vector(w) = w else {
            return Err(Error::Backend("norm weight is not a vector".into()));
        };
        if w.is_empty() || !x.width.is_multiple_of(w.len()) {
            return Err(Error::Backend(format!(
                "rms_norm: width {} is not a multiple of {}",
                x.width,
                w.len()
            )));
        }
        let mut data = x.data.clone();
        ops::rms_norm(&mut data, w, eps);
        Ok(Act {
            data,
            width: x.width,
        })
    }

    fn matmul(&mut self, x: &Act, w: &CpuWeight) -> Result<Act> {
        let CpuWeight::Matrix { mm, rows, cols, .. } = w else {
            return Err(Error::Backend("matmul weight is not a matrix".into()));
        };
        if x.width != *cols {
            return Err(Error::Backend(format!(
                "matmul: input width {} ≠ weight columns {cols}",
                x.width
            )));
        }
        let t = Tensor::from_slice(&x.data, (x.n_tok(), x.width), &Device::Cpu)?;
        let y = mm.forward(&t)?;
        Ok(Act {
            data: y.flatten_all()?.to_vec1::<f32>()?,
            width: *rows,
        })
    }

    fn rope(&mut self, x: &Act, pos: &[usize], head_dim: usize, base: f32) -> Result<Act> {
        if pos.len() != x.n_tok() || head_dim == 0 || !x.width.is_multiple_of(head_dim) {
            return Err(Error::Backend("rope: shape mismatch".into()));
        }
        let mut data = x.data.clone();
        ops::rope_neox(&mut data, x.width, pos, head_dim, base);
        Ok(Act {
            data,
            width: x.width,
        })
    }

    fn attention(
        &mut self,
        q: &Act,
        k: &Act,
        v: &Act,
        kv: &mut KvCache,
        pos: &[usize],
        p: AttnParams,
    ) -> Result<Act> {
        attention::attend(q, k, v, kv, pos, p)
    }

    fn gelu_mul(&mut self, gate: &Act, up: &Act) -> Result<Act> {
        if gate.data.len() != up.data.len() {
            return Err(Error::Backend("gelu_mul: shape mismatch".into()));
        }
        let data = gate
            .data
            .iter()
            .zip(&up.data)
            .map(|(&g, &u)| ops::gelu_tanh(g) * u)
            .collect();
        Ok(Act {
            data,
            width: gate.width,
        })
    }

    fn add(&mut self, a: &Act, b: &Act) -> Result<Act> {
        if a.data.len() != b.data.len() {
            return Err(Error::Backend("add: shape mismatch".into()));
        }
        Ok(Act {
            data: a.data.iter().zip(&b.data).map(|(x, y)| x + y).collect(),
            width: a.width,
        })
    }

    fn rows(&mut self, x: &Act, start: usize, n: usize) -> Result<Act> {
        let s = start * x.width;
        let e = (start + n) * x.width;
        let data = x
            .data
            .get(s..e)
            .ok_or_else(|| Error::Backend("rows: out of range".into()))?
            .to_vec();
        Ok(Act {
            data,
            width: x.width,
        })
    }

    async fn read(&mut self, x: &Act) -> Result<Vec<f32>> {
        Ok(x.data.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    #[test]
    fn q5_0_to_q8_0_is_exact() {
        // Quantize random values to Q5_0 with candle, convert, and compare dequantized values.
        let mut rng = crate::sampler::Rng::new(3);
        let xs: Vec<f32> = (0..32 * 8).map(|_| rng.normal()).collect();
        let t = Tensor::from_vec(xs, (8, 32), &Device::Cpu).unwrap();
        let q5 = QTensor::quantize(&t, GgmlDType::Q5_0).unwrap();
        let want = q5
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let q5b = q5.data().unwrap();
        let mut q8 = vec![0u8; q5b.len() / 22 * 34];
        q5_0_to_q8_0(&q5b, &mut q8);
        let s = QStorage::from_data(Cow::Owned(q8), &Device::Cpu, GgmlDType::Q8_0).unwrap();
        let got = QTensor::new(s, (8, 32))
            .unwrap()
            .dequantize(&Device::Cpu)
            .unwrap();
        assert_eq!(got.flatten_all().unwrap().to_vec1::<f32>().unwrap(), want);
    }
}
