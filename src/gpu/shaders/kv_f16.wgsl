// Appended to the kernels that read or write keys and values (src/gpu/shaders.rs): the
// value the CPU backend's f16 cache holds for x (src/cpu/ops.rs `f32_to_f16`), bit for bit,
// as an f32 — x rounded to the nearest f16, ties to even, beyond its range the largest
// finite f16 of the same sign — so that both backends attend over the same keys and values.
// In integer operations: WGSL leaves the rounding of its own f16 conversions open.
fn kv_f16(x: f32) -> f32 {
    let b = bitcast<u32>(clamp(x, -65504.0, 65504.0));
    let sign = b & 0x80000000u;
    let a = b & 0x7FFFFFFFu;
    if (a >= 0x38800000u) {
        // A normal f16: the 13 mantissa bits it drops, rounded away.
        return bitcast<f32>(sign | ((a + 0xFFFu + ((a >> 13u) & 1u)) & 0xFFFFE000u));
    }
    // A subnormal f16: a multiple of 2^-24. |x| = m · 2^(e - 150), so |x| · 2^24 is m
    // shifted right by 126 - e; below 2^-25 it rounds to zero.
    let e = a >> 23u;
    if (e < 102u) {
        return bitcast<f32>(sign);
    }
    let m = (a & 0x7FFFFFu) | 0x800000u;
    let shift = 126u - e;
    let r = (m + (1u << (shift - 1u)) - 1u + ((m >> shift) & 1u)) >> shift;
    return bitcast<f32>(sign | bitcast<u32>(f32(r) * 5.9604645e-8));
}
