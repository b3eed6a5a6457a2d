//! A quantized matrix as this kernel holds it ([`QMatrix`]): its values ([`Values`]: int8,
//! or packed codes) and its scales and offsets ([`Scales`]: f32, the file's f16, or a
//! K-quant's units and codes), whatever the layout the same f32 values bit for bit; and a
//! row read back from them (its int8 values, its scales, dequantized rows).

use super::decode::{f16_bits_to_f32, UnitFn};
use super::dispatch::{expand_codes, unpack};
use super::packing::Packing;
use super::scale::BlockScale;
use crate::error::{Error, Result};
use std::ops::Range;
use std::sync::OnceLock;

/// A `rows × cols` matrix of int8 values, a scale per `group` values and, optionally, an
/// offset: `w = scale · q − offset`.
pub struct QMatrix {
    /// (rows × cols) values, row-major.
    pub(super) values: Values,
    /// One scale per group.
    pub(super) scales: Scales,
    /// One offset per group (the minimums of Q4_1, Q5_1, Q2_K, Q4_K, Q5_K), if any: f32, or
    /// coded as the scales are.
    pub(super) offsets: Option<Scales>,
    /// 32 (the 32-value block types) or 16 (the K-quants).
    pub(super) group: usize,
    pub rows: usize,
    pub cols: usize,
    /// Each row's `(‖w‖, Σw)` for the LM head's filter, the norm rounded up: taken once, for
    /// the matrix that serves as a head ([`QMatrix::load_with`], or at its first filter).
    pub(super) stats: OnceLock<Vec<(f32, f32)>>,
}

/// How a matrix holds its scales. Whatever the layout, a product sees the f32 values the
/// file's blocks unpack to, bit for bit: f16 is kept only where each value converts back
/// exactly, else the load falls back to f32 ([`Scales::append`]).
pub(super) enum Scales {
    F32(Vec<f32>),
    /// The file's own f16 scales (one per 32-value block: Q4_0, Q5_0, Q8_0), finite. An LM
    /// head's, in a build with the head's filter, are non-negative too: half the bytes its
    /// pass reads (Gemma 3 270M: 10.5 MB of a decode step's 294), and the filter's kernel
    /// takes them as they are ([`Scale`](super::scale::Scale)). In wasm Q5_0's layers keep them too (Gemma 3
    /// 270M: 3.9 MiB less of the tab's memory), and the five-bit kernel reads them as they
    /// are ([`BlockScale`]). Any other product converts them into f32 first
    /// ([`Scales::groups`]). `signed`: negative ones may be among them (never a head's).
    F16 {
        bits: Vec<u16>,
        signed: bool,
    },
    /// A K-quant's, as its file holds them: each file block's f16 unit (`d` for the scales,
    /// `dmin` for the offsets) as an f32, times an integer code per group (the 4-, 6- or
    /// 8-bit sub-block scale or minimum), `per` groups a block. Their product, which the
    /// unpacker forms exactly in f32, is formed again where a product needs the values
    /// ([`Scales::groups`], a span of rows at a time). In wasm, whose memory is the tab's:
    /// 1 byte a group and 4 a block instead of 4 a group (Gemma 3 270M's Q4_K and Q6_K layers:
    /// 5.4 MiB less). Made f32 a span of rows at a time, not read by the kernels: reading the
    /// codes inside the kernels (`(d · code) · x` per group, bit for bit) cost 2.9% of a decode
    /// step (37.7 → 36.6 tok/s), a scalar pass over a whole matrix before each product 7%.
    Coded {
        units: Vec<f32>,
        codes: Vec<i8>,
        per: usize,
    },
}

impl Scales {
    /// Room for `groups` values in `layout`, of a type with `per` groups a file block.
    pub(super) fn with_capacity(layout: ScaleLayout, groups: usize, per: usize) -> Self {
        match layout {
            ScaleLayout::F32 => Scales::F32(Vec::with_capacity(groups)),
            ScaleLayout::F16 { signed } => Scales::F16 {
                bits: Vec::with_capacity(groups),
                signed,
            },
            ScaleLayout::Coded => Scales::Coded {
                units: Vec::with_capacity(groups / per),
                codes: Vec::with_capacity(groups),
                per,
            },
        }
    }

    /// How many values it holds.
    fn len(&self) -> usize {
        match self {
            Scales::F32(s) => s.len(),
            Scales::F16 { bits, .. } => bits.len(),
            Scales::Coded { codes, .. } => codes.len(),
        }
    }

