// out[t, :] = scale * W[ids[t] - row0, :] for the tokens whose row is in this weight part
// (one dispatch per part; rows of other parts are left alone). The type's `deq` is appended.
struct Params {
    k: u32,      // the row length (n_embd)
    n_rows: u32, // rows in this part
    row0: u32,   // the part's first row
    n_tok: u32,
    scale: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;
// Named by the weight type's `subdot`, which this kernel never calls (so the automatic
// layout leaves it out).
@group(0) @binding(4) var<storage, read> x: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let t = wid.x;
    if (t >= p.n_tok) {
        return;
    }
    let id = ids[t];
    if (id < p.row0 || id >= p.row0 + p.n_rows) {
        return;
    }
    for (var i = li; i < p.k; i += 64u) {
        out[t * p.k + i] = p.scale * deq(id - p.row0, i);
    }
}
