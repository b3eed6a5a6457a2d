// Q5_K as stored (176 bytes, 4-byte aligned: 44 words per 256 weights): d and dmin as two
// f16 in word 0, 12 bytes of 6-bit scales and mins (as Q4_K), 32 bytes of high bits (bit
// `sub` of byte l is weight l of sub-block sub), 128 bytes of low nibbles (as Q4_K).
const Q5_K_WORDS: u32 = 44u;

fn q5k_byte(base: u32, i: u32) -> u32 {
    return (w[base + i / 4u] >> (8u * (i % 4u))) & 0xffu;
}

// 6-bit scale and min of sub-block j (bytes 4..16 of the block).
fn q5k_scale_min(base: u32, j: u32) -> vec2<u32> {
    if (j < 4u) {
        return vec2<u32>(q5k_byte(base, 4u + j) & 63u, q5k_byte(base, 8u + j) & 63u);
    }
    return vec2<u32>(
        (q5k_byte(base, 8u + j) & 0xfu) | ((q5k_byte(base, j) >> 6u) << 4u),
        (q5k_byte(base, 8u + j) >> 4u) | ((q5k_byte(base, 4u + j) >> 6u) << 4u),
    );
}

fn subdot(row: u32, sub: u32, xbase: u32) -> f32 {
    let sb = sub / 8u;
    let j = sub % 8u;
    let base = (row * (p.k / 256u) + sb) * Q5_K_WORDS;
    let dm = unpack2x16float(w[base]);
    let sm = q5k_scale_min(base, j);
    // Sub-blocks 2t and 2t + 1 share 32 bytes of nibbles: low, then high.
    let qbase = base + 12u + (j / 2u) * 8u;
    let shift = (j % 2u) * 4u;
    var acc = 0.0;
    var xsum = 0.0;
    for (var t = 0u; t < 8u; t++) {
        let lo = (w[qbase + t] >> shift) & 0x0f0f0f0fu;
        let hi = ((w[base + 4u + t] >> j) & 0x01010101u) << 4u;
        let qv = vec4<f32>(unpack4xU8(lo | hi));
        let xv = vec4<f32>(x[xbase + 4u * t], x[xbase + 4u * t + 1u], x[xbase + 4u * t + 2u], x[xbase + 4u * t + 3u]);
        acc += dot(qv, xv);
        xsum += xv.x + xv.y + xv.z + xv.w;
    }
    return dm.x * f32(sm.x) * acc - dm.y * f32(sm.y) * xsum;
}

fn deq(row: u32, i: u32) -> f32 {
    let sub = i / 32u;
    let sb = sub / 8u;
    let j = sub % 8u;
    let l = i % 32u;
    let base = (row * (p.k / 256u) + sb) * Q5_K_WORDS;
    let dm = unpack2x16float(w[base]);
    let sm = q5k_scale_min(base, j);
    let lo = (q5k_byte(base, 48u + (j / 2u) * 32u + l) >> ((j % 2u) * 4u)) & 0xfu;
    let hi = ((q5k_byte(base, 16u + l) >> j) & 1u) << 4u;
    return dm.x * f32(sm.x) * f32(lo | hi) - dm.y * f32(sm.y);
}
