//! The CPU backend. Quantized matrices (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K … Q6_K) run on our
//! int8 kernels with 16-bit activations (int8/); F32, F16 and BF16 matrices as packed f32
//! panels, and an ONNX export's int8 rows, on the dense kernels (dense/); attention by chunks
//! of key positions (attention/); norms, RoPE and vector helpers in ops/. Every kernel
//! family picks its instruction set the same way (isa.rs: one file per instruction set,
//! each checked against the portable one). Products and attention split over threads
//! (pool.rs; in the wasm threads build our own team, team.rs). `check.rs` holds every SIMD
//! kernel to its portable twin (the package runs it in the browser).
//!
//! - `backend.rs`: [`CpuBackend`], the [`crate::backend::Backend`] operations;
//! - `tensor.rs`: activations ([`Act`]) and weights ([`CpuWeight`]);
//! - `load.rs`: a tensor from the file into its final place (the only copy);
//! - `q8/`: natively, unless `--exact`: the file's blocks on 8-bit activations, as llama.cpp.

mod attention;
mod backend;
mod check;
pub mod dense;
pub mod int8;
mod isa;
mod load;
mod ops;
mod pool;
#[cfg(not(target_arch = "wasm32"))]
pub mod q8;
// Used by the wasm threads build's pool; compiled (and tested) everywhere.
#[cfg_attr(
    not(all(target_arch = "wasm32", feature = "threads")),
    allow(dead_code)
)]
mod team;
mod tensor;
#[cfg(test)]
mod tests;

pub use attention::KvCache;
pub use backend::CpuBackend;
pub use check::check_kernels;
pub use isa::Isa;
pub use load::{resident_bytes, SUPPORTED_TYPES};
#[cfg(not(target_arch = "wasm32"))]
pub use pool::read_rate_gb_per_s;
pub use tensor::{Act, CpuWeight};
