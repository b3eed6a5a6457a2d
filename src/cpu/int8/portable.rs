//! The int8 kernels in portable Rust: the reference the SIMD versions are tested against
//! (natively and, through `check_kernels`, in the browser).

use super::scale::QK;

/// One weight row `w` (`k` int8 values, a scale per 32 or, with `g16`, per 16) against `t ≤
/// 4` activation rows on 16-bit values (`xq`, rows of `k`; a scale per 32 in `xd`):
/// `acc[r] = Σ_g (Σ_{i∈g} w_i · xq_ri) · (ws_g · xd_rb)`.
#[allow(clippy::too_many_arguments)]
pub fn dot(
    w: &[i8],
    ws: &[f32],
    xq: &[i16],
    xd: &[f32],
    k: usize,
    t: usize,
    acc: &mut [f32; 4],
    g16: bool,
) {
    let nb = k / QK;
    let group = if g16 { 16 } else { QK };
    for r in 0..t {
        let mut s = 0f32;
        for g in 0..k / group {
            let dot: i32 = w[g * group..(g + 1) * group]
                .iter()
                .zip(&xq[r * k + g * group..r * k + (g + 1) * group])
                .map(|(&a, &x)| i32::from(a) * i32::from(x))
                .sum();
            s += dot as f32 * (ws[g] * xd[r * nb + g * group / QK]);
        }
        acc[r] = s;
    }
}

/// One block of activations on 16-bit values: scale = max|x| / 32 767 (NaN ignored), q =
/// round(x / scale) (halves away from zero, saturating, NaN to 0); returns the scale.
pub fn quantize_block(xs: &[f32; QK], qs: &mut [i16; QK]) -> f32 {
    let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
    let scale = amax / 32767.0;
    let inv = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    for (o, &v) in qs.iter_mut().zip(xs) {
        *o = round_to_i16(v * inv);
    }
    scale
}

/// `v.round() as i16` (halves away from zero, saturating, NaN to 0) without `roundf`: the
/// baseline x86-64 target has no rounding instruction and wasm only rounds halves to even,
/// so `f32::round` is a library call per value there. `v as i32` truncates (saturating, NaN
/// to 0), and `v − trunc(v)` is exact (below 2²³ both share v's grid; above it v is whole).
#[inline(always)]
pub fn round_to_i16(v: f32) -> i16 {
    let t = v as i32;
    let f = v - t as f32;
    let r = if f >= 0.5 {
        t.saturating_add(1)
    } else if f <= -0.5 {
        t.saturating_sub(1)
    } else {
        t
    };
    r.clamp(i16::MIN.into(), i16::MAX.into()) as i16
}

/// `t ≤ 4` weight rows, `ld` values apart (a multiple of 32; their scales `sld` apart: `ld /
/// group` where they lie as the rows do, less where a caller converted only the tile's),
/// against one activation row on 16-bit values: each row's sum exactly as [`dot`] makes it.
/// A decode step's products (one activation row) take rows from four distant places at
/// once: four memory streams, which one core reads nearly twice as fast as one.
#[allow(clippy::too_many_arguments, dead_code)]
pub fn dot_w4(
    w: &[i8],
    ws: &[f32],
    xq: &[i16],
    xd: &[f32],
    k: usize,
    ld: usize,
    sld: usize,
    t: usize,
    out: &mut [f32; 4],
    g16: bool,
) {
    check_w4(w, ws, xq, xd, k, ld, sld, t, g16);
    for r in 0..t {
        let mut acc = [0f32; 4];
        dot(&w[r * ld..], &ws[r * sld..], xq, xd, k, 1, &mut acc, g16);
        out[r] = acc[0];
    }
}

/// The bounds every [`dot`] reads within (the SIMD versions' SAFETY rests on it).
pub fn check_dot(w: &[i8], ws: &[f32], xq: &[i16], xd: &[f32], k: usize, t: usize, g16: bool) {
    let nb = k / QK;
    assert!(
        (1..=4).contains(&t)
            && w.len() >= k
            && xq.len() >= t * k
            && xd.len() >= t * nb
            && ws.len() >= if g16 { 2 * nb } else { nb }
    );
}

