//! Our own matrix kernel for quantized weights, used on every target: int8 values with f32
//! scales in separate arrays, so a dot product never converts an f16 in software (wasm has
//! no f16 instructions), and a tile of 4 activation rows shares each loaded weight block.
//!
//! Weights: every quantized type is unpacked exactly to int8 values with f32 scales and,
//! where the type has minimums, offsets (`w = scale · q − offset`): Q4_0, Q4_1, Q5_0, Q5_1 and
//! Q8_0 with one scale per 32 values, as Q4_K and Q5_K (their sub-blocks of 32), Q2_K, Q3_K
//! and Q6_K with one per 16. The 4-bit types (Q4_0, Q4_1, Q4_K) keep their codes packed in
//! memory, 16 bytes per 32 values (Q4_K 0.75 bytes per weight with its f32 scales and
//! offsets, not 1.25): a decode step's kernel widens the nibbles to 16 bits itself, a
//! prompt's unpacks each weight row to int8 once for all its activation rows; less memory
//! and less to read per token, the same sums bit for bit. In wasm, Q5_0 (Gemma 3's and
//! Qwen2's fallback for rows K-quants cannot split) keeps its codes three to a 16-bit lane
//! ([`Packing::Fives`](packing::Packing::Fives): 0.67 bytes a value), which a kernel takes apart with one mask or
//! shift per 8 values, as int8 takes one widening; natively it stays int8 (the file's bit
//! planes cost 41% more instructions per Gemma 3 270M decode step there, and native memory
//! is not the tab's). Q5_1 and Q5_K stay int8. Two exceptions to f32 scales, each where a
//! kernel reads the file's f16 with a shift or two instead of converting it ([`Scales::F16`](layout::Scales::F16)):
//! a Q8_0 LM head where the build has the head's filter ([`Scale`]), and in wasm Q5_0 in the
//! five-bit layout ([`BlockScale`]; 0.69 bytes a value with its scales, not 0.79). A third in
//! wasm: the K-quants keep their scales and offsets as the file codes them, a unit a block
//! and a byte a group ([`Scales::Coded`](layout::Scales::Coded)), made f32 a span of rows at a time before a
//! product (Q4_K 0.59 bytes a value, not 0.75; Q6_K 1.08, not 1.25).
//!
//! Activations are quantized to 16 bits per 32-value block (f32 scale), not to 8 bits as
//! llama.cpp and candle do: the kernel multiplies in i16 lanes anyway (`i32x4.dot_i16x8_s`,
//! `vpmaddwd`), so the finer grid costs nothing. With 8-bit activations the K-quant matmuls
//! were the only real error against the float64 reference (top-1 93%, |Δ logit| 0.17 mean);
//! with 16 bits the whole forward pass matches it to 0.001. Overflow: |x| ≤ 32 767,
//! |w| ≤ 128, so a 32-value block sums below 2^27 per lane.
//!
//! The files, each importing only from those listed before it:
//! - `macros.rs`: `by_rows!`, a run-time row count as the kernels' constant one;
//! - `scale.rs`: what the kernels share: the activation block, and how a kernel reads a
//!   weight scale ([`Scale`], [`BlockScale`]);
//! - `portable.rs`, `avx2.rs`, `wasm.rs`: the kernels, one file per instruction set; the
//!   portable ones are the reference the others are checked against;
//! - `packing.rs`: how 4- and 5-bit codes are held packed;
//! - `dispatch.rs`: the wrappers that run this build's kernel for each operation, the one
//!   place that picks an instruction set ([`has_fast_u7`]);
//! - `decode.rs`: GGML's file blocks as int8 values, scales and offsets;
//! - `layout.rs`: [`QMatrix`], how it holds its values and scales, and its rows read back;
//! - `activations.rs`: activation rows quantized to 16 bits;
//! - `load.rs`: a [`QMatrix`] from a tensor in the file, in the layout this build keeps;
//! - `products.rs`: the products with activation rows (a prompt's, a decode step's);
//! - `head.rs`: the LM head's top-k filter on 7-bit activations ([`QMatrix::top_k`]);
//! - `check.rs`: [`check_kernels`], which the browser package runs at load.

#[macro_use]
mod macros;

mod activations;
#[cfg(target_arch = "x86_64")]
mod avx2;
mod check;
mod decode;
mod dispatch;
mod head;
mod layout;
mod load;
mod packing;
mod portable;
mod products;
mod scale;
#[cfg(target_arch = "wasm32")]
mod wasm;

pub use check::check_kernels;
pub use dispatch::has_fast_u7;
pub use layout::QMatrix;
pub use scale::{BlockScale, Scale};
