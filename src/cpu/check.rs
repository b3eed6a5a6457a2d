//! The kernels' self-check, which the package runs in the browser at load.

/// This build's SIMD kernels against the portable ones (the float and int8 panels of
/// dense/, the quantized matrices' products and the LM head's filter of int8/, the dot
/// products of ops): the number of outputs compared, or what differed. The package runs it
/// when it loads a relaxed-SIMD build, whose instructions are only as good as the browser's
/// lowering of them.
pub fn check_kernels() -> std::result::Result<usize, String> {
    Ok(super::dense::check_kernels()?
        + super::int8::check_kernels()?
        + super::ops::check_kernels()?)
}
