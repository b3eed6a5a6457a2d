// RMS-normalise each group of `len` values of x and multiply by the weight vector (the same
// for every group): one workgroup per group. With `add`, the residual `res` is added to the
// result (x + post-norm(a) in one pass; otherwise `res` is bound but not read).
struct Params {
    len: u32,
    n_groups: u32,
    eps: f32,
    groups_x: u32,
    add: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> wv: array<f32>;
@group(0) @binding(2) var<storage, read> res: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

var<workgroup> partial: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let g = wid.x + wid.y * p.groups_x;
    let base = g * p.len;
    var ss = 0.0;
    if (g < p.n_groups) {
        for (var i = li; i < p.len; i += 64u) {
            let v = x[base + i];
            ss += v * v;
        }
    }
    partial[li] = ss;
    workgroupBarrier();
    for (var step = 32u; step > 0u; step /= 2u) {
        if (li < step) {
            partial[li] += partial[li + step];
        }
        workgroupBarrier();
    }
    if (g >= p.n_groups) {
        return;
    }
    let r = 1.0 / sqrt(partial[0] / f32(p.len) + p.eps);
    for (var i = li; i < p.len; i += 64u) {
        var v = x[base + i] * r * wv[i];
        if (p.add != 0u) {
            v += res[base + i];
        }
        out[base + i] = v;
    }
}
