//! Launch code of the kernels: pipelines built once, dispatches recorded into the caller's
//! encoder.

pub mod matvec;

/// Workgroups for `n` items: (x, y) with x ≤ 65 535 (the dispatch limit per dimension).
pub fn grid(n: u32) -> (u32, u32) {
    const MAX: u32 = 65_535;
    if n <= MAX {
        (n.max(1), 1)
    } else {
        (MAX, n.div_ceil(MAX))
    }
}
