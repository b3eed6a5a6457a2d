//! A tensor from the file as the CPU keeps it: vectors and float matrices as f32 (the
//! matrices packed in panels), quantized matrices unpacked to int8 rows. Every weight is
//! copied once, from the byte source straight into its final place.

use super::tensor::CpuWeight;
use super::{dense, int8};
use crate::error::{Error, Result};
use crate::gguf::{ByteSource, GgmlType, TensorInfo};
use candle_core::quantized::k_quants::GgmlType as Block;

/// Tensor types the CPU backend runs.
pub const SUPPORTED_TYPES: &str =
    "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K";

/// Bytes the CPU backend holds for a tensor of `ty` with `n` values in rows of `cols`: for
/// the quantized types int8 values (4-bit codes packed, and in wasm Q5_0's three to 16 bits,
/// but for an LM head the filter runs on: `head`) plus f32 scales (and offsets) per group,
/// f32 for the float types. Natively on the 8-bit path (`fast`), the file's bytes for the types it takes.
pub fn resident_bytes(ty: GgmlType, cols: u64, n: u64, head: bool, fast: bool) -> u64 {
    let exact = int8::QMatrix::resident_bytes(ty, cols, n, head);
    #[cfg(not(target_arch = "wasm32"))]
    if let Some(b) = blocks_bytes(ty, cols, n, head, fast, exact) {
        return b;
    }
    #[cfg(target_arch = "wasm32")]
    let _ = fast;
    exact.unwrap_or_else(|| n.saturating_mul(4))
}

/// The bytes a matrix the 8-bit path keeps as the file's blocks holds (the file's), or
/// `None` where it goes to the exact path: not `fast`, a type the path does not take, or an
/// LM head whose exact layout (`exact` bytes) is no larger than the file (Q8_0: int8 values
/// with the file's f16 scales), which keeps the head's filter ([`int8::QMatrix::top_k`]):
/// Gemma 3 270M decoded 54 tokens/s natively with the filter, 33 with the whole head on
/// 8-bit activations.
#[cfg(not(target_arch = "wasm32"))]
fn blocks_bytes(
    ty: GgmlType,
    cols: u64,
    n: u64,
    head: bool,
    fast: bool,
    exact: Option<u64>,
) -> Option<u64> {
    let file = super::q8::BlockMatrix::resident_bytes(ty, cols, n).filter(|_| fast)?;
    (!(head && exact.is_some_and(|e| e <= file))).then_some(file)
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
async fn read_blocks<T: Block>(
    src: &dyn ByteSource,
    offset: u64,
    n_bytes: usize,
) -> Result<Vec<T>> {
    let mut v = zeroed_blocks::<T>(n_bytes)?;
    src.read_at_async(offset, blocks_as_bytes_mut(&mut v))
        .await?;
    Ok(v)
}

/// A float tensor (F32, F16, BF16) of `n_bytes` as f32; `None` for any other type.
async fn read_floats(
    src: &dyn ByteSource,
    info: &TensorInfo,
    n_bytes: usize,
) -> Result<Option<Vec<f32>>> {
    Ok(Some(match info.ty {
        GgmlType::F32 => read_blocks::<f32>(src, info.offset, n_bytes).await?,
        GgmlType::F16 => read_blocks::<half::f16>(src, info.offset, n_bytes)
            .await?
            .iter()
            .map(|v| v.to_f32())
            .collect(),
        GgmlType::BF16 => read_blocks::<half::bf16>(src, info.offset, n_bytes)
            .await?
            .iter()
            .map(|v| v.to_f32())
            .collect(),
        _ => return Ok(None),
    }))
}

/// One tensor from the file as the CPU keeps it ([`Backend::load_weight`]); `head`: it serves
/// as the LM head ([`Backend::load_head`]); `fast`: natively, a type the 8-bit path takes
/// stays in the file's blocks ([`super::q8`]).
pub(super) async fn load_cpu_weight(
    info: &TensorInfo,
    src: &dyn ByteSource,
    head: bool,
    fast: bool,
) -> Result<CpuWeight> {
    let n = usize::try_from(info.n_bytes)
        .map_err(|_| Error::Config(format!("tensor {} is too large", info.name)))?;
    let (rows, cols) = info.rows_cols();
    let unsupported = |ty: &str, supported: &'static str| Error::UnsupportedTensorType {
        tensor: info.name.clone(),
        ty: ty.to_string(),
        supported,
    };
    if info.dims.len() == 1 {
        let floats = read_floats(src, info, n)
            .await?
            .ok_or_else(|| unsupported(&format!("{} (as a vector)", info.ty), "F32, F16, BF16"))?;
        return Ok(CpuWeight::Vector(floats));
    }
    #[cfg(not(target_arch = "wasm32"))]
    if blocks_bytes(
        info.ty,
        cols as u64,
        rows.saturating_mul(cols) as u64,
        head,
        fast,
        int8::QMatrix::resident_bytes(info.ty, cols as u64, rows.saturating_mul(cols) as u64, head),
    )
    .is_some()
    {
        return Ok(CpuWeight::Blocks(
            super::q8::BlockMatrix::load(src, info.offset, rows, cols, info.ty).await?,
        ));
    }
    #[cfg(target_arch = "wasm32")]
    let _ = fast;
    if int8::QMatrix::takes(info.ty) {
        return Ok(CpuWeight::Int8(
            int8::QMatrix::load_with(src, info.offset, rows, cols, info.ty, head).await?,
        ));
    }
    let floats = read_floats(src, info, n)
        .await?
        .ok_or_else(|| unsupported(info.ty.name(), SUPPORTED_TYPES))?;
    if floats.len() != rows * cols {
        return Err(Error::Config(format!(
            "tensor {}: {} values for {rows} × {cols}",
            info.name,
            floats.len()
        )));
    }
    Ok(CpuWeight::Dense(dense::DenseMatrix::pack(
        &floats, rows, cols,
    )))
}
