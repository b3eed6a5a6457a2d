//! The flags every engine command shares (`--model`, `--n-ctx`, `--device`) and the load
//! they lead to; the log line every command's progress goes to.

use crate::{catalog, Engine, LoadOptions, Result};

/// Where and how a model runs.
#[derive(clap::Args, Debug)]
pub(super) struct ModelArgs {
    /// Catalog id, .gguf path, or an ONNX export (.onnx, or a folder with model.onnx;
    /// tokenizer.json and config.json beside it)
    #[arg(long, value_name = "MODEL")]
    pub(super) model: String,
    /// Context window in tokens (default 4096, at most the model's)
    #[arg(long)]
    pub(super) n_ctx: Option<usize>,
    /// auto (a GPU when one that is not a software renderer fits the model), cpu or webgpu
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    pub(super) device: DeviceArg,
    /// On the CPU: the exact path (16-bit activations, as close to a float64 forward pass as
    /// 0.001) instead of the 8-bit one llama.cpp runs (twice the products per instruction,
    /// the file's bytes in memory), which is the default where the CPU has AVX2
    #[arg(long)]
    pub(super) exact: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum DeviceArg {
    Auto,
    Cpu,
    #[value(alias = "gpu")]
    Webgpu,
}

pub(super) fn log(s: &str) {
    eprintln!("{s}");
}

pub(super) fn load(m: &ModelArgs) -> Result<(Engine, crate::EngineInfo)> {
    let src = catalog::open(&m.model, &mut |s| log(s))?;
    let device = device(m.device);
    pollster::block_on(Engine::load_async(
        src,
        &LoadOptions {
            no_gpu: None,
            device,
            n_ctx: m.n_ctx,
            exact: m.exact,
        },
        &mut |_, _| {},
    ))
}

pub(super) fn device(d: DeviceArg) -> crate::engine::Device {
    match d {
        DeviceArg::Auto => crate::engine::Device::Auto,
        DeviceArg::Cpu => crate::engine::Device::Cpu,
        DeviceArg::Webgpu => crate::engine::Device::Webgpu,
    }
}

pub(super) fn never() -> bool {
    false
}
