// The matrix product for software adapters (lavapipe, SwiftShader): one thread per output
// row, no workgroup memory and no barriers, which CPU emulations run as plain SIMD loops
// (matvec.wgsl and matmat.wgsl are for real GPUs). Same bindings; the params name a slice
// of `m` activation rows from `m0` (llvmpipe ends an invocation's loops after ~65 535
// iterations in all, so the host keeps slices short).
struct Params {
    k: u32,
    n_rows: u32,
    row0: u32,
    n: u32,
    m: u32,
    groups_x: u32,
    m0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = (wid.x + wid.y * p.groups_x) * 64u + li;
    if (row >= p.n_rows) {
        return;
    }
    let n_sub = p.k / 32u;
    for (var i = p.m0; i < p.m0 + p.m; i++) {
        var acc = 0.0;
        for (var s = 0u; s < n_sub; s++) {
            acc += subdot(row, s, i * p.k + s * 32u);
        }
        y[i * p.n + p.row0 + row] = acc;
    }
}
