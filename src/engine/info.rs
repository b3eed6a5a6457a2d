//! What a load asks for ([`LoadOptions`]) and what the engine reports: [`EngineInfo`] (the
//! backend, why, the model's sizes and load times), [`GpuCounters`], the CPU backend's name.

use super::device::Device;

/// Options of [`Engine::load`](crate::engine::Engine::load).
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct LoadOptions {
    pub device: Device,
    /// Context window to run with (default: [`crate::config::DEFAULT_N_CTX`], capped by the model's).
    pub n_ctx: Option<usize>,
    /// With `auto`: the caller already looked for a GPU in this context and found none, and
    /// why (the package's check in the page); the engine does not look again.
    pub no_gpu: Option<String>,
    /// On the CPU natively: keep the exact path (16-bit activations, weights unpacked to
    /// int8) instead of the 8-bit one (the file's blocks on 8-bit activations, as llama.cpp
    /// multiplies them) where the CPU has it. wasm, the GPU and encoders always run the exact
    /// path.
    pub exact: bool,
}

/// What the engine runs and why.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EngineInfo {
    /// `webgpu`, `cpu-simd` (wasm with simd128), `cpu-simd-threads`, `cpu-native`.
    pub backend: &'static str,
    /// Why this backend was chosen.
    pub reason: String,
    /// The CPU kernels' instruction set: `relaxed-simd` (the relaxed wasm builds: int8 ONNX
    /// products on 7-bit activations), `simd128`, natively `avx2` or `portable`.
    pub simd: &'static str,
    /// The engine's version (a saved prompt prefix is used only by the same one).
    pub version: &'static str,
    pub model: String,
    pub arch: String,
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub n_layer: usize,
    /// The CPU's activations: `16-bit` (the exact path) or `8-bit` (natively, without
    /// `--exact`); `16-bit` on the GPU too.
    pub activations: &'static str,
    pub n_embd: usize,
    /// Bytes of tensor data in the file.
    pub weight_bytes: u64,
    /// Milliseconds to build the tokenizer.
    pub tokenizer_ms: f64,
    /// Milliseconds to copy the weights into place.
    pub load_ms: f64,
    /// The model family (`gemma3`, `llama`, `qwen2`, `qwen3`).
    pub family: crate::config::Family,
    /// Tensors per type in the file (`{"Q4_1": 210, "Q8_0": 1, "F32": 61}`): the quant mix.
    pub quants: std::collections::BTreeMap<String, usize>,
    /// Where chat prompts get their format: `file` (its `tokenizer.chat_template`),
    /// `builtin-gemma`, or none.
    pub chat_template: Option<crate::chat::TemplateSource>,
}

/// What the GPU did so far (see [`Engine::gpu_counters`](crate::engine::Engine::gpu_counters)).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct GpuCounters {
    pub encode_ms: f64,
    pub submits: u64,
    pub bytes_read: u64,
    pub buffers_created: u64,
    pub bind_groups_created: u64,
    pub dispatches: u64,
}

/// The CPU backend's name in [`EngineInfo::backend`] for this build.
pub(super) fn cpu_backend_name() -> &'static str {
    if cfg!(all(target_arch = "wasm32", feature = "threads")) {
        "cpu-simd-threads"
    } else if cfg!(target_arch = "wasm32") {
        "cpu-simd"
    } else {
        "cpu-native"
    }
}
