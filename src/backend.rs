//! The ~10 operations a transformer needs, and nothing else. The forward pass (model/) is
//! written once against this trait; the CPU backend executes each call at once, a GPU backend
//! records it. Activations are 2-D: `n_tok` rows of `width` values, row-major.

use crate::error::Result;
use crate::gguf::{ByteSource, TensorInfo};

/// Shape and policy of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct AttnParams {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Multiplies q·k (Gemma 3: 1/sqrt(head_dim)).
    pub scale: f32,
    /// A key at position `pk` is visible from a query at `pq` when `pq - pk < window`
    /// (`usize::MAX` for global layers).
    pub window: usize,
}

/// A compute device for the forward pass.
#[allow(async_fn_in_trait)]
pub trait Backend {
    /// Activations, `(n_tok, width)`.
    type Tensor;
    /// A weight as the backend stores it (quantized matrices stay quantized).
    type Weight;
    /// One layer's KV cache.
    type Kv;

    /// Copy one tensor out of the model file into its final place (the only copy).
    fn load_weight(&mut self, info: &TensorInfo, src: &dyn ByteSource) -> Result<Self::Weight>;
    /// A KV cache of `n_slots` positions (a ring when smaller than the context).
    fn new_kv(&mut self, n_slots: usize, n_head_kv: usize, head_dim: usize) -> Result<Self::Kv>;
    /// Forget every cached position.
    fn clear_kv(&mut self, kv: &mut Self::Kv);

    /// Rows of `table` for `ids`, times `scale`: `(n_tok, n_embd)`.
    fn embed(&mut self, table: &Self::Weight, ids: &[u32], scale: f32) -> Result<Self::Tensor>;
    /// RMS-normalise each group of `len(w)` values and multiply by `w`.
    fn rms_norm(&mut self, x: &Self::Tensor, w: &Self::Weight, eps: f32) -> Result<Self::Tensor>;
    /// `res + rms_norm(x, w)`: a residual after a post-norm. A GPU does it in one pass.
    fn add_rms_norm(
        &mut self,
        res: &Self::Tensor,
        x: &Self::Tensor,
        w: &Self::Weight,
        eps: f32,
    ) -> Result<Self::Tensor> {
        let n = self.rms_norm(x, w, eps)?;
        self.add(res, &n)
    }
    /// `x @ wᵀ`: `(n_tok, k) × (n, k)ᵀ → (n_tok, n)`.
    fn matmul(&mut self, x: &Self::Tensor, w: &Self::Weight) -> Result<Self::Tensor>;
    /// NeoX-style rotary embedding of every `head_dim` group; row `t` is at position `pos[t]`.
    fn rope(
        &mut self,
        x: &Self::Tensor,
        pos: &[usize],
        head_dim: usize,
        base: f32,
    ) -> Result<Self::Tensor>;
    /// Append `k`, `v` (rows at `pos`) to `kv`, and attend with `q` over everything visible:
    /// `(n_tok, n_head·head_dim)`.
    fn attention(
        &mut self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        kv: &mut Self::Kv,
        pos: &[usize],
        p: AttnParams,
    ) -> Result<Self::Tensor>;
    /// `gelu_tanh(gate) * up`.
    fn gelu_mul(&mut self, gate: &Self::Tensor, up: &Self::Tensor) -> Result<Self::Tensor>;
    /// `a + b`.
    fn add(&mut self, a: &Self::Tensor, b: &Self::Tensor) -> Result<Self::Tensor>;
    /// Rows `start..start + n`.
    fn rows(&mut self, x: &Self::Tensor, start: usize, n: usize) -> Result<Self::Tensor>;
    /// The values, row-major (the end of a step: logits or hidden states).
    async fn read(&mut self, x: &Self::Tensor) -> Result<Vec<f32>>;

    /// The `k` largest `(index, value)` of the last row of `x`, largest first (ties: the
    /// lower index first). A GPU computes this on the device and reads back only these.
    async fn top_k(&mut self, x: &Self::Tensor, k: usize) -> Result<Vec<(u32, f32)>> {
        let v = self.read(x).await?;
        let n = self.width(x);
        let last = v.len().checked_sub(n).map_or(&v[..], |s| &v[s..]);
        Ok(crate::sampler::top_k(last, k))
    }

    /// Run what was recorded so far and wait for it (a GPU submits its encoder: prefill
    /// chunks stay short of watchdog timeouts, and their time is measured). CPU: nothing.
    async fn sync(&mut self) -> Result<()> {
        Ok(())
    }

    /// Values per row of `x`.
    fn width(&self, x: &Self::Tensor) -> usize;
}
