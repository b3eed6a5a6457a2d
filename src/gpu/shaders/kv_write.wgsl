// The chunk's keys and values enter the KV cache: row t (position first + t) goes to ring
// slot (first + t) % n_slots, rounded as an f16 cache holds them (kv_f16), and the slot
// records its position. Recorded after the
// attention of the chunk, which still sees the slots as they were.
struct Params {
    n_tok: u32,
    kv_w: u32,
    first: u32,
    n_slots: u32,
}

@group(0) @binding(0) var<storage, read> k_new: array<f32>;
@group(0) @binding(1) var<storage, read> v_new: array<f32>;
@group(0) @binding(2) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(3) var<storage, read_write> v_cache: array<f32>;
@group(0) @binding(4) var<storage, read_write> slot_pos: array<i32>;
@group(0) @binding(5) var<uniform> p: Params;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    // One workgroup per row.
    let t = wid.x;
    // A chunk longer than the ring: only its last n_slots rows stay (no two rows race for
    // one slot).
    if (t >= p.n_tok || t + p.n_slots < p.n_tok) {
        return;
    }
    let pos = p.first + t;
    let slot = pos % p.n_slots;
    for (var j = li; j < p.kv_w; j += 64u) {
        k_cache[slot * p.kv_w + j] = kv_f16(k_new[t * p.kv_w + j]);
        v_cache[slot * p.kv_w + j] = kv_f16(v_new[t * p.kv_w + j]);
    }
    if (li == 0u) {
        slot_pos[slot] = i32(pos);
    }
}
