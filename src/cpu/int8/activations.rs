//! Activation rows quantized to 16 bits per block of 32 values ([`Activations`]), as every
//! product takes them; a prompt's rows over the pool.

use super::dispatch::quantize_block;
use super::scale::QK;
use crate::cpu::pool::{self, SharedOut};

/// Activation rows quantized to 16 bits per 32-value block: scale = max|x| / 32 767.
pub(super) struct Activations {
    pub(super) m: usize,
    pub(super) q: Vec<i16>,
    pub(super) d: Vec<f32>,
}

impl Activations {
    /// Each block of 32 values: scale = max|x| / 32 767, q = round(x / scale) (halves away
    /// from zero); a prompt's rows over the pool.
    pub(super) fn quantize(x: &[f32], m: usize, k: usize) -> Self {
        let mut q = vec![0i16; m * k];
        let mut d = vec![0f32; m * k / QK];
        let (qo, dout) = (SharedOut::new(&mut q), SharedOut::new(&mut d));
        let n_blocks = m * k / QK;
        // A value costs about as much as 8 of the kernels' multiply-adds.
        pool::for_chunks(
            n_blocks.div_ceil(QUANTIZE_BLOCKS),
            x.len().saturating_mul(8),
            |items| {
                let blocks =
                    items.start * QUANTIZE_BLOCKS..(items.end * QUANTIZE_BLOCKS).min(n_blocks);
                // SAFETY: the item ranges are disjoint, so these blocks of `q` and `d` are this
                // item's alone, in bounds, and both outlive `for_chunks`.
                let (qs, ds) = unsafe {
                    (
                        qo.part(blocks.start * QK, blocks.len() * QK),
                        dout.part(blocks.start, blocks.len()),
                    )
                };
                let (xs, _) = x[blocks.start * QK..blocks.end * QK].as_chunks::<QK>();
                for ((xs, qs), d) in xs.iter().zip(qs.as_chunks_mut::<QK>().0).zip(ds) {
                    *d = quantize_block(xs, qs);
                }
            },
        );
        Self { m, q, d }
    }

    /// Σx over each group of `n` values (16 or 32), from the quantized values (scale · Σq):
    /// what weights with offsets subtract.
    pub(super) fn group_sums(&self, n: usize) -> Vec<f32> {
        self.q
            .chunks_exact(n)
            .enumerate()
            .map(|(g, v)| v.iter().map(|&v| i32::from(v)).sum::<i32>() as f32 * self.d[g * n / QK])
            .collect()
    }
}

/// Activation blocks per work item of [`Activations::quantize`].
const QUANTIZE_BLOCKS: usize = 64;

#[cfg(test)]
mod tests {
    use super::super::portable::round_to_i16;

    /// `round_to_i16` is `f32::round` then `as i16` for every value: a stride through all
    /// bit patterns (NaN, ±∞, subnormals, the whole range), and every float within 64 ulps of
    /// each half in and beyond the 16-bit range.
    #[test]
    fn rounding_to_i16_equals_the_library_round() {
        let check = |v: f32| {
            assert_eq!(
                round_to_i16(v),
                v.round() as i16,
                "{v} ({:#x})",
                v.to_bits()
            );
        };
        for bits in (0..=u32::MAX).step_by(251) {
            check(f32::from_bits(bits));
        }
        for h in -33_000..33_000 {
            let half = h as f32 + 0.5;
            for d in -64i32..=64 {
                check(f32::from_bits(half.to_bits().wrapping_add_signed(d)));
            }
        }
        for v in [
            0.0,
            -0.0,
            0.5,
            -0.5,
            0.49999997,
            -0.49999997,
            32767.5,
            -32768.5,
            8388607.5,
        ] {
            check(v);
        }
        for v in [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN,
            1e10,
            -1e10,
        ] {
            check(v);
        }
    }
}
