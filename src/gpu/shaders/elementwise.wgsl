// Elementwise ops over n values: `add` (a + b), `gelu_mul` (gelu_tanh(a) * b), `silu_mul`
// (silu(a) * b), `add_row` (a + b[i % width]: a bias on every row) and `gelu_erf` (the exact
// GELU of a; b is bound but not read).
struct Params {
    n: u32,
    groups_x: u32,
    width: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

fn index(wid: vec3<u32>, li: u32) -> u32 {
    return (wid.x + wid.y * p.groups_x) * 64u + li;
}

@compute @workgroup_size(64)
fn add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = index(wid, li);
    if (i < p.n) {
        out[i] = a[i] + b[i];
    }
}

@compute @workgroup_size(64)
fn gelu_mul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = index(wid, li);
    if (i < p.n) {
        let g = a[i];
        // sqrt(2/pi); tanh written out (WGSL's tanh overflows to NaN for large |x| on some
        // drivers).
        let u = clamp(0.7978846 * (g + 0.044715 * g * g * g), -15.0, 15.0);
        let e = exp(2.0 * u);
        out[i] = 0.5 * g * (1.0 + (e - 1.0) / (e + 1.0)) * b[i];
    }
}

@compute @workgroup_size(64)
fn silu_mul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = index(wid, li);
    if (i < p.n) {
        let g = a[i];
        // exp(-g) overflows to inf for g < -88: g / inf = 0, the right limit.
        out[i] = g / (1.0 + exp(-g)) * b[i];
    }
}

@compute @workgroup_size(64)
fn add_row(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = index(wid, li);
    if (i < p.n) {
        out[i] = a[i] + b[i % p.width];
    }
}

// erf to about 1e-7 absolute (Abramowitz & Stegun 7.1.26), as the CPU backend computes it.
fn erf(x: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.3275911 * abs(x));
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    let y = 1.0 - poly * exp(-x * x);
    return select(y, -y, x < 0.0);
}

@compute @workgroup_size(64)
fn gelu_erf(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let i = index(wid, li);
    if (i < p.n) {
        let g = a[i];
        out[i] = 0.5 * g * (1.0 + erf(g * 0.70710678));
    }
}