/// The bounds every [`dot_w4`] reads within (the SIMD versions' SAFETY rests on it).
#[allow(clippy::too_many_arguments)]
pub fn check_w4(
    w: &[i8],
    ws: &[f32],
    xq: &[i16],
    xd: &[f32],
    k: usize,
    ld: usize,
    sld: usize,
    t: usize,
    g16: bool,
) {
    check_w4_values(w.len(), ws, xq, xd, k, ld, sld, t, g16)
}

/// [`check_w4`] of packed rows ([`dot_w4_nib`]): two values a byte.
#[allow(clippy::too_many_arguments)]
pub fn check_w4_nib(
    w: &[u8],
    ws: &[f32],
    xq: &[i16],
    xd: &[f32],
    k: usize,
    ld: usize,
    sld: usize,
    t: usize,
    g16: bool,
) {
    check_w4_values(w.len().saturating_mul(2), ws, xq, xd, k, ld, sld, t, g16)
}

/// [`check_w4`] with `values` weights.
#[allow(clippy::too_many_arguments)]
fn check_w4_values(
    values: usize,
    ws: &[f32],
    xq: &[i16],
    xd: &[f32],
    k: usize,
    ld: usize,
    sld: usize,
    t: usize,
    g16: bool,
) {
    let group = if g16 { 16 } else { QK };
    assert!(
        (1..=4).contains(&t)
            && k.is_multiple_of(QK)
            && ld.is_multiple_of(QK)
            && (t == 1 || ld >= k)
            && values >= (t - 1) * ld + k
            && ws.len() >= (t - 1).saturating_mul(sld).saturating_add(k / group)
            && xq.len() >= k
            && xd.len() >= k / QK
    );
}

/// `t ≤ 4` weight rows, `ld` values apart (a multiple of 32; their scales `ld / group` apart,
/// f32 or a head's f16 bits: [`super::scale::Scale`]), against one row of 7-bit codes `xq`
/// (0..=127): `out[r] = Σ_g ws_rg · Σ_{i∈g} w_ri · xq_i`. The integer sums are exact; the LM
/// head's filter turns the codes back into values and bounds what the 7 bits cost. Rows far
/// apart are separate memory streams: a core's prefetchers then fetch them in parallel (a
/// decode step's head is memory-bound).
#[allow(clippy::too_many_arguments, dead_code)]
pub fn dot_u7<S: super::scale::Scale>(
    w: &[i8],
    ws: &[S],
    xq: &[u8],
    k: usize,
    ld: usize,
    t: usize,
    out: &mut [f32; 4],
    g16: bool,
) {
    check_u7(w, ws, xq, k, ld, t, g16);
    let group = if g16 { 16 } else { QK };
    let (ng, wld) = (k / group, ld / group);
    for r in 0..t {
        let mut s = 0f32;
        for g in 0..ng {
            let dot: i32 = w[r * ld + g * group..r * ld + (g + 1) * group]
                .iter()
                .zip(&xq[g * group..(g + 1) * group])
                .map(|(&a, &q)| i32::from(a) * i32::from(q))
                .sum();
            s += dot as f32 * ws[r * wld + g].value();
        }
        out[r] = s;
    }
}

/// The bounds every [`dot_u7`] reads within (the SIMD versions' SAFETY rests on it).
#[allow(clippy::too_many_arguments)]
pub fn check_u7<S>(w: &[i8], ws: &[S], xq: &[u8], k: usize, ld: usize, t: usize, g16: bool) {
    let group = if g16 { 16 } else { QK };
    assert!(
        (1..=4).contains(&t)
            && k.is_multiple_of(QK)
            && ld.is_multiple_of(QK)
            && (t == 1 || ld >= k)
            && w.len() >= (t - 1) * ld + k
            && ws.len() >= ((t - 1) * ld + k) / group
            && xq.len() >= k
    );
}

