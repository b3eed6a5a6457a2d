//! The block types the 8-bit path takes, as the file lays them out (GGML's blocks), their
//! scalar dots with an activation row (the reference for the SIMD kernels) and rows
//! dequantized (an embedding table's lookups).

use super::act::ActRow;
use crate::gguf::GgmlType;

/// Values in a K-quant super-block.
pub const QK_K: usize = 256;

/// A weight type of the 8-bit path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Q4_0,
    Q5_0,
    Q8_0,
    Q4K,
    Q6K,
}

impl Kind {
    /// The kind of a file type, if this path takes it (the others stay on the exact path).
    pub fn of(ty: GgmlType) -> Option<Self> {
        Some(match ty {
            GgmlType::Q4_0 => Kind::Q4_0,
            GgmlType::Q5_0 => Kind::Q5_0,
            GgmlType::Q8_0 => Kind::Q8_0,
            GgmlType::Q4_K => Kind::Q4K,
            GgmlType::Q6_K => Kind::Q6K,
            _ => return None,
        })
    }

    /// Values per block.
    pub fn block_len(self) -> usize {
        match self {
            Kind::Q4K | Kind::Q6K => QK_K,
            _ => 32,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Kind::Q4_0 => 18,
            Kind::Q5_0 => 22,
            Kind::Q8_0 => 34,
            Kind::Q4K => 144,
            Kind::Q6K => 210,
        }
    }

    /// Whether its products need the activations' sums of each 16 codes (the K-quants).
    pub fn k_activations(self) -> bool {
        self.block_len() == QK_K
    }

    /// The scalar dot of one weight row (its blocks, `w`) with one activation row.
    pub fn dot(self, w: &[u8], x: &ActRow) -> f32 {
        let (bl, bb) = (self.block_len(), self.block_bytes());
        let mut sum = 0f32;
        let mut v = [0i8; QK_K];
        for (b, blk) in w.chunks_exact(bb).enumerate() {
            let xq = &x.q[b * bl..(b + 1) * bl];
            match self {
                Kind::Q4_0 | Kind::Q5_0 | Kind::Q8_0 => {
                    self.values(blk, &mut v);
                    let s: i32 = v[..32]
                        .iter()
                        .zip(xq)
                        .map(|(&a, &b)| i32::from(a) * i32::from(b))
                        .sum();
                    sum += f16(blk, 0) * x.d[b] * s as f32;
                }
                Kind::Q4K => {
                    // D · (d · Σ_j sc_j·s_j·Σ q·x − dmin · Σ_j m_j·s_j·Σx), in integers but for
                    // the units (the activations' two-level scales: D per block, s_j per 32).
                    self.values(blk, &mut v);
                    let (sc, m) = q4k_scales(blk);
                    let (mut si, mut sm) = (0i64, 0i64);
                    for j in 0..8 {
                        let s: i64 = v[32 * j..32 * j + 32]
                            .iter()
                            .zip(&xq[32 * j..])
                            .map(|(&a, &b)| i64::from(a) * i64::from(b))
                            .sum();
                        let step = i64::from(x.steps[b * 8 + j]);
                        let bs = &x.bsums[b * 16 + 2 * j..];
                        si += i64::from(sc[j]) * step * s;
                        sm += i64::from(m[j]) * step * (i64::from(bs[0]) + i64::from(bs[1]));
                    }
                    sum += x.units[b] * (f16(blk, 0) * si as f32 - f16(blk, 2) * sm as f32);
                }
                Kind::Q6K => {
                    // D · d · Σ_j sc_j·s_(j/2)·Σ q·x over the sub-blocks j of 16.
                    self.values(blk, &mut v);
                    let mut si = 0i64;
                    for j in 0..16 {
                        let s: i64 = v[16 * j..16 * j + 16]
                            .iter()
                            .zip(&xq[16 * j..])
                            .map(|(&a, &b)| i64::from(a) * i64::from(b))
                            .sum();
                        si += i64::from(blk[192 + j] as i8) * i64::from(x.steps[b * 8 + j / 2]) * s;
                    }
                    sum += x.units[b] * f16(blk, 208) * si as f32;
                }
            }
        }
        sum
    }

