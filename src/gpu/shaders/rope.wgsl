// Rotary embedding: in each head, NeoX pairs element i with i + head_dim/2, normal (GPT-J)
// pairs 2i with 2i + 1; pair i of row t turns by the angle of t's position. cos/sin come
// from the CPU (computed in f64, as the CPU backend does), `half` pairs per row.
struct Params {
    width: u32,
    head_dim: u32,
    n_tok: u32,
    neox: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> cs: array<vec2<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let half = p.head_dim / 2u;
    let pairs_per_row = p.width / 2u;
    let idx = (wid.x + wid.y * nw.x) * 64u + li;
    if (idx >= p.n_tok * pairs_per_row) {
        return;
    }
    let t = idx / pairs_per_row;
    let r = idx % pairs_per_row;
    let head = r / half;
    let i = r % half;
    var a = t * p.width + head * p.head_dim + i;
    var b = a + half;
    if (p.neox == 0u) {
        a = t * p.width + head * p.head_dim + 2u * i;
        b = a + 1u;
    }
    let c = cs[t * half + i];
    let x0 = x[a];
    let x1 = x[b];
    out[a] = x0 * c.x - x1 * c.y;
    out[b] = x0 * c.y + x1 * c.x;
}
