//! The native fast path: weights kept as the file's own blocks, multiplied with 8-bit
//! activations as llama.cpp multiplies them (`Q8_0` activations for the 32-value types, `Q8_K`
//! for the K-quants), so a product does twice the work per instruction of the exact path's
//! 16-bit activations (int8/) and a decode step reads the file's bytes, no more.
//!
//! The exact path stays the default in wasm and behind `--exact` natively: 8-bit activations
//! round each value to 1/127 of its block's largest, which moves the logits by about as much
//! as llama.cpp's own do from a float64 forward pass (the gate in tests/reference.rs holds
//! this path to llama.cpp's distance on the same file).
//!
//! Numerics, per weight type (`d`: the weight block's scale, `dx`: the activation block's;
//! sums of integer products are exact, the float sums run block by block):
//! - Q4_0, Q5_0, Q8_0: `Σ_blocks d·dx·Σ q·x` over 32 values (`q` signed: Q4_0 `n − 8`,
//!   Q5_0 `n − 16`);
//! - Q4_K: `Σ_blocks dx·(d·Σ_j sc_j·Σ q·x − dmin·Σ_j m_j·Σx_j)`, `j` the 8 sub-blocks of 32,
//!   `q` the nibbles, `Σx_j` the activation block's exact sums (`bsums`);
//! - Q6_K: `Σ_blocks d·dx·Σ_j sc_j·Σ q·x`, 16 sub-blocks of 16, `q = six bits − 32`.
//!
//! One difference from llama.cpp: a `Q8_0` activation block keeps its scale in f32, not
//! rounded to f16 (the values are rounded with the f32 scale in both), one rounding fewer.
//!
//! - `kind.rs`: the block types this path takes, their layouts and scalar dots (the
//!   reference the SIMD kernels are checked against) and rows dequantized (embeddings);
//! - `act.rs`: activation rows quantized to `Q8_0` or `Q8_K`;
//! - `avx2.rs`: the AVX2 (with FMA and F16C) kernels (a tile of one weight row and up to four activation rows);
//! - `matrix.rs`: [`BlockMatrix`], its load and its products over the pool.

mod act;
#[cfg(target_arch = "x86_64")]
mod avx2;
mod kind;
mod matrix;
#[cfg(test)]
mod tests;

pub use kind::Kind;
pub use matrix::BlockMatrix;

/// Whether this CPU runs the 8-bit path's SIMD kernels (else the exact path is used, the
/// portable 8-bit kernels being only a reference).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
