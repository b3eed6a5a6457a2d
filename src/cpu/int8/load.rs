//! A [`QMatrix`] built from a tensor in the file, a chunk of file blocks at a time: which
//! layout this build keeps for it, as a layer or as an LM head ([`keeps_int8`],
//! [`scale_layout`]), the bytes that takes ([`QMatrix::resident_bytes`]), and the load.

use super::decode::{no_unit, unpacker, Unpacker};
use super::dispatch::{has_fast_u7, row_stats};
use super::layout::{QMatrix, ScaleLayout, Scales, Values};
use super::packing::Packing;
use crate::error::{Error, Result};
use crate::gguf::{now, ByteSource, GgmlType, SyncReads};
use std::sync::OnceLock;

/// File blocks read per chunk while loading (a few hundred KB of scratch). The load stays on
/// one thread: splitting each chunk's unpacking and first touch over the team took as long
/// (296 / 301 ms `loadMs`; 292–407 / 302–362 in three more runs).
pub(super) const LOAD_CHUNK_BLOCKS: usize = 4096;

impl QMatrix {
    /// The tensor types this kernel takes.
    pub fn takes(ty: GgmlType) -> bool {
        unpacker(ty).is_some()
    }

    /// (values per scale, has offsets) of a type this kernel takes.
    pub fn layout(ty: GgmlType) -> Option<(usize, bool)> {
        unpacker(ty).map(|u| (u.group, u.offsets))
    }

    /// The bytes `n` values of a type this kernel takes occupy loaded in this build (values,
    /// scales and offsets), as an LM head when `head` (where the build has the head's
    /// filter: int8 values, f16 scales where the file's are; else as any matrix).
    pub fn resident_bytes(ty: GgmlType, cols: u64, n: u64, head: bool) -> Option<u64> {
        let u = unpacker(ty)?;
        let filter = has_fast_u7();
        let values = match u.pack {
            Some((p, _)) if !keeps_int8(&u, head, filter) => {
                let cols = usize::try_from(cols).ok().filter(|&c| c > 0)?;
                (n / cols as u64).saturating_mul(p.row_bytes(cols) as u64)
            }
            _ => n,
        };
        let groups = n / u.group as u64;
        let blocks = n / u.block as u64;
        Some(match scale_layout(&u, head, filter) {
            ScaleLayout::F32 => values + groups * (4 + 4 * u64::from(u.offsets)),
            ScaleLayout::F16 { .. } => values + groups * 2,
            ScaleLayout::Coded => values + (groups + 4 * blocks) * (1 + u64::from(u.offsets)),
        })
    }

    /// Load a tensor of `ty` (a type [`QMatrix::takes`]) from the file, block by block.
    pub fn load(
        src: &dyn ByteSource,
        offset: u64,
        rows: usize,
        cols: usize,
        ty: GgmlType,
    ) -> Result<Self> {
        now(Self::load_with(
            &SyncReads(src),
            offset,
            rows,
            cols,
            ty,
            false,
        ))?
    }

    /// [`QMatrix::load`], of a matrix that serves as the LM head when `head`: where this
    /// build has the head's filter, each row's statistics are then taken as its chunk is
    /// unpacked (in cache), so neither the first token nor a second pass over the matrix
    /// pays for them. Each chunk's read is awaited ([`ByteSource::read_at_async`]), so a
    /// source can read the next while this one is unpacked.
    pub async fn load_with(
        src: &dyn ByteSource,
        offset: u64,
        rows: usize,
        cols: usize,
        ty: GgmlType,
        head: bool,
    ) -> Result<Self> {
        let filter = has_fast_u7();
        // A type the kernel does not take is load_as's error.
        let (int8, layout) = unpacker(ty).map_or((true, ScaleLayout::F32), |u| {
            (keeps_int8(&u, head, filter), scale_layout(&u, head, filter))
        });
        Self::load_as(src, offset, rows, cols, ty, head, int8, layout).await
    }