/// One row's `(‖w‖, Σw)` of `w = scale · q` (a scale per `group` values, 16 or 32): the
/// norm rounded up (see [`norm_up`]).
pub fn row_stats(q: &[i8], scales: &[f32], group: usize) -> (f32, f32) {
    let (mut s2, mut s1) = (0f64, 0f64);
    for (q, &sc) in q.chunks_exact(group).zip(scales) {
        let (mut sq, mut sum) = (0i32, 0i32);
        for &v in q {
            let v = i32::from(v);
            sq += v * v;
            sum += v;
        }
        let sc = f64::from(sc);
        s2 += f64::from(sq) * sc * sc;
        s1 += f64::from(sum) * sc;
    }
    (norm_up(s2, q.len()), s1 as f32)
}

/// `√s2` rounded up past the rounding of a sum of `k / 16` positive f32 terms (one per
/// group; the SIMD versions add them in f32) and of f32 itself: the LM head's filter then
/// allows 2⁻²⁰ more.
pub fn norm_up(s2: f64, k: usize) -> f32 {
    let terms = (k / 16 + 16) as f64;
    ((s2 * (1.0 + terms * 2f64.powi(-23))).sqrt() * (1.0 + 2f64.powi(-21))) as f32
}

/// Eight bits as eight bytes: bit i of the index → 0x10 in byte i (little-endian).
const HIGH_BYTE_BITS: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut b = 0;
    while b < 256 {
        let mut i = 0;
        while i < 8 {
            if (b >> i) & 1 == 1 {
                t[b] |= 0x10 << (8 * i);
            }
            i += 1;
        }
        b += 1;
    }
    t
};

/// The 5-bit values of Q5_0/Q5_1: 32 high bits `qh`, then 16 bytes of low nibbles; value j
/// is `low | high << 4`, less 16 when `centred` (Q5_0). Eight values a step, as bytes of a
/// u64: `v − 16` of a 5-bit `v` is its low nibble under 0xF0 when bit 4 is clear and under
/// 0x00 when it is set, so no byte borrows from the next.
pub fn five_bits(qh: u32, ql: &[u8; 16], q: &mut [i8; 32], centred: bool) {
    const NIBBLES: u64 = 0x0F0F_0F0F_0F0F_0F0F;
    let flip = if centred { 0x1010_1010_1010_1010 } else { 0 };
    let scale = if centred { 15 } else { 1 };
    let high = |shift: u32| (HIGH_BYTE_BITS[((qh >> shift) & 0xFF) as usize] ^ flip) * scale;
    for j in 0..2 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&ql[8 * j..8 * j + 8]);
        let l = u64::from_le_bytes(b);
        let lo = (l & NIBBLES) | high(8 * j as u32);
        let hi = ((l >> 4) & NIBBLES) | high(8 * j as u32 + 16);
        for (o, b) in q[8 * j..8 * j + 8].iter_mut().zip(lo.to_le_bytes()) {
            *o = b as i8;
        }
        for (o, b) in q[8 * j + 16..8 * j + 24].iter_mut().zip(hi.to_le_bytes()) {
            *o = b as i8;
        }
    }
}

/// Packed codes ([`super::packing::Packing`]) back to int8 values: `out.len() / 32` blocks of 16
/// bytes (byte l: value l's code in the low nibble, value l + 16's in the high one), each
/// code less `bias`.
pub fn unpack(bytes: &[u8], out: &mut [i8], bias: i8) {
    assert!(bytes.len() >= out.len() / 2);
    for (b, o) in bytes.chunks_exact(QK / 2).zip(out.chunks_exact_mut(QK)) {
        for l in 0..QK / 2 {
            o[l] = (b[l] & 0xF) as i8 - bias;
            o[l + QK / 2] = (b[l] >> 4) as i8 - bias;
        }
    }
}

