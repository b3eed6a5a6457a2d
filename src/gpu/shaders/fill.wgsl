// out[i] = value for i < n (an empty KV cache: every slot's position -1).
struct Params {
    n: u32,
    value: u32,
    gx: u32,
    _pad: u32,
}

@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@group(0) @binding(1) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = (wid.y * p.gx + wid.x) * 64u + li;
    if (i < p.n) {
        out[i] = p.value;
    }
}
