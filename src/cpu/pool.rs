//! Work split over the CPU backend's threads, one seam for every kernel: natively candle's
//! persistent barrier pool (`CANDLE_NUM_THREADS`, else the physical cores); in the wasm
//! threads build our own team ([`super::team`]) on the wasm-bindgen-rayon pool's workers; in
//! the single-thread wasm build inline.

use std::cell::Cell;
use std::ops::Range;

thread_local! {
    /// This thread is running a work item of [`for_chunks`].
    static IN_ITEM: Cell<bool> = const { Cell::new(false) };
}

/// Below this many multiply-adds a product runs on the calling thread.
#[cfg(not(all(target_arch = "wasm32", feature = "threads")))]
pub const PARALLEL_MIN_MACS: usize = 1 << 18;
/// The threads build's team starts a job for a few microseconds (src/cpu/team.rs), so a
/// decode step's smallest products (Gemma 3's K and V, 640 × 256) go to it too.
#[cfg(all(target_arch = "wasm32", feature = "threads"))]
pub const PARALLEL_MIN_MACS: usize = 1 << 16;

/// Runs `f` on disjoint ranges that together cover `0..n_items`, on the pool when `work`
/// (multiply-adds or a like count; saturate it: usize is 32 bits in wasm) reaches [`PARALLEL_MIN_MACS`], else inline as `f(0..n)`.
/// Returns when every range is done.
/// A call from inside a work item (attention's per-head products) runs inline.
pub fn for_chunks<F: Fn(Range<usize>) + Sync>(n_items: usize, work: usize, f: F) {
    if n_items == 0 {
        return;
    }
    if n_items == 1 || work < PARALLEL_MIN_MACS || IN_ITEM.with(Cell::get) {
        f(0..n_items);
        return;
    }
    let f = |r: Range<usize>| {
        let outer = IN_ITEM.with(|c| c.replace(true));
        f(r);
        IN_ITEM.with(|c| c.set(outer));
    };
    #[cfg(all(target_arch = "wasm32", feature = "threads"))]
    team().run(n_items, &f);
    #[cfg(not(target_arch = "wasm32"))]
    candle_core::utils::barrier_pool().execute_chunked(n_items, f);
    #[cfg(all(target_arch = "wasm32", not(feature = "threads")))]
    f(0..n_items);
}

/// One pass over several parts (matrices that share an input): part `p`, of `rows[p]` rows,
/// is `rows[p].div_ceil(chunk)` items of `chunk` rows, and all the parts' items are split over
/// the pool as one range ([`for_chunks`], `work` as there). Runs `f(p, items)` with part `p`'s
/// share of a range, its own item numbers (item `i`: rows `i · chunk ..`), never empty.
pub fn for_part_chunks<F: Fn(usize, Range<usize>) + Sync>(
    rows: &[usize],
    chunk: usize,
    work: usize,
    f: F,
) {
    let mut firsts = Vec::with_capacity(rows.len() + 1);
    firsts.push(0usize);
    for r in rows {
        firsts.push(firsts[firsts.len() - 1] + r.div_ceil(chunk));
    }
    for_chunks(firsts[rows.len()], work, |items| {
        for p in 0..rows.len() {
            let c = items.start.max(firsts[p])..items.end.min(firsts[p + 1]);
            if !c.is_empty() {
                f(p, c.start - firsts[p]..c.end - firsts[p]);
            }
        }
    });
}

/// Threads [`for_chunks`] runs on (the calling one included).
pub fn threads() -> usize {
    #[cfg(all(target_arch = "wasm32", feature = "threads"))]
    return rayon::current_num_threads() + 1;
    #[cfg(not(target_arch = "wasm32"))]
    return candle_core::utils::barrier_pool().n_workers() + 1;
    #[cfg(all(target_arch = "wasm32", not(feature = "threads")))]
    1
}