    /// Bytes held.
    #[cfg(test)]
    fn bytes(&self) -> usize {
        match self {
            Scales::F32(s) => 4 * s.len(),
            Scales::F16 { bits, .. } => 2 * bits.len(),
            Scales::Coded { units, codes, .. } => 4 * units.len() + codes.len(),
        }
    }

    /// Values `g` as f32: the held ones, or converted into `buf` (finite f16, the only ones
    /// the load keeps: [`BlockScale`]'s reading times its power of two, exactly, in a loop
    /// the compiler vectorizes; coded ones as their unit times their code, the product the
    /// load checked: [`expand_codes`]).
    pub(super) fn groups<'a>(&'a self, g: Range<usize>, buf: &'a mut Vec<f32>) -> &'a [f32] {
        if let Scales::F32(s) = self {
            return &s[g];
        }
        buf.clear();
        self.extend_groups(g, buf);
        buf
    }

    /// Values `g` as f32 ([`Scales::groups`]) after those `out` holds.
    pub(super) fn extend_groups(&self, g: Range<usize>, out: &mut Vec<f32>) {
        match self {
            Scales::F32(s) => out.extend_from_slice(&s[g]),
            Scales::F16 { bits, .. } => {
                out.extend(bits[g].iter().map(|&b| b.over_x() * <u16 as BlockScale>::X))
            }
            Scales::Coded { units, codes, per } => {
                // Whole blocks: every range asked is whole rows (or all groups so far, when
                // a load falls back to f32), and a row is whole blocks.
                debug_assert!(g.start.is_multiple_of(*per) && g.len().is_multiple_of(*per));
                let at = out.len();
                // Every value is written: what `resize` keeps need not be zeroed.
                out.resize(at + g.len(), 0.0);
                expand_codes(&units[g.start / per..], &codes[g], *per, &mut out[at..]);
            }
        }
    }

    /// Append a chunk's values `f`, taken from its file blocks `blocks`, in this layout where
    /// each converts back exactly (`F16`: the f16 in the block's first two bytes, one value a
    /// block, finite, and non-negative unless `signed`; `Coded`: `unit(block)` times an
    /// integer code, `per` values a block); else every value so far and these become f32.
    /// F32 values are unpacked in place by the load: there `f` is already held.
    pub(super) fn append<'b>(
        &mut self,
        f: &[f32],
        blocks: impl Iterator<Item = &'b [u8]>,
        unit: UnitFn,
    ) {
        let at = self.len();
        let kept = match self {
            Scales::F32(_) => return,
            Scales::F16 { bits, signed } => {
                bits.extend(blocks.map(|b| u16::from_le_bytes([b[0], b[1]])));
                bits[at..].iter().zip(f).all(|(&b, &v)| {
                    let finite = b & 0x7FFF < 0x7C00 && (*signed || b < 0x8000);
                    finite && f16_bits_to_f32(b).to_bits() == v.to_bits()
                })
            }
            Scales::Coded { units, codes, per } => {
                let mut ok = true;
                for (b, vs) in blocks.zip(f.chunks(*per)) {
                    let u = unit(b);
                    units.push(u);
                    for &v in vs {
                        let c = code_of(u, v);
                        ok &= c.is_some();
                        codes.push(c.unwrap_or(0));
                    }
                }
                ok && codes.len() == at + f.len()
            }
        };
        if !kept {
            let mut buf = Vec::new();
            let mut all = Vec::with_capacity(at + f.len());
            all.extend_from_slice(self.groups(0..at, &mut buf));
            all.extend_from_slice(f);
            *self = Scales::F32(all);
        }
    }
}

/// The integer `c` with `unit · c` equal to `v` bit for bit, if there is one in i8's range:
/// `v / unit` where `unit` is not zero (a product of it and a small integer divides back
/// exactly), else the one of 0, 1 and −1 that gives `v`'s sign of zero.
pub(super) fn code_of(unit: f32, v: f32) -> Option<i8> {
    let guess = (v / unit) as i8; // NaN → 0, saturating
    [guess, 1, -1]
        .into_iter()
        .find(|&c| (unit * f32::from(c)).to_bits() == v.to_bits())
}

/// The layout a matrix asks for its scales ([`Scales`]; f16 and coded fall back to f32 where
/// a value would not convert back exactly).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum ScaleLayout {
    F32,
    /// The file's f16 (types with [`Unpacker::f16_scale`](super::decode::Unpacker::f16_scale)); negative ones too when `signed`.
    F16 {
        signed: bool,
    },
    /// A K-quant's block units times codes ([`Unpacker::units`](super::decode::Unpacker::units)), for its offsets too.
    Coded,
}

