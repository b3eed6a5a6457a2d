//! Weights on the GPU, still quantized. Each file block is repacked so every field a shader
//! reads is 4-byte aligned (WGSL reads u32 words): Q8_0 34 → 36 bytes (the f16 scale as f32),
//! Q5_0 22 → 24 (f32 scale, high bits, nibbles), Q4_0 18 → 20 (f32 scale, nibbles), Q4_1
//! 20 → 24 and Q5_1 24 → 28 (f32 scale and minimum), Q6_K 210 → 212 (2 bytes of padding);
//! Q4_K's 144 and Q5_K's 176 bytes are aligned as stored; F32, F16 and BF16 as is (16-bit
//! types two per word) — except F16 vectors (norm weights), which become F32. A matrix larger than the device's binding
//! limit is split into parts of whole rows (Gemma's 178 MB token embedding / LM head on a
//! device with 128 MiB bindings). Upload goes chunk by chunk: no second full copy on the CPU.

use half::f16;

use super::Gpu;
use crate::error::{Error, Result};
use crate::gguf::{ByteSource, GgmlType, TensorInfo};

/// One run of whole rows in its own buffer.
pub struct WeightPart {
    pub row0: usize,
    pub rows: usize,
    pub buf: wgpu::Buffer,
}

/// A `rows × cols` weight matrix (a vector is one row) on the GPU.
pub struct GpuWeight {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub parts: Vec<WeightPart>,
}

/// (weights per block, file bytes per block, GPU bytes per block).
pub fn block_layout(ty: GgmlType) -> Result<(usize, usize, usize)> {
    Ok(match ty {
        GgmlType::Q8_0 => (32, 34, 36),
        GgmlType::Q5_0 => (32, 22, 24),
        GgmlType::Q4_0 => (32, 18, 20),
        GgmlType::Q4_1 => (32, 20, 24),
        GgmlType::Q5_1 => (32, 24, 28),
        GgmlType::Q5_K => (256, 176, 176),
        GgmlType::F16 | GgmlType::BF16 => (1, 2, 2),
        GgmlType::Q4_K => (256, 144, 144),
        GgmlType::Q6_K => (256, 210, 212),
        GgmlType::F32 => (1, 4, 4),
        other => {
            return Err(Error::UnsupportedTensorType {
                tensor: String::new(),
                ty: other.name().to_string(),
                supported:
                    "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16, F32 (on the GPU)",
            })
        }
    })
}

/// Append the GPU form of whole file blocks `file` of type `ty` to `out`.
pub fn repack(ty: GgmlType, file: &[u8], out: &mut Vec<u8>) -> Result<()> {
    let (_, fb, gb) = block_layout(ty)?;
    if fb == gb {
        // Aligned as stored (Q4_K, F16, F32).
        out.extend_from_slice(file);
        return Ok(());
    }
    let scale = |b: &[u8]| f16::from_le_bytes([b[0], b[1]]).to_f32().to_le_bytes();
    for blk in file.chunks_exact(fb) {
        match ty {
            GgmlType::Q8_0 => {
                out.extend_from_slice(&scale(blk));
                out.extend_from_slice(&blk[2..34]);
            }
            GgmlType::Q5_0 => {
                out.extend_from_slice(&scale(blk));
                out.extend_from_slice(&blk[2..22]);
            }
            GgmlType::Q4_0 => {
                out.extend_from_slice(&scale(blk));
                out.extend_from_slice(&blk[2..18]);
            }
            GgmlType::Q4_1 | GgmlType::Q5_1 => {
                out.extend_from_slice(&scale(blk));
                out.extend_from_slice(&scale(&blk[2..]));
                out.extend_from_slice(&blk[4..fb]);
            }
            GgmlType::Q6_K => {
                out.extend_from_slice(blk);
                out.extend_from_slice(&[0, 0]);
            }
            _ => out.extend_from_slice(blk),
        }
    }
    Ok(())
}

