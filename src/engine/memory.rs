//! The memory a model needs on the CPU backend ([`cpu_resident_bytes`], [`cpu_step_bytes`]),
//! and the check that refuses one that cannot fit before any weight is read ([`check_fits`]).

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::gguf::Gguf;

/// Usable wasm memory: 4 GiB less room for the code, tokenizer and activations.
pub(super) const WASM_MEMORY_BUDGET: u64 = (4 << 30) - (384 << 20);

/// The bytes the CPU backend holds for this model: its weights as it keeps them (int8 with
/// f32 scales, 4-bit codes packed) plus the KV cache at `cfg.n_ctx`. The device check compares
/// it with the memory there is.
/// `fast`: natively on the 8-bit path, which holds the file's blocks.
pub fn cpu_resident_bytes(g: &Gguf, cfg: &ModelConfig, fast: bool) -> u64 {
    g.tensors
        .iter()
        .map(|t| cpu_tensor_bytes(t, cfg, fast))
        .sum::<u64>()
        .saturating_add(cfg.kv_cache_bytes())
}

/// What a model will hold on this build's CPU backend, from its header alone: what `probe`
/// states before the download ([`plan`]).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryPlan {
    /// The weights as the CPU backend keeps them ([`cpu_resident_bytes`] less the KV cache).
    pub weight_bytes: u64,
    /// The KV cache at `n_ctx`.
    pub kv_bytes: u64,
    pub n_ctx: usize,
    /// The vocabulary's pieces and merges as the header holds them: their bytes and, per
    /// string, its end offset (8 bytes; 4 in wasm, so a little over there).
    pub vocabulary_bytes: u64,
    /// The file's tensor bytes, and its header's.
    pub file_tensor_bytes: u64,
    pub header_bytes: u64,
    /// The tab's memory for the engine at its peak: the weights, the KV cache, the tokenizer
    /// ([`PEAK_VOCABULARY_FACTOR`]) and the fixed needs ([`PEAK_FIXED_BYTES`]).
    pub peak_bytes: u64,
}

/// The memory the tokenizer keeps per byte of the vocabulary's pieces and merges in the header
/// (the header's own copy is freed before the weights arrive, which reuse its room).
pub const PEAK_VOCABULARY_FACTOR: u64 = 1;

/// What a tab holds for the engine beside its heap's contents: the worker, the compiled code,
/// stacks, the allocator's slack and the read windows. Measured in Chromium (renderer RSS at
/// the load's peak less the page's before it, against the wasm memory): 7-17 MiB from the tiny
/// test models to a 1B shape.
pub const PEAK_FIXED_BYTES: u64 = 12 << 20;

/// The memory `g` will need on this build's CPU backend at `cfg.n_ctx`, from its header alone.
pub fn plan(g: &Gguf, cfg: &ModelConfig) -> MemoryPlan {
    let kv_bytes = cfg.kv_cache_bytes();
    let weight_bytes = cpu_resident_bytes(g, cfg, false).saturating_sub(kv_bytes);
    let vocabulary_bytes: u64 = ["tokenizer.ggml.tokens", "tokenizer.ggml.merges"]
        .iter()
        .filter_map(|k| g.get(k)?.as_array()?.strings())
        .map(|s| s.iter().map(|p| p.len() as u64 + 8).sum::<u64>())
        .sum();
    let peak_bytes = weight_bytes
        .saturating_add(kv_bytes)
        .saturating_add(vocabulary_bytes.saturating_mul(PEAK_VOCABULARY_FACTOR))
        .saturating_add(PEAK_FIXED_BYTES);
    MemoryPlan {
        weight_bytes,
        kv_bytes,
        n_ctx: cfg.n_ctx,
        vocabulary_bytes,
        file_tensor_bytes: g.tensors.iter().map(|t| t.n_bytes).sum(),
        header_bytes: g.data_offset,
        peak_bytes,
    }
}

/// [`plan`] from a file's first bytes (of `file_len`), at `n_ctx` (`None`: the default), or
/// `None` where the header runs past them.
pub fn plan_prefix(
    prefix: &[u8],
    file_len: u64,
    n_ctx: Option<usize>,
) -> Result<Option<MemoryPlan>> {
    let Some(g) = Gguf::read_prefix(prefix, file_len)? else {
        return Ok(None);
    };
    let cfg = ModelConfig::from_gguf(&g, n_ctx)?;
    Ok(Some(plan(&g, &cfg)))
}

/// The weight bytes a decoder's step reads on the CPU backend: every tensor as it is held
/// there ([`cpu_resident_bytes`]), but for token embeddings apart from the LM head, of which
/// a step reads one row.
pub fn cpu_step_bytes(g: &Gguf, cfg: &ModelConfig, fast: bool) -> u64 {
    g.tensors
        .iter()
        .filter(|t| read_each_step(t, cfg))
        .map(|t| cpu_tensor_bytes(t, cfg, fast))
        .sum()
}

/// The bytes the file holds for what [`cpu_step_bytes`] counts: what a decode step would read
/// if it read the weights as the file holds them.
pub fn file_step_bytes(g: &Gguf, cfg: &ModelConfig) -> u64 {
    g.tensors
        .iter()
        .filter(|t| read_each_step(t, cfg))
        .map(|t| t.n_bytes)
        .sum()
}

/// Whether a decode step reads all of tensor `t`: every one but token embeddings apart from
/// the LM head, of which a step reads one row.
fn read_each_step(t: &crate::gguf::TensorInfo, cfg: &ModelConfig) -> bool {
    t.name != "token_embd.weight" || is_head(&t.name, cfg)
}

/// The LM head: `output.weight`, or the embeddings where they are tied to it.
fn is_head(name: &str, cfg: &ModelConfig) -> bool {
    name == "output.weight"
        || (name == "token_embd.weight"
            && (!cfg.untied_output || cfg.family == crate::config::Family::Gemma3)
            && cfg.family != crate::config::Family::Bert)
}

fn cpu_tensor_bytes(t: &crate::gguf::TensorInfo, cfg: &ModelConfig, fast: bool) -> u64 {
    let n = t.dims.iter().product::<u64>();
    let cols = t.dims.first().copied().unwrap_or(0);
    crate::cpu::resident_bytes(t.ty, cols, n, is_head(&t.name, cfg), fast)
}

/// A typed error before any weight is read when the CPU backend would need more than
/// `budget` bytes (wasm: its 4 GiB address space) for the weights as it holds them plus the
/// KV cache.
pub fn check_fits(g: &Gguf, cfg: &ModelConfig, budget: Option<u64>) -> Result<()> {
    let Some(budget) = budget else {
        return Ok(());
    };
    // The budget is wasm's, where the exact path is the only one.
    let resident = cpu_resident_bytes(g, cfg, false);
    if resident > budget {
        return Err(Error::ModelTooLarge {
            need_mb: resident >> 20,
            limit_mb: budget >> 20,
            what: "of wasm memory for its weights and KV cache",
        });
    }
    Ok(())
}