/// The threads build's team: one helper on each worker of the wasm-bindgen-rayon pool
/// (`initThreadPool(threads − 1)`: the calling thread is the last one), started at the first
/// parallel product. Rayon only hosts it: nothing else runs on that pool.
#[cfg(all(target_arch = "wasm32", feature = "threads"))]
fn team() -> &'static super::team::Team {
    static TEAM: std::sync::OnceLock<&'static super::team::Team> = std::sync::OnceLock::new();
    TEAM.get_or_init(|| super::team::Team::start(rayon::current_num_threads(), |f| rayon::spawn(f)))
}

/// Row passes (LayerNorm, the int8 kernel's quantization) split into at most this many items.
const ROW_ITEMS: usize = 16;

/// Runs `f(i, row)` for every row `i` of `data` (rows of `width` values) over the pool when
/// `work` (in the kernels' multiply-adds, as [`for_chunks`]) reaches its threshold.
pub fn for_rows<T: Send>(
    data: &mut [T],
    width: usize,
    work: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    if width == 0 {
        return;
    }
    let n_rows = data.len() / width;
    let per_item = n_rows.div_ceil(ROW_ITEMS).max(1);
    let out = SharedOut::new(data);
    for_chunks(n_rows.div_ceil(per_item), work, |items| {
        let rows = items.start * per_item..(items.end * per_item).min(n_rows);
        // SAFETY: the ranges of for_chunks are disjoint, so these rows are this item's alone,
        // inside `data`, which outlives the call.
        let part = unsafe { out.part(rows.start * width, rows.len() * width) };
        for (i, row) in rows.zip(part.chunks_exact_mut(width)) {
            f(i, row);
        }
    });
}

/// An output pointer shared by the pool's workers, each writing its own disjoint part.
pub struct SharedOut<T = f32>(*mut T);

impl<T> SharedOut<T> {
    pub fn new(out: &mut [T]) -> Self {
        Self(out.as_mut_ptr())
    }

    /// `len` values from `start`.
    ///
    /// # Safety
    /// The range must lie inside the slice this was made from, that slice must outlive the
    /// use, and no two live results may overlap (each worker owns its range).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn part(&self, start: usize, len: usize) -> &mut [T] {
        std::slice::from_raw_parts_mut(self.0.add(start), len)
    }

    /// Stores `v` at index `i`.
    ///
    /// # Safety
    /// `i` must lie inside the slice this was made from, which must outlive the use, and no
    /// other thread may touch index `i` meanwhile.
    pub unsafe fn set(&self, i: usize, v: T) {
        self.0.add(i).write(v);
    }
}

// SAFETY: workers write disjoint ranges or elements through it (see `part` and `set`).
unsafe impl<T: Send> Sync for SharedOut<T> {}

/// The rate (GB/s) at which this machine's threads, as the kernels' pool runs them, read
/// `mb` MiB of memory: the best of three passes after a first that brings it in. A decode
/// step reads every weight once, so this rate over the bytes a step reads bounds the decode.
#[cfg(not(target_arch = "wasm32"))]
pub fn read_rate_gb_per_s(mb: usize) -> f64 {
    const CHUNK: usize = 1 << 17; // u64s: 1 MiB
    let data: Vec<u64> = (0..(mb << 17).max(CHUNK) as u64).collect();
    let n_chunks = data.len().div_ceil(CHUNK);
    let pass = || {
        let t = std::time::Instant::now();
        for_chunks(n_chunks, usize::MAX, |chunks| {
            for c in chunks {
                let xs = &data[c * CHUNK..((c + 1) * CHUNK).min(data.len())];
                // Eight independent sums: the loads, not an add chain, set the pace.
                let mut acc = [0u64; 8];
                for block in xs.chunks_exact(8) {
                    for (a, &x) in acc.iter_mut().zip(block) {
                        *a = a.wrapping_add(x);
                    }
                }
                // Kept, so the loads are not optimized away.
                std::hint::black_box(acc.iter().fold(0u64, |s, &a| s.wrapping_add(a)));
            }
        });
        t.elapsed().as_secs_f64()
    };
    pass();
    let best = (0..3).map(|_| pass()).fold(f64::INFINITY, f64::min);
    (data.len() * 8) as f64 / best / 1e9
}
