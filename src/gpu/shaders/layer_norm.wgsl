// LayerNorm of each row of `len` values, (x - mean) / sqrt(var + eps) * w + b (encoders):
// one workgroup per row; the mean, then the variance around it, by two reductions.
struct Params {
    len: u32,
    n_rows: u32,
    eps: f32,
    groups_x: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> wv: array<f32>;
@group(0) @binding(2) var<storage, read> bv: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

var<workgroup> partial: array<f32, 64>;

// The sum of every invocation's `v` (all 64 call it).
fn total(li: u32, v: f32) -> f32 {
    partial[li] = v;
    workgroupBarrier();
    for (var step = 32u; step > 0u; step /= 2u) {
        if (li < step) {
            partial[li] += partial[li + step];
        }
        workgroupBarrier();
    }
    let t = partial[0];
    workgroupBarrier();
    return t;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let g = wid.x + wid.y * p.groups_x;
    let live = g < p.n_rows;
    let base = g * p.len;
    var s = 0.0;
    if (live) {
        for (var i = li; i < p.len; i += 64u) {
            s += x[base + i];
        }
    }
    let mean = total(li, s) / f32(p.len);
    var ss = 0.0;
    if (live) {
        for (var i = li; i < p.len; i += 64u) {
            let d = x[base + i] - mean;
            ss += d * d;
        }
    }
    let variance = total(li, ss) / f32(p.len);
    if (!live) {
        return;
    }
    let r = 1.0 / sqrt(variance + p.eps);
    for (var i = li; i < p.len; i += 64u) {
        out[base + i] = (x[base + i] - mean) * r * wv[i] + bv[i];
    }
}