    /// A block's integer values (`block_len` of `v`): the signed codes, before any scale.
    fn values(self, blk: &[u8], v: &mut [i8; QK_K]) {
        match self {
            Kind::Q4_0 => {
                for j in 0..16 {
                    v[j] = (blk[2 + j] & 15) as i8 - 8;
                    v[j + 16] = (blk[2 + j] >> 4) as i8 - 8;
                }
            }
            Kind::Q5_0 => {
                let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
                for j in 0..16 {
                    let h0 = ((qh >> j) << 4) & 0x10;
                    let h1 = (qh >> (j + 12)) & 0x10;
                    v[j] = ((u32::from(blk[6 + j] & 15) | h0) as i8) - 16;
                    v[j + 16] = ((u32::from(blk[6 + j] >> 4) | h1) as i8) - 16;
                }
            }
            Kind::Q8_0 => {
                for j in 0..32 {
                    v[j] = blk[2 + j] as i8;
                }
            }
            Kind::Q4K => {
                let qs = &blk[16..144];
                for c in 0..4 {
                    for l in 0..32 {
                        v[64 * c + l] = (qs[32 * c + l] & 15) as i8;
                        v[64 * c + 32 + l] = (qs[32 * c + l] >> 4) as i8;
                    }
                }
            }
            Kind::Q6K => {
                for h in 0..2 {
                    let ql = &blk[64 * h..];
                    let qh = &blk[128 + 32 * h..];
                    let v = &mut v[128 * h..];
                    for l in 0..32 {
                        v[l] = ((ql[l] & 15) | ((qh[l] & 3) << 4)) as i8 - 32;
                        v[l + 32] = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                        v[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                        v[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
                    }
                }
            }
        }
    }

    /// A row's values (`out`: the row's width) as llama.cpp dequantizes them.
    pub fn dequantize(self, w: &[u8], out: &mut [f32]) {
        let (bl, bb) = (self.block_len(), self.block_bytes());
        let mut v = [0i8; QK_K];
        for (blk, o) in w.chunks_exact(bb).zip(out.chunks_exact_mut(bl)) {
            self.values(blk, &mut v);
            match self {
                Kind::Q4_0 | Kind::Q5_0 | Kind::Q8_0 => {
                    let d = f16(blk, 0);
                    for (o, &q) in o.iter_mut().zip(&v) {
                        *o = f32::from(q) * d;
                    }
                }
                Kind::Q4K => {
                    let (sc, m) = q4k_scales(blk);
                    let (d, dmin) = (f16(blk, 0), f16(blk, 2));
                    for j in 0..8 {
                        let (s, mn) = (d * f32::from(sc[j]), dmin * f32::from(m[j]));
                        for i in 32 * j..32 * j + 32 {
                            o[i] = s * f32::from(v[i]) - mn;
                        }
                    }
                }
                Kind::Q6K => {
                    let d = f16(blk, 208);
                    for (i, o) in o.iter_mut().enumerate() {
                        *o = d * f32::from(blk[192 + i / 16] as i8) * f32::from(v[i]);
                    }
                }
            }
        }
    }
}

/// The f16 at byte `at` of a block, as f32.
pub(super) fn f16(blk: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([blk[at], blk[at + 1]])).to_f32()
}

/// A Q4_K block's eight 6-bit scales and minimums (GGML's `get_scale_min_k4`).
pub(super) fn q4k_scales(blk: &[u8]) -> ([u8; 8], [u8; 8]) {
    let q = &blk[4..16];
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        if j < 4 {
            sc[j] = q[j] & 63;
            m[j] = q[j + 4] & 63;
        } else {
            sc[j] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
            m[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        }
    }
    (sc, m)
}