    /// [`QMatrix::load_with`], the values as int8 when `int8` (else packed where the type
    /// has a packed layout), the scales in `layout` where the type has it and each value
    /// converts back exactly (else f32: [`Scales`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn load_as(
        src: &dyn ByteSource,
        offset: u64,
        rows: usize,
        cols: usize,
        ty: GgmlType,
        head: bool,
        int8: bool,
        layout: ScaleLayout,
    ) -> Result<Self> {
        let Some(u) = unpacker(ty) else {
            return Err(Error::Backend(format!(
                "the int8 kernel does not take {ty}"
            )));
        };
        let (block, block_bytes) = (u.block, u.bytes);
        let group = u.group;
        if !cols.is_multiple_of(block) {
            return Err(Error::Backend(format!(
                "{ty} rows of {cols} are not whole blocks"
            )));
        }
        // Sizes were checked against the file, but wasm's usize is 32 bits.
        let n = rows.checked_mul(cols).ok_or_else(|| {
            Error::Backend(format!("a {rows} × {cols} matrix does not fit in memory"))
        })?;
        let n_blocks = n / block;
        let packing = u.pack.filter(|_| !int8);
        // Reserved whole and filled a chunk at a time: zeroing them whole first would be a
        // second pass over ~300 MB (in wasm, where the allocator zeroes even fresh memory).
        let mut values = match packing {
            Some((p, _)) => Values::Packed(p, Vec::with_capacity(rows * p.row_bytes(cols))),
            None => Values::Int8(Vec::with_capacity(n)),
        };
        // f16 scales are the blocks' first two bytes: the types whose scale is the file's
        // f16, with one block per group and no offsets. Coded ones: the K-quants, whose
        // offsets are coded too.
        let layout = match layout {
            ScaleLayout::F16 { .. } if u.f16_scale.is_some() && block == group && !u.offsets => {
                layout
            }
            ScaleLayout::Coded if u.units.is_some() => layout,
            _ => ScaleLayout::F32,
        };
        let per = block / group;
        let mut scales = Scales::with_capacity(layout, n / group, per);
        let mut offsets = u
            .offsets
            .then(|| Scales::with_capacity(layout, n / group, per));
        let (unit, offset_unit) = u.units.unwrap_or((no_unit, no_unit));
        // A chunk's scales and offsets as f32 where the matrix keeps another layout
        // (appended to it).
        let (mut chunk_scales, mut chunk_offsets) = (Vec::new(), Vec::new());
        // Whole rows per chunk.
        let per_row = cols / block;
        let chunk_rows = (LOAD_CHUNK_BLOCKS / per_row.max(1)).max(1);
        let mut buf = vec![0u8; (chunk_rows * per_row).min(n_blocks) * block_bytes];
        let take_stats = head && has_fast_u7() && !u.offsets && packing.is_none();
        let mut stats = Vec::new();
        if take_stats {
            stats.reserve_exact(rows);
        }
        let mut r0 = 0;
        while r0 < rows {
            let nr = chunk_rows.min(rows - r0);
            let (b0, nb) = (r0 * per_row, nr * per_row);
            let chunk = &mut buf[..nb * block_bytes];
            src.read_at_async(offset + (b0 * block_bytes) as u64, chunk)
                .await?;
            let g = b0 * block / group..(b0 + nb) * block / group;
            let v = b0 * block..(b0 + nb) * block;
            // The chunk's room, zeroed while it is in cache (within the capacity reserved).
            let s = match &mut scales {
                Scales::F32(s) => {
                    s.resize(g.end, 0.0);
                    &mut s[g.clone()]
                }
                _ => {
                    chunk_scales.clear();
                    chunk_scales.resize(g.len(), 0.0);
                    &mut chunk_scales[..]
                }
            };
            match &mut values {
                Values::Packed(p, bytes) => bytes.resize((r0 + nr) * p.row_bytes(cols), 0),
                Values::Int8(qs) => qs.resize(v.end, 0),
            }
            let o = match offsets.as_mut() {
                Some(Scales::F32(o)) => {
                    o.resize(g.end, 0.0);
                    &mut o[g.clone()]
                }
                Some(_) => {
                    chunk_offsets.clear();
                    chunk_offsets.resize(g.len(), 0.0);
                    &mut chunk_offsets[..]
                }
                None => &mut [][..],
            };
            match (&mut values, packing) {
                (Values::Packed(p, bytes), Some((_, pack))) => {
                    let rb = p.row_bytes(cols);
                    pack(chunk, &mut bytes[r0 * rb..(r0 + nr) * rb], s, o, cols)
                }
                (Values::Int8(qs), _) => (u.unpack)(chunk, &mut qs[v], s, o),
                (Values::Packed(..), None) => {
                    return Err(Error::Backend(format!("{ty} has no packed layout")))
                }
            }
            let s = match &scales {
                Scales::F32(s) => &s[g.clone()],
                _ => &chunk_scales[..],
            };
            if let (true, Values::Int8(qs)) = (take_stats, &values) {
                let gpr = cols / group;
                for r in r0..r0 + nr {
                    let q = &qs[r * cols..(r + 1) * cols];
                    stats.push(row_stats(q, &s[(r - r0) * gpr..(r - r0 + 1) * gpr], group));
                }
            }
            scales.append(&chunk_scales, chunk.chunks_exact(block_bytes), unit);
            if let Some(o) = offsets.as_mut() {
                o.append(&chunk_offsets, chunk.chunks_exact(block_bytes), offset_unit);
            }
            r0 += nr;
        }
        Ok(Self {
            values,
            scales,
            offsets,
            group,
            rows,
            cols,
            stats: if take_stats {
                OnceLock::from(stats)
            } else {
                OnceLock::new()
            },
        })
    }
}

/// Whether a matrix of this type keeps int8 values: the types without a packed layout, and
/// an LM head the filter may run on (it reads int8 rows and takes no offsets) where `filter`
/// (this build has the filter: [`has_fast_u7`]).
pub(super) fn keeps_int8(u: &Unpacker, head: bool, filter: bool) -> bool {
    match u.pack {
        None => true,
        // The five-bit layout has a kernel in wasm only.
        Some((Packing::Fives, _)) if !cfg!(target_arch = "wasm32") => true,
        Some(_) => head && !u.offsets && filter,
    }
}

