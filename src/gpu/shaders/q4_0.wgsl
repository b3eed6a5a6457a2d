// Q4_0, repacked to 5 words per 32 weights: the scale as f32, then 16 bytes of nibbles
// (weight j in the low nibble of byte j, weight j + 16 in its high one), each minus 8.
const Q4_0_WORDS: u32 = 5u;

fn subdot(row: u32, sub: u32, xbase: u32) -> f32 {
    let base = (row * (p.k / 32u) + sub) * Q4_0_WORDS;
    let d = bitcast<f32>(w[base]);
    var acc = 0.0;
    for (var j = 0u; j < 4u; j++) {
        let qs = w[base + 1u + j];
        for (var b = 0u; b < 4u; b++) {
            let e = 4u * j + b;
            let byte = (qs >> (8u * b)) & 0xffu;
            let lo = i32(byte & 0xfu) - 8;
            let hi = i32(byte >> 4u) - 8;
            acc += f32(lo) * x[xbase + e] + f32(hi) * x[xbase + e + 16u];
        }
    }
    return d * acc;
}

fn deq(row: u32, i: u32) -> f32 {
    let base = (row * (p.k / 32u) + i / 32u) * Q4_0_WORDS;
    let e = i % 32u;
    let byte = (w[base + 1u + (e % 16u) / 4u] >> (8u * (e % 4u))) & 0xffu;
    var q: u32;
    if (e < 16u) {
        q = byte & 0xfu;
    } else {
        q = byte >> 4u;
    }
    return bitcast<f32>(w[base]) * f32(i32(q) - 8);
}
