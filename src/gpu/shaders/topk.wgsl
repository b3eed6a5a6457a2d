// Top-k of one row of logits, on the GPU, so a decode step reads back k (id, logit) pairs
// instead of the whole vocabulary. One stage: each workgroup takes BLOCK candidates and
// writes its k best, by k rounds of a tree argmax in workgroup memory (ties: the lower
// id wins, as the CPU's argmax). Stages repeat until one block remains: 262 144 logits →
// 256 blocks → 32 → 4 → 1 for k ≤ 128. The first stage reads the logits themselves and,
// under an output constraint, its allowed-token bitmask (bit i % 32 of word i / 32; a token
// that is not allowed never wins), so a constrained step still reads back only k pairs.
const BLOCK: u32 = 1024u;
const THREADS: u32 = 256u;
const NEG_INF: f32 = -3.4e38;

struct Params {
    len: u32,    // candidates in the input
    k: u32,
    first: u32,  // 1: the input is the logits row (ids are positions)
    masked: u32, // 1: the first stage reads `mask`
}

@group(0) @binding(0) var<storage, read> in_v: array<f32>;
@group(0) @binding(1) var<storage, read> in_i: array<u32>;
@group(0) @binding(2) var<storage, read> mask: array<u32>;
@group(0) @binding(3) var<storage, read_write> out_v: array<f32>;
@group(0) @binding(4) var<storage, read_write> out_i: array<u32>;
@group(0) @binding(5) var<uniform> p: Params;

var<workgroup> vals: array<f32, 1024>;
var<workgroup> ids: array<u32, 1024>;
var<workgroup> red_v: array<f32, 256>;
var<workgroup> red_s: array<u32, 256>; // slot in `vals` of the best so far

fn better(av: f32, ai: u32, bv: f32, bi: u32) -> bool {
    return av > bv || (av == bv && ai < bi);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let base = wid.x * BLOCK;
    for (var e = li; e < BLOCK; e += THREADS) {
        let g = base + e;
        if (g < p.len) {
            let v = in_v[g];
            // NaN never wins, nor a token the constraint does not allow.
            var ok = v == v;
            if (p.masked == 1u && p.first == 1u) {
                ok = ok && ((mask[g / 32u] >> (g % 32u)) & 1u) == 1u;
            }
            vals[e] = select(NEG_INF, v, ok);
            ids[e] = select(in_i[g], g, p.first == 1u);
        } else {
            vals[e] = NEG_INF;
            ids[e] = 0xffffffffu;
        }
    }
    workgroupBarrier();
    for (var r = 0u; r < p.k; r++) {
        var bs = li;
        for (var e = li + THREADS; e < BLOCK; e += THREADS) {
            if (better(vals[e], ids[e], vals[bs], ids[bs])) {
                bs = e;
            }
        }
        red_v[li] = vals[bs];
        red_s[li] = bs;
        workgroupBarrier();
        for (var step = THREADS / 2u; step > 0u; step /= 2u) {
            if (li < step) {
                let o = red_s[li + step];
                if (better(vals[o], ids[o], red_v[li], ids[red_s[li]])) {
                    red_v[li] = vals[o];
                    red_s[li] = o;
                }
            }
            workgroupBarrier();
        }
        if (li == 0u) {
            let s = red_s[0];
            out_v[wid.x * p.k + r] = vals[s];
            out_i[wid.x * p.k + r] = ids[s];
            vals[s] = NEG_INF;
            ids[s] = 0xffffffffu;
        }
        workgroupBarrier();
    }
}
