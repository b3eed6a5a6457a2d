// Attention of a chunk of n_tok queries (positions first .. first + n_tok - 1) over the
// cached keys (slots whose position is < first) and the chunk's own keys, causal and
// windowed; the query heads of a group (4 in Gemma 3) share one KV head, and each K and V
// row is read once for the whole group. Two entry points:
//   scores: s[t, h, j] for j over the first n_cached slots then n_tok new rows (-inf: hidden)
//   mix:    out[t, h, :] = softmax(s[t, h, :]) · V, one workgroup per (t, KV head, 64 dims)
// The chunk's own keys and values are read rounded as the cache will hold them (kv_f16).
// The new keys and values enter the cache after this (kv_write.wgsl, recorded later), so a ring
// slot this chunk overwrites is still read with its old key here. A session fills its cache
// from position 0, so the slots holding positions < first are slots 0 .. min(n_slots, first)
// (`n_cached`); the kernels still check each slot's position.
struct Params {
    n_tok: u32,
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
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
@group(0) @binding(6) var<storage, read_write> s: array<f32>;
@group(0) @binding(7) var<storage, read_write> out: array<f32>;
@group(0) @binding(8) var<uniform> p: Params;

const NEG_INF: f32 = -3.0e38;

fn n_keys() -> u32 {
    return p.n_cached + p.n_tok;
}

// Visible key j for query t: its row in k/v (cache or new) or -1.
fn key_row(t: u32, j: u32) -> i32 {
    let pq = p.first + t;
    var pk: u32;
    if (j < p.n_cached) {
        let sp = slot_pos[j];
        if (sp < 0 || u32(sp) >= p.first) {
            return -1;
        }
        pk = u32(sp);
    } else {
        let r = j - p.n_cached;
        if (r > t) {
            return -1;
        }
        pk = p.first + r;
    }
    if (pq - pk >= p.window) {
        return -1;
    }
    return i32(j);
}

// Query heads per KV head, at most (the host checks).
const GMAX: u32 = 8u;

// Row of scores of query row t, head h.
fn srow(t: u32, h: u32) -> u32 {
    return (t * p.n_head + h) * n_keys();
}

@compute @workgroup_size(64)
fn scores(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    // wid.x: a block of 64 keys; wid.y: t * n_head_kv + kh. Each key row is read once for
    // the query heads that share its KV head.
    let j = wid.x * 64u + li;
    let t = wid.y / p.n_head_kv;
    let kh = wid.y % p.n_head_kv;
    let grp = p.n_head / p.n_head_kv;
    if (j >= n_keys()) {
        return;
    }
    if (key_row(t, j) < 0) {
        for (var g = 0u; g < grp; g++) {
            s[srow(t, kh * grp + g) + j] = NEG_INF;
        }
        return;
    }
    let kv_w = p.n_head_kv * p.head_dim;
    let qb = (t * p.n_head + kh * grp) * p.head_dim;
    var acc: array<f32, GMAX>;
    if (j < p.n_cached) {
        let kb = j * kv_w + kh * p.head_dim;
        for (var d = 0u; d < p.head_dim; d++) {
            let kv = k_cache[kb + d];
            for (var g = 0u; g < grp; g++) {
                acc[g] += q[qb + g * p.head_dim + d] * kv;
            }
        }
    } else {
        let kb = (j - p.n_cached) * kv_w + kh * p.head_dim;
        for (var d = 0u; d < p.head_dim; d++) {
            let kv = kv_f16(k_new[kb + d]);
            for (var g = 0u; g < grp; g++) {
                acc[g] += q[qb + g * p.head_dim + d] * kv;
            }
        }
    }
    for (var g = 0u; g < grp; g++) {
        s[srow(t, kh * grp + g) + j] = acc[g] * p.scale;
    }
}

var<workgroup> red: array<f32, 64>;

// Max (max_op) or sum of exp(s - m) over the visible keys of one row, across the workgroup.
fn reduce(sb: u32, nk: u32, li: u32, m: f32, max_op: bool) -> f32 {
    var acc = 0.0;
    if (max_op) {
        acc = NEG_INF;
    }
    for (var j = li; j < nk; j += 64u) {
        let v = s[sb + j];
        if (max_op) {
            acc = max(acc, v);
        } else if (v > NEG_INF) {
            acc += exp(v - m);
        }
    }
    red[li] = acc;
    workgroupBarrier();
    for (var step = 32u; step > 0u; step /= 2u) {
        if (li < step) {
            if (max_op) {
                red[li] = max(red[li], red[li + step]);
            } else {
                red[li] += red[li + step];
            }
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

// Softmax weights of a tile of 64 keys for each head of the group.
var<workgroup> wt: array<f32, 512>; // GMAX * 64

@compute @workgroup_size(64)
fn mix(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    // wid.x: t * n_head_kv + kh; wid.y: a block of 64 of the head's dimensions. Each value
    // row is read once for all the heads of the group; the softmax weights of each tile of
    // keys are computed once per workgroup.
    let t = wid.x / p.n_head_kv;
    let kh = wid.x % p.n_head_kv;
    let grp = p.n_head / p.n_head_kv;
    let nk = n_keys();
    let d = wid.y * 64u + li;
    let sb0 = srow(t, kh * grp);
    var mx: array<f32, GMAX>;
    var inv: array<f32, GMAX>;
    for (var g = 0u; g < grp; g++) {
        mx[g] = reduce(sb0 + g * nk, nk, li, 0.0, true);
        inv[g] = 1.0 / reduce(sb0 + g * nk, nk, li, mx[g], false);
    }
    let kv_w = p.n_head_kv * p.head_dim;
    var acc: array<f32, GMAX>;
    for (var j0 = 0u; j0 < nk; j0 += 64u) {
        let j = j0 + li;
        for (var g = 0u; g < grp; g++) {
            var w = 0.0;
            if (j < nk) {
                let v = s[sb0 + g * nk + j];
                if (v > NEG_INF) {
                    w = exp(v - mx[g]) * inv[g];
                }
            }
            wt[g * 64u + li] = w;
        }
        workgroupBarrier();
        if (d < p.head_dim) {
            let n = min(64u, nk - j0);
            for (var u = 0u; u < n; u++) {
                let jj = j0 + u;
                var v: f32;
                if (jj < p.n_cached) {
                    v = v_cache[jj * kv_w + kh * p.head_dim + d];
                } else {
                    v = kv_f16(v_new[(jj - p.n_cached) * kv_w + kh * p.head_dim + d]);
                }
                for (var g = 0u; g < grp; g++) {
                    acc[g] += wt[g * 64u + u] * v;
                }
            }
        }
        workgroupBarrier();
    }
    if (d < p.head_dim) {
        for (var g = 0u; g < grp; g++) {
            out[(t * p.n_head + kh * grp + g) * p.head_dim + d] = acc[g];
        }
    }
}
