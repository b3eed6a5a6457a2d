//! Float matrices (F32, F16 and BF16 files, held as f32) and their product with a batch of
//! activations: the encoder's layers and any float matrix of a decoder.
//!
//! The matrix is packed at load into panels of [`PANEL`] output rows, interleaved along the
//! input: `panel[kk][l]` is row `8·p + l`, column `kk`. A kernel then reads 8 outputs' weights
//! with one or two vector loads and multiplies them by one broadcast activation, keeping
//! `MR × 8` sums in registers for the whole of `k`: every weight read serves `MR` rows and
//! every activation read 8 columns. One kernel per instruction set, each tested against the
//! portable one (`wasm.rs`, `avx2.rs`, `portable.rs`), chosen in `dispatch.rs` by the CPU's
//! one [`crate::cpu::Isa`]; work is split over the backend's threads in blocks of rows and
//! panels (`plan.rs`, on `pool.rs`).
//!
//! - `tile.rs`: the panel and result-tile shapes every kernel shares;
//! - `float.rs`: [`DenseMatrix`], f32 panels; `i8.rs`: [`I8Matrix`], an ONNX export's int8;
//! - `plan.rs`: outputs' bias and post-step, the cut of the work; `check.rs`: the kernel check.

#[cfg(target_arch = "x86_64")]
mod avx2;
mod check;
mod dispatch;
mod float;
mod i8;
mod plan;
mod portable;
#[cfg(test)]
mod tests;
mod tile;
#[cfg(target_arch = "wasm32")]
mod wasm;

pub use check::check_kernels;
pub use float::DenseMatrix;
pub use i8::{I8Kind, I8Matrix};
pub use plan::{Out, Post};
pub use tile::{Tile, TileI8, I8_PANEL, PANEL};
