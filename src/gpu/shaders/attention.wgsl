// Attention of a chunk of n_tok queries (positions first .. first + n_tok - 1) over the
// cached keys (slots whose position is < first) and the chunk's own keys, causal and
// windowed; 4 query heads share one KV head. Two entry points:
//   scores: s[t, h, j] for j over the first n_cached slots then n_tok new rows (-inf: hidden)
//   mix:    out[t, h, :] = softmax(s[t, h, :]) · V, one workgroup per (t, h)
// The new keys and values enter the cache after this (a copy recorded later), so a ring
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

@compute @workgroup_size(64)
fn scores(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    // wid.x: a block of 64 keys; wid.y: t * n_head + h.
    let j = wid.x * 64u + li;
    let th = wid.y;
    let t = th / p.n_head;
    let h = th % p.n_head;
    if (j >= n_keys()) {
        return;
    }
    let idx = th * n_keys() + j;
    if (key_row(t, j) < 0) {
        s[idx] = NEG_INF;
        return;
    }
    let kh = h / (p.n_head / p.n_head_kv);
    let kv_w = p.n_head_kv * p.head_dim;
    let qb = (t * p.n_head + h) * p.head_dim;
    var acc = 0.0;
    if (j < p.n_cached) {
        let kb = j * kv_w + kh * p.head_dim;
        for (var d = 0u; d < p.head_dim; d++) {
            acc += q[qb + d] * k_cache[kb + d];
        }
    } else {
        let kb = (j - p.n_cached) * kv_w + kh * p.head_dim;
        for (var d = 0u; d < p.head_dim; d++) {
            acc += q[qb + d] * k_new[kb + d];
        }
    }
    s[idx] = acc * p.scale;
}

var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn mix(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let th = wid.x;
    let t = th / p.n_head;
    let h = th % p.n_head;
    let nk = n_keys();
    let sb = th * nk;
    // max
    var m = NEG_INF;
    for (var j = li; j < nk; j += 64u) {
        m = max(m, s[sb + j]);
    }
    red[li] = m;
    workgroupBarrier();
    for (var step = 32u; step > 0u; step /= 2u) {
        if (li < step) {
            red[li] = max(red[li], red[li + step]);
        }
        workgroupBarrier();
    }
    let mx = red[0];
    workgroupBarrier();
    // sum of exp
    var sum = 0.0;
    for (var j = li; j < nk; j += 64u) {
        let v = s[sb + j];
        if (v > NEG_INF) {
            sum += exp(v - mx);
        }
    }
    red[li] = sum;
    workgroupBarrier();
    for (var step = 32u; step > 0u; step /= 2u) {
        if (li < step) {
            red[li] += red[li + step];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / red[0];
    let kh = h / (p.n_head / p.n_head_kv);
    let kv_w = p.n_head_kv * p.head_dim;
    let ob = (t * p.n_head + h) * p.head_dim;
    for (var d = li; d < p.head_dim; d += 64u) {
        var acc = 0.0;
        for (var j = 0u; j < nk; j++) {
            let v = s[sb + j];
            if (v > NEG_INF) {
                let pw = exp(v - mx) * inv;
                if (j < p.n_cached) {
                    acc += pw * v_cache[j * kv_w + kh * p.head_dim + d];
                } else {
                    acc += pw * v_new[(j - p.n_cached) * kv_w + kh * p.head_dim + d];
                }
            }
        }
        out[ob + d] = acc;
    }
}
