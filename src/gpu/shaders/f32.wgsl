// F32 weights (norm vectors, small test matrices): one word per weight.
fn subdot(row: u32, sub: u32, xbase: u32) -> f32 {
    let base = row * p.k + sub * 32u;
    var acc = 0.0;
    for (var j = 0u; j < 32u; j++) {
        acc += bitcast<f32>(w[base + j]) * x[xbase + j];
    }
    return acc;
}

fn deq(row: u32, i: u32) -> f32 {
    return bitcast<f32>(w[row * p.k + i]);
}
