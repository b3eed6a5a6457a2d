//! `by_rows!`, which turns a row count known only at run time into the constant one a SIMD
//! kernel keeps its accumulators in registers for. Declared first in mod.rs (`#[macro_use]`),
//! so that the kernels' files, declared after it, can call it.

/// `$f::<R, G16>(args)` for a row count `t` (1..=4) and `g16` known only at run time: the
/// SIMD kernels keep their accumulators in registers only for a constant row count.
macro_rules! by_rows {
    ($f:ident, $t:expr, $g16:expr, ($($arg:expr),* $(,)?)) => {
        by_rows!($f, $t, $g16, [], ($($arg),*))
    };
    // `[C, …]`: further generics after R and G16 (a const, or `_` for a type inferred).
    ($f:ident, $t:expr, $g16:expr, [$($c:tt),*], ($($arg:expr),* $(,)?)) => {
        match ($t, $g16) {
            (4, false) => $f::<4, false $(, $c)*>($($arg),*),
            (4, true) => $f::<4, true $(, $c)*>($($arg),*),
            (3, false) => $f::<3, false $(, $c)*>($($arg),*),
            (3, true) => $f::<3, true $(, $c)*>($($arg),*),
            (2, false) => $f::<2, false $(, $c)*>($($arg),*),
            (2, true) => $f::<2, true $(, $c)*>($($arg),*),
            (_, false) => $f::<1, false $(, $c)*>($($arg),*),
            (_, true) => $f::<1, true $(, $c)*>($($arg),*),
        }
    };
}