impl GpuWeight {
    /// An F16 or BF16 vector (a norm weight or bias) as F32: the elementwise kernels read
    /// F32 vectors.
    fn load_half_vector(
        gpu: &Gpu,
        info: &TensorInfo,
        src: &dyn ByteSource,
        cols: usize,
    ) -> Result<Self> {
        if info.n_bytes != (cols * 2) as u64 {
            return Err(Error::Config(format!(
                "{}: {} bytes for {cols} {} values",
                info.name, info.n_bytes, info.ty
            )));
        }
        let mut file = vec![0u8; cols * 2];
        src.read_at(info.offset, &mut file)?;
        let bf16 = info.ty == GgmlType::BF16;
        let words: Vec<u8> = file
            .chunks_exact(2)
            .flat_map(|b| {
                let v = if bf16 {
                    half::bf16::from_le_bytes([b[0], b[1]]).to_f32()
                } else {
                    f16::from_le_bytes([b[0], b[1]]).to_f32()
                };
                v.to_le_bytes()
            })
            .collect();
        let buf = gpu.storage(&info.name, words.len() as u64);
        gpu.queue.write_buffer(&buf, 0, &words);
        Ok(GpuWeight {
            ty: GgmlType::F32,
            rows: 1,
            cols,
            parts: vec![WeightPart {
                row0: 0,
                rows: 1,
                buf,
            }],
        })
    }
}

/// Rows of the file read (and repacked) per upload chunk: a few MB of scratch.
const UPLOAD_CHUNK_BYTES: usize = 4 << 20;

impl GpuWeight {
    /// Upload `info` from `src`: split into parts of at most `gpu.max_part_bytes`.
    pub fn load(gpu: &Gpu, info: &TensorInfo, src: &dyn ByteSource) -> Result<Self> {
        let cols = *info.dims.first().unwrap_or(&1) as usize;
        let rows = info.dims.iter().skip(1).product::<u64>() as usize;
        if matches!(info.ty, GgmlType::F16 | GgmlType::BF16) && rows == 1 {
            return Self::load_half_vector(gpu, info, src, cols);
        }
        let (per_block, fb, gb) = block_layout(info.ty).map_err(|e| match e {
            Error::UnsupportedTensorType { ty, supported, .. } => Error::UnsupportedTensorType {
                tensor: info.name.clone(),
                ty,
                supported,
            },
            e => e,
        })?;
        if !cols.is_multiple_of(per_block) || !cols.is_multiple_of(32) {
            return Err(Error::Backend(format!(
                "{}: rows of {cols} {} weights are not whole 32-weight blocks",
                info.name, info.ty
            )));
        }
        let file_row = cols / per_block * fb;
        let gpu_row = cols / per_block * gb;
        if (file_row * rows) as u64 != info.n_bytes {
            return Err(Error::Config(format!(
                "{}: {} bytes for {rows} rows of {cols} {}",
                info.name, info.n_bytes, info.ty
            )));
        }
        let rows_per_part = (gpu.max_part_bytes / gpu_row as u64) as usize;
        if rows_per_part == 0 {
            return Err(Error::Backend(format!(
                "{}: one row ({gpu_row} bytes) exceeds the GPU's binding limit",
                info.name
            )));
        }
        let mut parts = Vec::new();
        let mut file_buf = Vec::new();
        let mut gpu_buf = Vec::new();
        let chunk_rows = (UPLOAD_CHUNK_BYTES / file_row).max(1);
        let mut row0 = 0;
        while row0 < rows {
            let n = rows_per_part.min(rows - row0);
            let buf = gpu.storage(&info.name, (n * gpu_row) as u64);
            let mut r = 0;
            while r < n {
                let k = chunk_rows.min(n - r);
                file_buf.resize(k * file_row, 0);
                src.read_at(info.offset + ((row0 + r) * file_row) as u64, &mut file_buf)?;
                gpu_buf.clear();
                repack(info.ty, &file_buf, &mut gpu_buf)?;
                gpu.queue.write_buffer(&buf, (r * gpu_row) as u64, &gpu_buf);
                r += k;
            }
            parts.push(WeightPart { row0, rows: n, buf });
            row0 += n;
        }
        Ok(GpuWeight {
            ty: info.ty,
            rows,
            cols,
            parts,
        })
    }
}
