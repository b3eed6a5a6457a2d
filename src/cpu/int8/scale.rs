//! What every int8 kernel reads alike, whichever instruction set runs it: the activation
//! block ([`QK`]) and a weight scale as the 7-bit kernel ([`Scale`]) and the five-bit one
//! ([`BlockScale`]) take it. The kernels' files (portable.rs, avx2.rs, wasm.rs) import these
//! from here, a file below them, and nothing else of the folder but portable.rs.

/// Activation block (one f32 scale per 32 values).
pub(super) const QK: usize = 32;

/// A weight scale as the 7-bit kernel ([`dot_u7`](super::dispatch::dot_u7)) reads it: an f32, or an LM head's f16
/// bits, non-negative and finite ([`Scales::F16`](super::layout::Scales::F16)). The kernel splats [`Scale::bits`] as an
/// f32 per block and multiplies each row's sum by [`Scale::BACK`] at the end. For an f16 the
/// bits are the exponent and mantissa shifted into an f32's place, the scale times 2⁻¹¹²
/// exactly (normal or subnormal), and `BACK` is 2¹¹²: every product and sum is then the one
/// the f32 scales give times 2⁻¹¹², bit for bit (a result in the normal range rounds as its
/// 2¹¹²-fold does; one below it is a multiple of 2⁻¹⁴⁹, which an f32 subnormal holds
/// exactly). `check_kernels` compares the two. Two scalar instructions a block and row more
/// than an f32 (a 16-bit load and a shift), beside the SIMD ones, for half the bytes.
pub trait Scale: Copy + Send + Sync {
    /// What a row's sum is multiplied by (a power of two: exact).
    const BACK: f32;
    /// The bits splatted per block.
    fn bits(self) -> u32;
    /// The scale's value.
    #[inline(always)]
    fn value(self) -> f32 {
        f32::from_bits(self.bits()) * Self::BACK
    }
}

impl Scale for f32 {
    const BACK: f32 = 1.0;
    #[inline(always)]
    fn bits(self) -> u32 {
        self.to_bits()
    }
}

/// An f16 that is non-negative and finite (bits below 0x7C00: the LM head's scales as the
/// file has them). [`Scale::value`] is exact for normal and subnormal values alike
/// ([`f16_bits_to_f32`](super::decode::f16_bits_to_f32) without the sign and the
/// infinities). Tried in the kernels and slower than this (Node, relaxed build): a shuffle per
/// block from four scales converted as one vector (~50 → ~44 tok/s: registers spilled), the
/// tile's scales converted into a buffer first (53.5 → 49.0), a scalar conversion and
/// multiply per block (50.0 → 49.1).
impl Scale for u16 {
    const BACK: f32 = f32::from_bits(0x7780_0000);
    #[inline(always)]
    fn bits(self) -> u32 {
        u32::from(self) << 13
    }
}

/// A weight block's scale as the five-bit kernel reads it ([`wasm::dot_w5`](super::wasm::dot_w5)): an f32, or the
/// file's f16 of either sign, finite ([`Scales::F16`](super::layout::Scales::F16)). The f16's bits, sign-extended and
/// shifted into an f32's places with the three bits above its exponent cleared, are its
/// value times 2⁻¹¹² exactly (normal or subnormal); the block's activation scale is taken
/// times 2¹¹² (exact below 2¹⁶: activations below 2³¹), so the product the kernel forms is
/// the one the f32 scale gives, bit for bit (`check_kernels` compares them).
pub trait BlockScale: Copy {
    /// What the block's activation scale is multiplied by first (a power of two).
    const X: f32;
    /// The scale over [`BlockScale::X`], exactly.
    fn over_x(self) -> f32;
}

impl BlockScale for f32 {
    const X: f32 = 1.0;
    #[inline(always)]
    fn over_x(self) -> f32 {
        self
    }
}

impl BlockScale for u16 {
    const X: f32 = crate::cpu::ops::F16_UNSCALE;
    #[inline(always)]
    fn over_x(self) -> f32 {
        crate::cpu::ops::f16_scaled(self)
    }
}

#[cfg(test)]
mod tests {
    use super::super::decode::f16_bits_to_f32;
    use super::*;
    use half::f16;

    /// [`Scale::value`] of f16 bits is [`f16_bits_to_f32`] on every non-negative finite f16.
    #[test]
    fn unsigned_halves_convert_exactly() {
        for h in 0..0x7C00u16 {
            assert_eq!(h.value().to_bits(), f16_bits_to_f32(h).to_bits(), "{h:#x}");
        }
    }

    /// Every finite f16 as the five-bit kernel reads it ([`BlockScale`]), times an activation
    /// scale taken times 2¹¹², is the f16's value times that scale, bit for bit: normal and
    /// subnormal, both signs, products in the normal and the subnormal range.
    #[test]
    fn f16_block_scales_give_the_f32_products() {
        let xs = [
            1e-4f32, 3.1e-7, 0.75, 1.0, 4097.5, 1e-38, 6e-45, 0.0, 65000.0,
        ];
        for h in (0..=u16::MAX).filter(|h| h & 0x7FFF < 0x7C00) {
            let v = f16::from_bits(h).to_f32();
            for x in xs {
                let got = h.over_x() * (x * <u16 as BlockScale>::X);
                assert_eq!(got.to_bits(), (v * x).to_bits(), "f16 {h:#06x} × {x}");
            }
        }
    }
}
