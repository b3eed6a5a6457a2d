// Q5_1, repacked to 7 words per 32 weights: the scale d and the minimum m as f32, the 32
// high bits, then 16 bytes of low nibbles (weight j in the low nibble of byte j, weight
// j + 16 in its high one); weight = d·q + m.
const Q5_1_WORDS: u32 = 7u;

fn subdot(row: u32, sub: u32, xbase: u32) -> f32 {
    let base = (row * (p.k / 32u) + sub) * Q5_1_WORDS;
    let d = bitcast<f32>(w[base]);
    let m = bitcast<f32>(w[base + 1u]);
    let qh = w[base + 2u];
    var acc = 0.0;
    var xsum = 0.0;
    for (var j = 0u; j < 4u; j++) {
        let qs = w[base + 3u + j];
        for (var b = 0u; b < 4u; b++) {
            let e = 4u * j + b;
            let byte = (qs >> (8u * b)) & 0xffu;
            let lo = (byte & 0xfu) | (((qh >> e) & 1u) << 4u);
            let hi = (byte >> 4u) | (((qh >> (e + 16u)) & 1u) << 4u);
            let x0 = x[xbase + e];
            let x1 = x[xbase + e + 16u];
            acc += f32(lo) * x0 + f32(hi) * x1;
            xsum += x0 + x1;
        }
    }
    return d * acc + m * xsum;
}

fn deq(row: u32, i: u32) -> f32 {
    let base = (row * (p.k / 32u) + i / 32u) * Q5_1_WORDS;
    let e = i % 32u;
    let qh = w[base + 2u];
    let byte = (w[base + 3u + (e % 16u) / 4u] >> (8u * (e % 4u))) & 0xffu;
    var q: u32;
    if (e < 16u) {
        q = (byte & 0xfu) | (((qh >> e) & 1u) << 4u);
    } else {
        q = (byte >> 4u) | (((qh >> e) & 1u) << 4u);
    }
    return bitcast<f32>(w[base]) * f32(q) + bitcast<f32>(w[base + 1u]);
}
