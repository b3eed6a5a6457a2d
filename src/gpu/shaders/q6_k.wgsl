// Q6_K, repacked to 212 bytes (53 words) per 256 weights: 128 bytes of low nibbles, 64 of
// high 2-bit pairs, 16 signed 8-bit scales, d as f16, 2 bytes of padding. Sub-block `sub`
// (of 32 weights) is sub % 8 of super-block sub / 8; each half of 128 weights has 4 of them.
const Q6_K_WORDS: u32 = 53u;

fn q6k_byte(base: u32, i: u32) -> u32 {
    return (w[base + i / 4u] >> (8u * (i % 4u))) & 0xffu;
}

fn subdot(row: u32, sub: u32, xbase: u32) -> f32 {
    let sb = sub / 8u;
    let j = sub % 8u;
    let base = (row * (p.k / 256u) + sb) * Q6_K_WORDS;
    let d = unpack2x16float(w[base + 52u]).x;
    let half = j / 4u;       // which 128 weights
    let quarter = j % 4u;    // which 32 of them
    // ql: 64 bytes per half; quarters 0/2 use the low nibbles of bytes 0..32 / 32..64 of
    // the half, quarters 1/3... as ggml: q1 = ql[l] lo, q2 = ql[l + 32] lo, q3 = ql[l] hi,
    // q4 = ql[l + 32] hi, with qh[l] bits 0-1, 2-3, 4-5, 6-7.
    let ql0 = half * 64u + (quarter % 2u) * 32u;
    let ql_shift = (quarter / 2u) * 4u;
    let qh0 = 128u + half * 32u;
    let qh_shift = quarter * 2u;
    var acc0 = 0.0;
    var acc1 = 0.0;
    for (var l = 0u; l < 32u; l++) {
        let lo = (q6k_byte(base, ql0 + l) >> ql_shift) & 0xfu;
        let hi = (q6k_byte(base, qh0 + l) >> qh_shift) & 3u;
        let q = f32(i32(lo | (hi << 4u)) - 32);
        if (l < 16u) {
            acc0 += q * x[xbase + l];
        } else {
            acc1 += q * x[xbase + l];
        }
    }
    // 16 scales per block: scale index = half * 8 + quarter * 2 + l / 16.
    let s0 = f32(i32(q6k_byte(base, 192u + half * 8u + quarter * 2u) << 24u) >> 24u);
    let s1 = f32(i32(q6k_byte(base, 193u + half * 8u + quarter * 2u) << 24u) >> 24u);
    return d * (s0 * acc0 + s1 * acc1);
}

fn deq(row: u32, i: u32) -> f32 {
    let sub = i / 32u;
    let sb = sub / 8u;
    let j = sub % 8u;
    let l = i % 32u;
    let base = (row * (p.k / 256u) + sb) * Q6_K_WORDS;
    let half = j / 4u;
    let quarter = j % 4u;
    let lo = (q6k_byte(base, half * 64u + (quarter % 2u) * 32u + l) >> ((quarter / 2u) * 4u)) & 0xfu;
    let hi = (q6k_byte(base, 128u + half * 32u + l) >> (quarter * 2u)) & 3u;
    let s = f32(i32(q6k_byte(base, 192u + half * 8u + quarter * 2u + l / 16u) << 24u) >> 24u);
    return unpack2x16float(w[base + 52u]).x * s * f32(i32(lo | (hi << 4u)) - 32);
}