/// How a matrix holds its values.
pub(super) enum Values {
    /// One int8 per value: the 8-, 6- and 5-bit types, the 2- and 3-bit K-quants, and an
    /// LM head the filter runs on (it reads int8 rows: [`keeps_int8`](super::load::keeps_int8)).
    Int8(Vec<i8>),
    /// The 4-bit types' codes, 16 bytes per 32 values instead of 32 ([`Packing`]): a
    /// product widens them itself ([`dot_w4_nib`](super::dispatch::dot_w4_nib)) or unpacks a row to int8 ([`unpack`]),
    /// the same values either way, so the sums are those of `Int8`.
    Packed(Packing, Vec<u8>),
}

impl QMatrix {
    /// Whether the values are held packed (4-bit codes: [`Values::Packed`]).
    pub fn is_packed(&self) -> bool {
        matches!(self.values, Values::Packed(..))
    }

    /// Row `j`'s scales: the matrix's own, or converted into `buf` ([`Scales::groups`]).
    pub(super) fn row_scales<'a>(&'a self, j: usize, buf: &'a mut Vec<f32>) -> &'a [f32] {
        let ng = self.cols / self.group;
        self.scales.groups(j * ng..(j + 1) * ng, buf)
    }

    /// Row `j`'s offsets (empty without): the matrix's own, or converted into `buf`.
    pub(super) fn row_offsets<'a>(&'a self, j: usize, buf: &'a mut Vec<f32>) -> &'a [f32] {
        let ng = self.cols / self.group;
        self.offsets
            .as_ref()
            .map_or(&[][..], |o| o.groups(j * ng..(j + 1) * ng, buf))
    }

    /// Row `j`'s int8 values: the matrix's own, or unpacked into `scratch` (from
    /// [`QMatrix::scratch`]).
    pub(super) fn row<'a>(&'a self, j: usize, scratch: &'a mut [i8]) -> &'a [i8] {
        let k = self.cols;
        match &self.values {
            Values::Int8(qs) => &qs[j * k..(j + 1) * k],
            Values::Packed(p, bytes) => {
                let rb = p.row_bytes(k);
                unpack(&bytes[j * rb..(j + 1) * rb], &mut scratch[..k], *p);
                &scratch[..k]
            }
        }
    }

    /// Room for a row unpacked where the values are packed (nothing otherwise).
    pub(super) fn scratch(&self) -> Vec<i8> {
        match self.values {
            Values::Int8(_) => Vec::new(),
            Values::Packed(..) => vec![0; self.cols],
        }
    }

    /// A matrix of int8 values `qs` (`rows × cols`) with a scale per `group` (16 or 32)
    /// values and no offsets, as [`QMatrix::load`] leaves one: for the kernel checks.
    pub(super) fn from_parts(
        qs: Vec<i8>,
        scales: Vec<f32>,
        group: usize,
        rows: usize,
        cols: usize,
    ) -> Self {
        assert!(qs.len() == rows * cols && scales.len() * group == qs.len());
        Self {
            values: Values::Int8(qs),
            scales: Scales::F32(scales),
            offsets: None,
            group,
            rows,
            cols,
            stats: OnceLock::new(),
        }
    }

