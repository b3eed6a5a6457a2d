// Q8_0, repacked to 9 words per 32 weights: the scale as f32, then 32 signed bytes.
const Q8_0_WORDS: u32 = 9u;

fn subdot(row: u32, sub: u32, xbase: u32) -> f32 {
    let base = (row * (p.k / 32u) + sub) * Q8_0_WORDS;
    let d = bitcast<f32>(w[base]);
    var acc = 0.0;
    for (var j = 0u; j < 8u; j++) {
        let q = unpack4xI8(w[base + 1u + j]);
        let xv = vec4<f32>(x[xbase + 4u * j], x[xbase + 4u * j + 1u], x[xbase + 4u * j + 2u], x[xbase + 4u * j + 3u]);
        acc += dot(vec4<f32>(q), xv);
    }
    return d * acc;
}

// Weight `i` of row `row`, dequantized (the embedding gather).
fn deq(row: u32, i: u32) -> f32 {
    let base = (row * (p.k / 32u) + i / 32u) * Q8_0_WORDS;
    let j = i % 32u;
    let q = unpack4xI8(w[base + 1u + j / 4u]);
    return bitcast<f32>(w[base]) * f32(q[j % 4u]);
}
