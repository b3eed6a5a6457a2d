//! [`Backend`](crate::backend::Backend) on the GPU: every op records a dispatch into one command encoder; `read`
//! submits it and reads the result back. The forward pass is the same generic model code as
//! on the CPU. Activations come from a pool, parameters and small inputs from one arena,
//! bind groups from a cache: a decode step of a shape seen before creates nothing.
//!
//! - `state.rs`: [`GpuBackend`] (the device, kernels, recorder, pool), [`GpuTensor`], and
//!   what every op shares;
//! - `ops.rs`: the `Backend` impl, each op's checks and launch;
//! - `kv.rs`: the KV cache ([`GpuKv`]), cleared, read back and written;
//! - `topk.rs`: the top-k in stages on the device ([`TOPK_MAX`]).
//!
//! Each kernel's launch code and typed params stay below, in `gpu/kernels/`.

mod kv;
mod ops;
mod state;
mod topk;

pub use kv::GpuKv;
pub use state::{GpuBackend, GpuTensor};
pub use topk::TOPK_MAX;
