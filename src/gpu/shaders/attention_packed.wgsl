// Bidirectional attention within packed sequences (an encoder's batch, no cache): for query
// row t and head h, the softmax over the keys of t's own sequence, rows bounds[2t] up to
// bounds[2t + 1], in one pass (a running maximum and sum). One invocation per (t, h).
struct Params {
    n_tok: u32,
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    scale: f32,
    groups_x: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read> bounds: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

// The most values per head (the Rust side checks).
const HEAD_DIM_MAX: u32 = 256u;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = (wid.x + wid.y * p.groups_x) * 64u + li;
    if (i >= p.n_tok * p.n_head) {
        return;
    }
    let t = i / p.n_head;
    let h = i % p.n_head;
    let kh = h / (p.n_head / p.n_head_kv);
    let qo = t * p.n_head * p.head_dim + h * p.head_dim;
    let kw = p.n_head_kv * p.head_dim;
    var acc: array<f32, HEAD_DIM_MAX>;
    var m = -3.0e38;
    var s = 0.0;
    for (var j = bounds[2u * t]; j < bounds[2u * t + 1u]; j++) {
        let ko = j * kw + kh * p.head_dim;
        var dot = 0.0;
        for (var d = 0u; d < p.head_dim; d++) {
            dot += q[qo + d] * k[ko + d];
        }
        let sc = dot * p.scale;
        let m2 = max(m, sc);
        let f = exp(m - m2);
        let e = exp(sc - m2);
        s = s * f + e;
        for (var d = 0u; d < p.head_dim; d++) {
            acc[d] = acc[d] * f + e * v[ko + d];
        }
        m = m2;
    }
    let inv = 1.0 / s;
    for (var d = 0u; d < p.head_dim; d++) {
        out[qo + d] = acc[d] * inv;
    }
}