/// How a matrix of this type asks to keep its scales ([`Scales`]). An LM head the filter
/// runs on keeps the file's f16 scales where they are non-negative (the filter's kernel
/// reads them as they are), any other head f32. In wasm, whose memory is the tab's, Q5_0 in
/// the five-bit layout keeps the file's f16 scales, signed, which its kernel reads as they
/// are ([`BlockScale`](super::scale::BlockScale)); the K-quants their units and codes, scales and offsets, converted
/// for a work item's rows before a product ([`QMatrix::matvec_tiles`]) (Gemma 3 270M:
/// 5.4 MiB less; 2.2 million values a decode step, 1.2 SIMD instructions each where the
/// compiler's scalar loop took 4 and cost ~4% of the step; the f32 read from memory are
/// 6.6 MB fewer); every other
/// matrix f32, which the other kernels read. Natively f32 throughout (the tests hold the
/// other layouts there too).
fn scale_layout(u: &Unpacker, head: bool, filter: bool) -> ScaleLayout {
    if head {
        if filter && u.f16_scale == Some(true) && keeps_int8(u, head, filter) {
            ScaleLayout::F16 { signed: false }
        } else if cfg!(target_arch = "wasm32") && u.units.is_some() {
            // The filter makes them f32 a span of rows at a time (head.rs).
            ScaleLayout::Coded
        } else {
            ScaleLayout::F32
        }
    } else if !cfg!(target_arch = "wasm32") {
        ScaleLayout::F32
    } else if u.f16_scale.is_some() && matches!(u.pack, Some((Packing::Fives, _))) {
        ScaleLayout::F16 { signed: true }
    } else if u.units.is_some() {
        ScaleLayout::Coded
    } else {
        ScaleLayout::F32
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::scale::QK;
    use super::*;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    /// A head whose file scales are not all non-negative and finite f16 keeps f32 ones (a
    /// negative scale in a later chunk, after f16 ones were kept), with the same products.
    #[test]
    fn a_head_with_a_negative_scale_keeps_f32_scales() {
        let mut rng = crate::rng::Rng::new(5);
        let (rows, cols) = (LOAD_CHUNK_BLOCKS / 4 + 3, 128);
        let w: Vec<f32> = (0..rows * cols).map(|_| rng.normal() * 0.05).collect();
        let wt = Tensor::from_vec(w, (rows, cols), &Device::Cpu).unwrap();
        let mut bytes = QTensor::quantize(&wt, GgmlDType::Q8_0)
            .unwrap()
            .data()
            .unwrap()
            .into_owned();
        let load = |bytes: &[u8]| {
            now(QMatrix::load_with(
                &bytes,
                0,
                rows,
                cols,
                GgmlType::Q8_0,
                true,
            ))
            .unwrap()
            .unwrap()
        };
        let x: Vec<f32> = (0..cols).map(|_| rng.normal()).collect();
        let f16_head = load(&bytes);
        assert_eq!(matches!(f16_head.scales, Scales::F16 { .. }), has_fast_u7());
        // The last row's first block: its scale's sign bit set, its values negated.
        let at = (rows - 1) * cols / QK * 34;
        bytes[at + 1] |= 0x80;
        for v in &mut bytes[at + 2..at + 34] {
            *v = (*v as i8).wrapping_neg() as u8;
        }
        let m = load(&bytes);
        assert!(matches!(m.scales, Scales::F32(_)));
        let plain = QMatrix::load(&bytes, 0, rows, cols, GgmlType::Q8_0).unwrap();
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        assert_eq!(bits(m.matmul(&x, 1)), bits(plain.matmul(&x, 1)));
        // The negation is exact: the same matrix, the same top-k as with f16 scales.
        for k in [1, 5] {
            assert_eq!(m.top_k(&x, k, None), f16_head.top_k(&x, k, None));
        }
    }

    /// A file's bytes of `rows × cols` normal weights, quantized by candle as `dt`.
    pub(in crate::cpu::int8) fn quantized(
        rng: &mut crate::rng::Rng,
        rows: usize,
        cols: usize,
        dt: GgmlDType,
    ) -> Vec<u8> {
        let w: Vec<f32> = (0..rows * cols).map(|_| rng.normal()).collect();
        let wt = Tensor::from_vec(w, (rows, cols), &Device::Cpu).unwrap();
        QTensor::quantize(&wt, dt)
            .unwrap()
            .data()
            .unwrap()
            .into_owned()
    }

    /// A matrix of the file's `bytes` loaded as a layer (not a head), the values as int8 or
    /// not, the scales asked in `layout`.
    pub(in crate::cpu::int8) fn load_layer(
        bytes: &[u8],
        rows: usize,
        cols: usize,
        ty: GgmlType,
        int8: bool,
        layout: ScaleLayout,
    ) -> QMatrix {
        now(QMatrix::load_as(
            &SyncReads(&bytes),
            0,
            rows,
            cols,
            ty,
            false,
            int8,
            layout,
        ))
        .unwrap()
        .unwrap()
    }
}
