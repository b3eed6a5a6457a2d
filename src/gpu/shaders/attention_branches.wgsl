// Branches after a cached prefix: row t of this call belongs to the run starting at row
// starts[t] and sits at position first + t - starts[t] (every run continues the same prefix of
// `first` positions). It attends over the cached slots holding positions < first and the rows
// starts[t] ..= t of its own run, causal and windowed; nothing is written to the cache. One
// workgroup per (t, KV head): the query heads of the group are staged in workgroup memory,
// each tile of 64 keys is scored once (a key per invocation), then every invocation folds the
// tile into a running softmax (maximum, sum) for its own dimensions of the output.
struct Params {
    n_tok: u32,
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    // Cache slots that may hold positions < first (slots 0 .. min(n_slots, first)).
    n_cached: u32,
    first: u32,
    window: u32,
    scale: f32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k_new: array<f32>;
@group(0) @binding(2) var<storage, read> v_new: array<f32>;
@group(0) @binding(3) var<storage, read> k_cache: array<f32>;
@group(0) @binding(4) var<storage, read> v_cache: array<f32>;
@group(0) @binding(5) var<storage, read> slot_pos: array<i32>;
@group(0) @binding(6) var<storage, read> starts: array<u32>;
@group(0) @binding(7) var<storage, read_write> out: array<f32>;
@group(0) @binding(8) var<uniform> p: Params;

const NEG_INF: f32 = -3.0e38;
// Query heads per KV head, and values per head, at most (the host checks).
const GMAX: u32 = 8u;
const HEAD_DIM_MAX: u32 = 256u;
// Output dimensions per invocation: HEAD_DIM_MAX / 64.
const DPT: u32 = 4u;

var<workgroup> qs: array<f32, 2048>; // GMAX * HEAD_DIM_MAX
var<workgroup> sc: array<f32, 512>; // GMAX * 64

// Key j of row t: a cache slot (j < n_cached) or a row of t's run; its K/V row offset and
// whether t sees it (offset < 0: hidden).
fn key_at(j: u32, b0: u32, pq: u32, kh: u32) -> i32 {
    let kv_w = p.n_head_kv * p.head_dim;
    var pk: u32;
    var row: u32;
    if (j < p.n_cached) {
        let sp = slot_pos[j];
        if (sp < 0 || u32(sp) >= p.first) {
            return -1;
        }
        pk = u32(sp);
        row = j;
    } else {
        pk = p.first + (j - p.n_cached);
        row = b0 + (j - p.n_cached);
    }
    if (pq - pk >= p.window) {
        return -1;
    }
    return i32(row * kv_w + kh * p.head_dim);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let t = wid.x;
    let kh = wid.y;
    let grp = p.n_head / p.n_head_kv;
    let hd = p.head_dim;
    let b0 = starts[t];
    let pq = p.first + t - b0;
    let nk = p.n_cached + (t - b0) + 1u;
    for (var i = li; i < grp * hd; i += 64u) {
        qs[i] = q[(t * p.n_head + kh * grp) * hd + i];
    }
    workgroupBarrier();
    var m: array<f32, GMAX>;
    var l: array<f32, GMAX>;
    var acc: array<f32, 32>; // GMAX * DPT
    for (var g = 0u; g < grp; g++) {
        m[g] = NEG_INF;
    }
    for (var j0 = 0u; j0 < nk; j0 += 64u) {
        // Score key j0 + li for each head of the group.
        let j = j0 + li;
        var o = -1;
        if (j < nk) {
            o = key_at(j, b0, pq, kh);
        }
        if (o < 0) {
            for (var g = 0u; g < grp; g++) {
                sc[g * 64u + li] = NEG_INF;
            }
        } else {
            var dots: array<f32, GMAX>;
            let ko = u32(o);
            for (var d = 0u; d < hd; d++) {
                var kv: f32;
                if (j < p.n_cached) {
                    kv = k_cache[ko + d];
                } else {
                    kv = kv_f16(k_new[ko + d]);
                }
                for (var g = 0u; g < grp; g++) {
                    dots[g] += qs[g * hd + d] * kv;
                }
            }
            for (var g = 0u; g < grp; g++) {
                sc[g * 64u + li] = dots[g] * p.scale;
            }
        }
        workgroupBarrier();
        // Fold the tile into the running softmax, for this invocation's dimensions.
        let n = min(64u, nk - j0);
        for (var g = 0u; g < grp; g++) {
            var mt = m[g];
            for (var u = 0u; u < n; u++) {
                mt = max(mt, sc[g * 64u + u]);
            }
            let f = exp(m[g] - mt);
            l[g] *= f;
            for (var i = 0u; i < DPT; i++) {
                acc[g * DPT + i] *= f;
            }
            m[g] = mt;
        }
        for (var u = 0u; u < n; u++) {
            let jj = j0 + u;
            let o2 = key_at(jj, b0, pq, kh);
            if (o2 < 0) {
                continue;
            }
            let vo = u32(o2);
            var vals: array<f32, DPT>;
            for (var i = 0u; i < DPT; i++) {
                let d = li + 64u * i;
                if (d < hd) {
                    if (jj < p.n_cached) {
                        vals[i] = v_cache[vo + d];
                    } else {
                        vals[i] = kv_f16(v_new[vo + d]);
                    }
                }
            }
            for (var g = 0u; g < grp; g++) {
                let e = exp(sc[g * 64u + u] - m[g]);
                l[g] += e;
                for (var i = 0u; i < DPT; i++) {
                    acc[g * DPT + i] += e * vals[i];
                }
            }
        }
        workgroupBarrier();
    }
    for (var g = 0u; g < grp; g++) {
        let inv = 1.0 / l[g];
        for (var i = 0u; i < DPT; i++) {
            let d = li + 64u * i;
            if (d < hd) {
                out[(t * p.n_head + kh * grp + g) * hd + d] = acc[g * DPT + i] * inv;
            }
        }
    }
}
