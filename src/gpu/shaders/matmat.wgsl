// The prefill product y = x @ Wᵀ for many activation rows: a workgroup owns 64 weight rows
// (one per thread) and TM activation rows. Per 32-weight step it stages the TM × 32 slice of
// x in workgroup memory, and each thread dequantizes its row's 32 weights once and uses each
// for TM products: dequantization is paid once per TM rows instead of once per row.
// The weight type's `deq` (and `subdot`, unused here) are appended from its file.

const TM: u32 = 16u;

struct Params {
    k: u32,
    n_rows: u32,
    row0: u32,
    n: u32,
    m: u32,
    groups_x: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

var<workgroup> xs: array<f32, 512>; // TM × 32

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let row = wid.x * 64u + li;
    let m0 = wid.y * TM;
    var acc: array<f32, 16>;
    for (var i = 0u; i < TM; i++) {
        acc[i] = 0.0;
    }
    for (var k0 = 0u; k0 < p.k; k0 += 32u) {
        for (var e = li; e < TM * 32u; e += 64u) {
            let i = e / 32u;
            let c = e % 32u;
            var v = 0.0;
            if (m0 + i < p.m) {
                v = x[(m0 + i) * p.k + k0 + c];
            }
            xs[e] = v;
        }
        workgroupBarrier();
        if (row < p.n_rows) {
            for (var c = 0u; c < 32u; c++) {
                let wv = deq(row, k0 + c);
                for (var i = 0u; i < TM; i++) {
                    acc[i] += wv * xs[i * 32u + c];
                }
            }
        }
        workgroupBarrier();
    }
    if (row < p.n_rows) {
        for (var i = 0u; i < TM; i++) {
            if (m0 + i < p.m) {
                y[(m0 + i) * p.n + p.row0 + row] = acc[i];
            }
        }
    }
}