    /// Rows `ids`, dequantized and times `scale`.
    pub fn rows_f32(&self, ids: &[u32], scale: f32) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(ids.len() * self.cols);
        let (mut scratch, mut buf, mut obuf) = (self.scratch(), Vec::new(), Vec::new());
        for &id in ids {
            let r = id as usize;
            if r >= self.rows {
                return Err(Error::InvalidArgument(format!(
                    "token id {id} is outside the vocabulary of {} tokens",
                    self.rows
                )));
            }
            let row = self.row(r, &mut scratch);
            let scales = self.row_scales(r, &mut buf);
            let offsets = self.row_offsets(r, &mut obuf);
            for (g, &s) in scales.iter().enumerate() {
                let o = offsets.get(g).copied().unwrap_or(0.0);
                let q = &row[g * self.group..(g + 1) * self.group];
                out.extend(q.iter().map(|&q| (f32::from(q) * s - o) * scale));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::decode::unpacker;
    use super::super::dispatch::has_fast_u7;
    use super::super::load::tests::load_layer;
    use super::super::load::{keeps_int8, LOAD_CHUNK_BLOCKS};
    use super::*;
    use crate::gguf::{now, GgmlType, SyncReads};
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    /// Every layout a matrix may be held in gives the int8 rows and products of int8 values
    /// with f32 scales, bit for bit: the 4-bit types and Q5_0 packed (the five-bit layout,
    /// every tail of a unit: 16 and 32 blocks a row) or not, and the scales as the file's
    /// f16 (negative ones too) or f32; on one activation row (rows from four places at once,
    /// on scales converted a span at a time where no kernel reads f16), on a prompt, and
    /// through the pool. What this build holds is what `resident_bytes` counts, as a layer
    /// and as an LM head.
    #[test]
    fn every_layout_equals_int8_with_f32_scales_bit_for_bit() {
        let mut rng = crate::rng::Rng::new(9);
        // 38 rows: decode tiles of 4 and of 2 rows.
        for (rows, cols) in [(38, 512), (333, 1024)] {
            let w: Vec<f32> = (0..rows * cols).map(|_| rng.normal()).collect();
            let wt = Tensor::from_vec(w, (rows, cols), &Device::Cpu).unwrap();
            for (dt, ty) in [
                (GgmlDType::Q4_0, GgmlType::Q4_0),
                (GgmlDType::Q4_1, GgmlType::Q4_1),
                (GgmlDType::Q4K, GgmlType::Q4_K),
                (GgmlDType::Q5_0, GgmlType::Q5_0),
                (GgmlDType::Q8_0, GgmlType::Q8_0),
                (GgmlDType::Q2K, GgmlType::Q2_K),
                (GgmlDType::Q3K, GgmlType::Q3_K),
                (GgmlDType::Q5K, GgmlType::Q5_K),
                (GgmlDType::Q6K, GgmlType::Q6_K),
            ] {
                let bytes = QTensor::quantize(&wt, dt)
                    .unwrap()
                    .data()
                    .unwrap()
                    .into_owned();
                let load = |int8, layout| load_layer(&bytes, rows, cols, ty, int8, layout);
                let plain = load(true, ScaleLayout::F32);
                assert!(!plain.is_packed() && matches!(plain.scales, Scales::F32(_)));
                let u = unpacker(ty).unwrap();
                // The file's own layout of the scales, where the type has one: its f16, or a
                // K-quant's units and codes.
                let file = if u.f16_scale.is_some() && !u.offsets {
                    ScaleLayout::F16 { signed: true }
                } else if u.units.is_some() {
                    ScaleLayout::Coded
                } else {
                    ScaleLayout::F32
                };
                let mut held_as = Vec::new();
                for int8 in [true, false] {
                    if !int8 && u.pack.is_none() {
                        continue;
                    }
                    for layout in [ScaleLayout::F32, file] {
                        let m = load(int8, layout);
                        assert_eq!(m.is_packed(), !int8, "{ty}");
                        let kept = match (&m.scales, layout) {
                            (Scales::F32(_), ScaleLayout::F32) => true,
                            (Scales::F16 { signed, .. }, ScaleLayout::F16 { .. }) => *signed,
                            (Scales::Coded { .. }, ScaleLayout::Coded) => {
                                u.offsets == matches!(m.offsets, Some(Scales::Coded { .. }))
                            }
                            _ => false,
                        };
                        assert!(kept, "{ty}: {layout:?} not kept");
                        held_as.push(m);
                    }
                }
                let ids: Vec<u32> = (0..rows as u32).collect();
                let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
                let want_rows = bits(plain.rows_f32(&ids, 1.0).unwrap());
                let xs: Vec<(usize, Vec<f32>)> = [1, 3, 7]
                    .into_iter()
                    .map(|m| (m, (0..m * cols).map(|_| rng.normal() * 3.0).collect()))
                    .collect();
                let want: Vec<_> = xs.iter().map(|(m, x)| bits(plain.matmul(x, *m))).collect();
                for m in &held_as {
                    let what = format!("{ty}, packed {}, {:?}", m.is_packed(), m.scales.len());
                    assert_eq!(
                        bits(m.rows_f32(&ids, 1.0).unwrap()),
                        want_rows,
                        "{what}: rows"
                    );
                    for ((k, x), want) in xs.iter().zip(&want) {
                        assert_eq!(&bits(m.matmul(x, *k)), want, "{what}: {k} rows");
                    }
                }
                let n = (rows * cols) as u64;
                let held = |m: &QMatrix| {
                    let values = match &m.values {
                        Values::Packed(_, b) => b.len(),
                        Values::Int8(q) => q.len(),
                    };
                    let offsets = m.offsets.as_ref().map_or(0, Scales::bytes);
                    (values + m.scales.bytes() + offsets) as u64
                };
                // What this build holds for it as a layer and as an LM head (int8 values
                // where its filter can run: no offsets).
                for head in [false, true] {
                    let m = now(QMatrix::load_with(
                        &SyncReads(&bytes),
                        0,
                        rows,
                        cols,
                        ty,
                        head,
                    ))
                    .unwrap()
                    .unwrap();
                    let filter = has_fast_u7();
                    assert_eq!(m.is_packed(), !keeps_int8(&u, head, filter), "{ty}");
                    assert_eq!(
                        Some(held(&m)),
                        QMatrix::resident_bytes(ty, cols as u64, n, head),
                        "{ty}, head {head}"
                    );
                }
            }
        }
    }

    /// A Q5_0 matrix whose f16 scales are not all finite (an infinite one in a later chunk,
    /// after f16 ones were kept) keeps f32 scales, with the same rows: both packed, as the
    /// five-bit kernel reads them, and as int8.
    #[test]
    fn f16_scales_that_are_not_finite_become_f32() {
        let mut rng = crate::rng::Rng::new(6);
        let (rows, cols) = (LOAD_CHUNK_BLOCKS + 5, 64);
        let w: Vec<f32> = (0..rows * cols).map(|_| rng.normal()).collect();
        let wt = Tensor::from_vec(w, (rows, cols), &Device::Cpu).unwrap();
        let mut bytes = QTensor::quantize(&wt, GgmlDType::Q5_0)
            .unwrap()
            .data()
            .unwrap()
            .into_owned();
        // The last block (22 bytes: d first) with d = −inf.
        let last = bytes.len() - 22;
        bytes[last..last + 2].copy_from_slice(&0xFC00u16.to_le_bytes());
        let load = |int8, layout| load_layer(&bytes, rows, cols, GgmlType::Q5_0, int8, layout);
        let plain = load(true, ScaleLayout::F32);
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        let ids: Vec<u32> = (0..rows as u32).collect();
        for int8 in [true, false] {
            let asked = load(int8, ScaleLayout::F16 { signed: true });
            assert!(matches!(asked.scales, Scales::F32(_)));
            assert_eq!(
                bits(asked.rows_f32(&ids, 1.0).unwrap()),
                bits(plain.rows_f32(&ids, 1.0).unwrap())
            );
        }
    }

    /// K-quant blocks whose unit is ±0, ±∞ or NaN (a file's, not a quantizer's) keep coded
    /// scales and offsets that give the f32 layout's values bit for bit, a zero scale's sign
    /// too (a value no code gives would make the matrix f32: [`Scales::append`]).
    #[test]
    fn coded_scales_of_any_unit_give_the_f32_values() {
        let mut rng = crate::rng::Rng::new(8);
        let (rows, cols) = (LOAD_CHUNK_BLOCKS / 2 + 3, 512);
        let w: Vec<f32> = (0..rows * cols).map(|_| rng.normal()).collect();
        let wt = Tensor::from_vec(w, (rows, cols), &Device::Cpu).unwrap();
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        let ids: Vec<u32> = (0..rows as u32).collect();
        let x: Vec<f32> = (0..3 * cols).map(|_| rng.normal()).collect();
        // (type, block bytes, where d is, where dmin is)
        for (dt, ty, bb, d, dmin) in [
            (GgmlDType::Q6K, GgmlType::Q6_K, 210, 208, None),
            (GgmlDType::Q4K, GgmlType::Q4_K, 144, 0, Some(2)),
            (GgmlDType::Q2K, GgmlType::Q2_K, 84, 80, Some(82)),
        ] {
            let mut bytes = QTensor::quantize(&wt, dt)
                .unwrap()
                .data()
                .unwrap()
                .into_owned();
            let n_blocks = bytes.len() / bb;
            for (blk, unit) in [
                (1, 0x0000u16),
                (2, 0x8000),
                (3, 0x7C00),
                (n_blocks - 1, 0xFC00),
                (5, 0x7E01),
            ] {
                for at in [Some(d), dmin].into_iter().flatten() {
                    bytes[blk * bb + at..blk * bb + at + 2].copy_from_slice(&unit.to_le_bytes());
                }
            }
            let load = |layout| load_layer(&bytes, rows, cols, ty, true, layout);
            let (plain, coded) = (load(ScaleLayout::F32), load(ScaleLayout::Coded));
            // Each of these units times a code gives its values (a NaN unit its own NaN).
            assert!(matches!(coded.scales, Scales::Coded { .. }), "{ty}");
            assert_eq!(
                bits(coded.rows_f32(&ids, 1.0).unwrap()),
                bits(plain.rows_f32(&ids, 1.0).unwrap()),
                "{ty}"
            );
            for m in [1, 3] {
                let x = &x[..m * cols];
                assert_eq!(
                    bits(coded.matmul(x, m)),
                    bits(plain.matmul(x, m)),
                    "{ty}: {m} rows"
                );
            }
        }
    }
}
