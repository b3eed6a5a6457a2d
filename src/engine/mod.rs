//! The engine: the one place that matches on the device. It probes, picks a backend, loads
//! the model onto it and hands out the generic [`Session`](crate::session::Session) for that backend.
//!
//! - `device.rs`: the device decision, pure ([`choose`], [`after_gpu_failure`]) and its test;
//! - `run.rs`: the [`Engine`], its calls and its recovery on the CPU when the GPU fails;
//! - `load.rs`: loading onto the CPU or the GPU;
//! - `memory.rs`: what a model needs on the CPU ([`check_fits`] and the estimates);
//! - `info.rs`: the load options and what the engine reports.

mod device;
mod info;
mod load;
mod memory;
mod run;

pub use device::{after_gpu_failure, choose, Choice, Device, GpuProbe};
pub use info::{EngineInfo, GpuCounters, LoadOptions};
pub use memory::{
    check_fits, cpu_resident_bytes, cpu_step_bytes, file_step_bytes, plan, plan_prefix, MemoryPlan,
};
pub use run::{Engine, Fork};
