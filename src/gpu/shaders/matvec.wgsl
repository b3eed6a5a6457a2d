// y[i, row0 + r] = dot(x[i, :], W[r, :]) for the rows r of one weight part: the decode
// product (a few activation rows). A workgroup owns ROWS output rows; LANES threads share a
// row, each taking every LANES-th 32-weight sub-block, then a tree sum in workgroup memory.
// The weight type's `subdot(row, sub, xbase)` is appended from its own file (q8_0.wgsl, ...).

const ROWS: u32 = 4u;
const LANES: u32 = 16u;

struct Params {
    k: u32,        // inputs per row (a multiple of 32; of 256 for K-quants)
    n_rows: u32,   // rows in this part
    row0: u32,     // the part's first row in the whole matrix
    n: u32,        // outputs per activation row (the whole matrix's rows)
    m: u32,        // activation rows
    groups_x: u32, // workgroups along x (the dispatch is 2-D past 65 535)
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

var<workgroup> partial: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let group = wid.x + wid.y * p.groups_x;
    let r_local = li / LANES;
    let lane = li % LANES;
    let row = group * ROWS + r_local;
    let n_sub = p.k / 32u;
    for (var i = 0u; i < p.m; i++) {
        var acc = 0.0;
        if (row < p.n_rows) {
            for (var s = lane; s < n_sub; s += LANES) {
                acc += subdot(row, s, i * p.k + s * 32u);
            }
        }
        partial[li] = acc;
        workgroupBarrier();
        for (var step = LANES / 2u; step > 0u; step /= 2u) {
            if (lane < step) {
                partial[li] += partial[li + step];
            }
            workgroupBarrier();
        }
        if (lane == 0u && row < p.n_rows) {
            y[i * p.n + p.row0 + row] = partial[li];
        }
        workgroupBarrier();
    }
}
