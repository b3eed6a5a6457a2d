// NeoX rotary embedding: in each head, element i pairs with i + head_dim/2, rotated by the
// angle of row t's position. cos/sin come from the CPU (computed in f64, as the CPU backend
// does), `half` values per row each.
struct Params {
    width: u32,
    head_dim: u32,
    n_tok: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> cs: array<vec2<f32>>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let half = p.head_dim / 2u;
    let pairs_per_row = p.width / 2u;
    let idx = gid.x;
    if (idx >= p.n_tok * pairs_per_row) {
        return;
    }
    let t = idx / pairs_per_row;
    let r = idx % pairs_per_row;
    let head = r / half;
    let i = r % half;
    let a = t * p.width + head * p.head_dim + i;
    let b = a + half;
    let c = cs[t * half + i];
    let x0 = x[a];
    let x1 = x[b];
    out[a] = x0 * c.x - x1 * c.y;
    out[b] = x0 * c.y + x1 * c.x;
}
