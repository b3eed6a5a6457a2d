// BF16 weights as stored: two per word (rows are whole 32-weight runs, so words never
// straddle rows); a bf16 is the high half of an f32.
fn bf16_pair(v: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(v << 16u), bitcast<f32>(v & 0xffff0000u));
}

fn subdot(row: u32, sub: u32, xbase: u32) -> f32 {
    let base = (row * p.k + sub * 32u) / 2u;
    var acc = 0.0;
    for (var j = 0u; j < 16u; j++) {
        let h = bf16_pair(w[base + j]);
        acc += h.x * x[xbase + 2u * j] + h.y * x[xbase + 2u * j + 1u];
    }
    return acc;
}

fn deq(row: u32, i: u32) -> f32 {
    let e = row * p.k + i;
    let h = bf16_pair(w[e / 2u]);
    if (e % 2u == 0u) {
        return h.x;
    }
    return h.y;
}