/// [`dot_w4`] on packed rows (`w`: their codes, rows `ld` values apart, so `ld / 2` bytes;
/// each code less `bias`): each row's sum exactly as [`dot`] makes it on the unpacked
/// values (the SIMD versions widen the nibbles in the kernel, as their `dot_w4` does).
#[allow(clippy::too_many_arguments)]
pub fn dot_w4_nib(
    w: &[u8],
    bias: i8,
    ws: &[f32],
    xq: &[i16],
    xd: &[f32],
    k: usize,
    ld: usize,
    sld: usize,
    t: usize,
    out: &mut [f32; 4],
    g16: bool,
) {
    check_w4_nib(w, ws, xq, xd, k, ld, sld, t, g16);
    let group = if g16 { 16 } else { QK };
    for (r, o) in out.iter_mut().enumerate().take(t) {
        let row = &w[r * ld / 2..(r * ld + k) / 2];
        let mut s = 0f32;
        for g in 0..k / group {
            let dot: i32 = (g * group..(g + 1) * group)
                .map(|i| {
                    let byte = row[i / QK * (QK / 2) + i % (QK / 2)];
                    let code = if i % QK < QK / 2 {
                        byte & 0xF
                    } else {
                        byte >> 4
                    };
                    i32::from(code as i8 - bias) * i32::from(xq[i])
                })
                .sum();
            s += dot as f32 * (ws[r * sld + g] * xd[g * group / QK]);
        }
        *o = s;
    }
}

/// Values per unit of the five-bit layout ([`super::packing::Packing::Fives`]): three blocks of 32.
pub const FIVES_UNIT: usize = 3 * QK;

/// Bytes per whole unit of the five-bit layout: four vectors of eight 16-bit lanes (a row's
/// last unit holds only the vectors its groups need: [`fives_row_bytes`]).
pub const FIVES_UNIT_BYTES: usize = 64;

/// Where field `f` (0, 1, 2) of a five-bit lane starts: bits 0..5, 5..10 and 10..15 (bit 15
/// is clear).
pub const FIVES_SHIFT: [u32; 3] = [0, 5, 10];

/// One row of values in −16..=15 (`q`, whole blocks of 32) in the five-bit layout `out`
/// (units of 96 values, 64 bytes each; a last unit of one or two blocks in the 32 or 48
/// bytes its groups fill, its missing values zero: [`fives_row_bytes`]): group `g` (values
/// `8g..8g + 8` of a unit) in the unit's vector `g / 3` as field
/// `g % 3` of its eight little-endian 16-bit lanes, value `8g + l` in lane `l`, as the code
/// `value + 16` (0..=31). A group's eight values meet the same eight activations as in the
/// int8 row, in the same lanes of `i32x4.dot_i16x8_s`, so a kernel can make every integer sum
/// the int8 row's: the codes' sums less 16 · Σx ([`fives_corrections`]).
pub fn pack_fives(q: &[i8], out: &mut [u8]) {
    assert!(out.len() >= fives_row_bytes(q.len()));
    for (u, unit) in q.chunks(FIVES_UNIT).enumerate() {
        let mut lanes = [0u16; 32];
        for (g, group) in unit.chunks(8).enumerate() {
            for (l, &v) in group.iter().enumerate() {
                debug_assert!((-16..16).contains(&v));
                let code = (i16::from(v) + 16) as u16 & 0x1F;
                lanes[g / 3 * 8 + l] |= code << FIVES_SHIFT[g % 3];
            }
        }
        let bytes = fives_row_bytes(unit.len());
        for (o, lane) in out[u * FIVES_UNIT_BYTES..u * FIVES_UNIT_BYTES + bytes]
            .chunks_exact_mut(2)
            .zip(lanes)
        {
            o.copy_from_slice(&lane.to_le_bytes());
        }
    }
}

/// One row in the five-bit layout ([`pack_fives`]) back to its `out.len()` int8 values.
pub fn unpack_fives(bytes: &[u8], out: &mut [i8]) {
    assert!(bytes.len() >= fives_row_bytes(out.len()));
    for (i, o) in out.iter_mut().enumerate() {
        let (u, g, l) = (i / FIVES_UNIT, i % FIVES_UNIT / 8, i % 8);
        let at = u * FIVES_UNIT_BYTES + (g / 3 * 8 + l) * 2;
        let lane = u16::from_le_bytes([bytes[at], bytes[at + 1]]);
        *o = ((lane >> FIVES_SHIFT[g % 3]) & 0x1F) as i8 - 16;
    }
}

