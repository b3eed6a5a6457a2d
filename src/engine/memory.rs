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