/// What the five-bit codes' sums ([`pack_fives`]) exceed the values' by, per block of an
/// activation row and lane of `i32x4.dot_i16x8_s`: `16 · Σ_g (x[8g + 2l] + x[8g + 2l + 1])`
/// over the block's four groups `g`, lane `l` (`4 · k / 32` values, exact).
pub fn fives_corrections(xq: &[i16], k: usize) -> Vec<i32> {
    let mut c = vec![0i32; 4 * (k / QK)];
    for (i, &x) in xq[..k / QK * QK].iter().enumerate() {
        c[i / QK * 4 + i % 8 / 2] += 16 * i32::from(x);
    }
    c
}

/// [`dot_w4`] on rows in the five-bit layout (`w`; a scale per 32 values): `t ≤ 4` rows,
/// `apart` rows from one to the next (each row `fives_row_bytes(k)` bytes and `k / 32`
/// scales), against one activation row and its [`fives_corrections`] `corr`; each row's sum
/// exactly as [`dot_w4`] makes it on the int8 values (this is that: the rows unpacked
/// first; the SIMD versions take the codes' sums less `corr`).
#[allow(clippy::too_many_arguments)]
pub fn dot_w5(
    w: &[u8],
    ws: &[f32],
    xq: &[i16],
    xd: &[f32],
    corr: &[i32],
    k: usize,
    apart: usize,
    t: usize,
    out: &mut [f32; 4],
) {
    check_w5(w, ws, xq, xd, corr, k, apart, t);
    dot_w5_unpacked(w, ws, k, apart, t, out, unpack_fives, |q, ws, acc| {
        dot_w4(q, ws, xq, xd, k, k, k / QK, 1, acc, false)
    })
}

/// [`dot_w5`] by unpacking each row (`unpack`) and taking its sum from `dot4(row, scales,
/// out)`: the reference here, and the native build's path on its own kernels.
#[allow(clippy::too_many_arguments)]
pub fn dot_w5_unpacked(
    w: &[u8],
    ws: &[f32],
    k: usize,
    apart: usize,
    t: usize,
    out: &mut [f32; 4],
    unpack: impl Fn(&[u8], &mut [i8]),
    dot4: impl Fn(&[i8], &[f32], &mut [f32; 4]),
) {
    let (rb, nb) = (fives_row_bytes(k), k / QK);
    let mut q = vec![0i8; k];
    for (r, o) in out.iter_mut().enumerate().take(t) {
        unpack(&w[r * apart * rb..], &mut q);
        let mut acc = [0f32; 4];
        dot4(&q, &ws[r * apart * nb..], &mut acc);
        *o = acc[0];
    }
}

/// Bytes of a row of `k` values (whole blocks) in the five-bit layout: its groups of 8,
/// three to a 16-byte vector. A whole unit's twelve groups fill four vectors; a last unit of
/// one block (four groups) two, of two blocks three, so a row of Gemma 3's 640 values takes
/// 432 bytes, not the 448 of seven whole units.
pub const fn fives_row_bytes(k: usize) -> usize {
    (k / 8).div_ceil(3) * 16
}

/// The bounds every [`dot_w5`] reads within (the SIMD versions' SAFETY rests on it).
#[allow(clippy::too_many_arguments)]
pub fn check_w5<S>(
    w: &[u8],
    ws: &[S],
    xq: &[i16],
    xd: &[f32],
    corr: &[i32],
    k: usize,
    apart: usize,
    t: usize,
) {
    let last = (t.max(1) - 1).saturating_mul(apart);
    assert!(
        (1..=4).contains(&t)
            && k.is_multiple_of(QK)
            && (t == 1 || apart >= 1)
            && w.len() >= (last + 1).saturating_mul(fives_row_bytes(k))
            && ws.len() >= (last + 1).saturating_mul(k / QK)
            && xq.len() >= k
            && xd.len() >= k / QK
            && corr.len() >= 4 * (k / QK)
    );
}

/// Coded values as f32: `out[i] = units[i / per] · codes[i]` for whole blocks of `per`
/// (a K-quant's scales or offsets: [`super::layout::Scales::Coded`]).
pub fn expand_codes(units: &[f32], codes: &[i8], per: usize, out: &mut [f32]) {
    let blocks = codes.chunks_exact(per).zip(out.chunks_exact_mut(per));
    for ((c, o), &u) in blocks.zip(units) {
        for (o, &c) in o.iter_mut().zip(c) {
            *o = u * f32::from(c);
        }
    }
}
