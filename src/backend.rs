//! The ~10 operations a transformer needs, and nothing else. The forward pass (model/) is
//! written once against this trait; the CPU backend executes each call at once, a GPU backend
//! records it. Activations are 2-D: `n_tok` rows of `width` values, row-major.

use crate::config::Glu;
use crate::error::{Error, Result};
use crate::gguf::{ByteSource, TensorInfo};
use crate::logits::{is_allowed, TokenMask};

/// Prompt positions per prefill step by default ([`Backend::prompt_rows`]): large enough to
/// reuse each weight tile across rows, small enough to keep activations small and let an abort
/// land quickly.
pub const PREFILL_CHUNK: usize = 128;

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

/// What follows a linear layer, which a backend may do in the product's own pass
/// ([`Backend::linear_then`]).
#[derive(Clone, Copy)]
pub enum Then<'a, T> {
    /// GELU, exact (erf) form.
    Gelu,
    /// Plus a tensor of the output's shape (a residual).
    Add(&'a T),
}

/// A rotary embedding: which elements pair up and each pair's angle per position, computed
/// once per model from the base, the linear scaling and any frequency factors.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    pub head_dim: usize,
    /// NeoX pairs element `i` with `i + head_dim/2` (Gemma, Qwen); normal (GPT-J) pairs
    /// `2i` with `2i + 1` (Llama: the converter permuted q and k for it).
    pub neox: bool,
    /// Angle per position of each of the `head_dim/2` pairs.
    pub theta: Vec<f64>,
    /// A digest of the above: a GPU caches cos/sin by it.
    pub key: u64,
}

impl Rope {
    /// Pair `i` turns by `freq_scale · base^(-2i/head_dim) / factors[i]` per position, as
    /// llama.cpp computes it (Llama 3's `rope_freqs.weight` are the factors).
    pub fn new(
        head_dim: usize,
        base: f32,
        freq_scale: f32,
        factors: Option<&[f32]>,
        neox: bool,
    ) -> Self {
        let half = head_dim / 2;
        let theta: Vec<f64> = (0..half)
            .map(|i| {
                let f = f64::from(base).powf(-2.0 * i as f64 / head_dim as f64);
                let ff = factors
                    .and_then(|v| v.get(i))
                    .map_or(1.0, |&x| f64::from(x));
                f64::from(freq_scale) * f / ff
            })
            .collect();
        // FNV-1a over the bits: equal ropes share cos/sin.
        let mut key: u64 = 0xcbf2_9ce4_8422_2325 ^ u64::from(neox) ^ ((head_dim as u64) << 1);
        for t in &theta {
            key = (key ^ t.to_bits()).wrapping_mul(0x0100_0000_01b3);
        }
        Self {
            head_dim,
            neox,
            theta,
            key,
        }
    }
}

/// One layer's cached keys and values as a prefix snapshot holds them: the first `k.len() /
/// width` slots of a cache of `n_slots` (a ring's slot `s` holds the last position `p` with
/// `p % n_slots == s`), f32 as the backend computed them, so a restored prefix is bit for bit
/// the computed one.
#[derive(Clone, Debug, PartialEq)]
pub struct KvRows {
    pub n_slots: usize,
    pub width: usize,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

impl KvRows {
    /// Slots held.
    pub fn used(&self) -> usize {
        self.k.len() / self.width.max(1)
    }

    /// Whether these rows, saved after `n_past` positions, fit a cache of `n_slots` slots of
    /// `width` values: the slots it uses. A [`crate::Error::Snapshot`] otherwise.
    pub fn fit(&self, n_slots: usize, width: usize, n_past: usize) -> crate::error::Result<usize> {
        let used = n_past.min(n_slots);
        if self.n_slots != n_slots
            || self.width != width
            || self.used() != used
            || self.v.len() != self.k.len()
        {
            return Err(crate::error::Error::Snapshot(format!(
                "a layer of {} slots × {} values for {n_past} positions does not fit a cache of {n_slots} slots × {width}",
                self.n_slots, self.width
            )));
        }
        Ok(used)
    }

    /// The position slot `s` holds after `n_past` positions were written in order.
    pub fn position(&self, s: usize, n_past: usize) -> usize {
        let last = n_past - 1;
        last - (last + self.n_slots - s) % self.n_slots
    }
}

/// Each row's first row of its run, for runs of `lens` consecutive rows.
pub fn branch_starts(lens: &[usize]) -> Vec<usize> {
    let mut starts = Vec::with_capacity(lens.iter().sum());
    let mut at = 0;
    for &len in lens {
        starts.extend(std::iter::repeat_n(at, len));
        at += len;
    }
    starts
}

/// [`Backend::head_top_k`] through every logit: the default, and the fallback of a backend
/// that filters.
pub async fn head_top_k_of_logits<B: Backend + ?Sized>(
    be: &mut B,
    x: &B::Tensor,
    w: &B::Weight,
    k: usize,
    allowed: Option<&TokenMask>,
) -> Result<Vec<(u32, f32)>> {
    let logits = be.matmul(x, w)?;
    match allowed {
        Some(a) => be.top_k_masked(&logits, k, a).await,
        None => be.top_k(&logits, k).await,
    }
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
    /// [`Backend::load_weight`] of a tensor that serves as the LM head: a backend may take
    /// at load what [`Backend::head_top_k`] will need of it (the CPU's filter: per-row
    /// statistics), so the first token does not pay for it.
    fn load_head(&mut self, info: &TensorInfo, src: &dyn ByteSource) -> Result<Self::Weight> {
        self.load_weight(info, src)
    }
    /// [`Backend::load_head`] when `head`, else [`Backend::load_weight`], from a source whose
    /// reads may wait ([`ByteSource::read_at_async`]): the load [`crate::model::load_weights`]
    /// runs, so that a backend can unpack what it has while the next bytes are read. By
    /// default the synchronous load.
    async fn load_weight_async(
        &mut self,
        info: &TensorInfo,
        src: &dyn ByteSource,
        head: bool,
    ) -> Result<Self::Weight> {
        if head {
            self.load_head(info, src)
        } else {
            self.load_weight(info, src)
        }
    }
    /// An I8 matrix whose weight `(r, c)` is `(v − zero[r]) · scale[r]` (an int8 ONNX export's,
    /// kept as stored). By default dequantized to f32 on the host, exactly, and loaded as an
    /// F32 tensor; a backend with an int8 kernel keeps the int8 values.
    fn load_int8_weight(
        &mut self,
        info: &TensorInfo,
        scale: &[f32],
        zero: &[f32],
        src: &dyn ByteSource,
    ) -> Result<Self::Weight> {
        let values = crate::quant::int8_rows(info, scale, zero, src)?;
        let floats = crate::quant::dequantize_int8_rows(&values, scale, zero);
        let mut bytes = Vec::with_capacity(floats.len() * 4);
        for v in floats {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        let f32_info = TensorInfo {
            ty: crate::gguf::GgmlType::F32,
            offset: 0,
            n_bytes: bytes.len() as u64,
            ..info.clone()
        };
        self.load_weight(&f32_info, &bytes)
    }
    /// The most prompt positions a prefill step runs at once ([`PREFILL_CHUNK`]
    /// by default). A step's activations and scratch grow with it, and in wasm memory never
    /// comes back down, so a backend whose memory is the tab's may take fewer.
    fn prompt_rows(&self) -> usize {
        PREFILL_CHUNK
    }
    /// Another instance of this backend that runs the weights this one loaded, for a session
    /// of its own on them (a server slot: [`crate::session::Session::fork`]). By default a
    /// backend cannot: its weights live where only it reaches them (a GPU's device).
    fn fork(&self) -> Result<Self>
    where
        Self: Sized,
    {
        Err(Error::InvalidArgument(
            "this backend cannot share its weights with another session: load another engine"
                .into(),
        ))
    }
    /// A KV cache of `n_slots` positions (a ring when smaller than the context).
    fn new_kv(&mut self, n_slots: usize, n_head_kv: usize, head_dim: usize) -> Result<Self::Kv>;
    /// Forget every cached position.
    fn clear_kv(&mut self, kv: &mut Self::Kv);
    /// The keys and values of `kv` after exactly `n_past` positions were written (a GPU reads
    /// them back).
    async fn save_kv(&mut self, kv: &Self::Kv, n_past: usize) -> Result<KvRows>;
    /// Put saved rows back: afterwards `kv` is what it was when [`Backend::save_kv`] read it
    /// after `n_past` positions (the shapes must match).
    fn load_kv(&mut self, kv: &mut Self::Kv, rows: &KvRows, n_past: usize) -> Result<()>;

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
    /// `x @ wᵀ` for each of `ws` (an attention block's q, k and v; a feed-forward's gate
    /// and up): the same values as one [`Backend::matmul`] each (the CPU prepares `x` once
    /// and runs them in one pass over its threads when the weights are of one kind).
    fn matmuls(&mut self, x: &Self::Tensor, ws: &[&Self::Weight]) -> Result<Vec<Self::Tensor>> {
        ws.iter().map(|w| self.matmul(x, w)).collect()
    }
    /// `x @ wᵀ + b`: a layer with its bias (`b` a vector of `w`'s rows). A backend may do it
    /// in one pass; the bias is added to the finished sum either way.
    fn linear(
        &mut self,
        x: &Self::Tensor,
        w: &Self::Weight,
        b: &Self::Weight,
    ) -> Result<Self::Tensor> {
        let y = self.matmul(x, w)?;
        self.add_bias(&y, b)
    }
    /// [`Backend::linear`], then `then`: the same values as the two steps apart (the CPU
    /// does the second inside the product's pass over its threads).
    fn linear_then(
        &mut self,
        x: &Self::Tensor,
        w: &Self::Weight,
        b: &Self::Weight,
        then: Then<'_, Self::Tensor>,
    ) -> Result<Self::Tensor> {
        let y = self.linear(x, w, b)?;
        match then {
            Then::Gelu => self.gelu(&y),
            Then::Add(r) => self.add(&y, r),
        }
    }
    /// Several linear layers `(w, b)` of the same input (an attention block's q, k and v),
    /// the same values as one [`Backend::linear`] each (the CPU prepares the input once and
    /// runs them in one pass over its threads).
    fn linears(
        &mut self,
        x: &Self::Tensor,
        layers: &[(&Self::Weight, &Self::Weight)],
    ) -> Result<Vec<Self::Tensor>> {
        layers.iter().map(|(w, b)| self.linear(x, w, b)).collect()
    }
    /// Rotary embedding of every `rope.head_dim` group; row `t` is at position `pos[t]`.
    fn rope(&mut self, x: &Self::Tensor, pos: &[usize], rope: &Rope) -> Result<Self::Tensor>;
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
    /// Branches after the cache: consecutive runs of `lens` rows, each run at positions
    /// `first..` (every run continues the same cached prefix of `first` positions). A row
    /// attends over the cache and the earlier rows of its own run; nothing enters `kv`, so the
    /// prefix serves every run. Many continuations of one prompt scored in one pass (labels,
    /// choices): `(Σ lens, n_head·head_dim)`.
    #[allow(clippy::too_many_arguments)]
    fn attention_branches(
        &mut self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        kv: &Self::Kv,
        first: usize,
        lens: &[usize],
        p: AttnParams,
    ) -> Result<Self::Tensor>;
    /// Bidirectional attention within each of the consecutive sequences of `lens` rows (an
    /// encoder's packed batch; no cache): `(Σ lens, n_head·head_dim)`.
    fn attention_packed(
        &mut self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        lens: &[usize],
        p: AttnParams,
    ) -> Result<Self::Tensor>;
    /// LayerNorm of each row, `(x − mean) / sqrt(var + eps) · w + b` (encoders).
    fn layer_norm(
        &mut self,
        x: &Self::Tensor,
        w: &Self::Weight,
        b: &Self::Weight,
        eps: f32,
    ) -> Result<Self::Tensor>;
    /// GELU, exact (erf) form, elementwise (BERT's feed-forward).
    fn gelu(&mut self, x: &Self::Tensor) -> Result<Self::Tensor>;
    /// `act(gate) * up`.
    fn glu(&mut self, gate: &Self::Tensor, up: &Self::Tensor, act: Glu) -> Result<Self::Tensor>;
    /// `a + b`.
    fn add(&mut self, a: &Self::Tensor, b: &Self::Tensor) -> Result<Self::Tensor>;
    /// `x + bias` on every row (Qwen2's q/k/v biases); `bias` is a vector of `width(x)`.
    fn add_bias(&mut self, x: &Self::Tensor, bias: &Self::Weight) -> Result<Self::Tensor>;
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
        Ok(crate::logits::top_k(last, k))
    }

    /// [`Backend::top_k`] (with `allowed`, [`Backend::top_k_masked`]) of `x @ wᵀ`: the LM
    /// head's candidates for the last row of `x`, the same pairs bit for bit. A backend may
    /// find them without every logit (the CPU's int8 kernel filters on 7-bit activations).
    async fn head_top_k(
        &mut self,
        x: &Self::Tensor,
        w: &Self::Weight,
        k: usize,
        allowed: Option<&TokenMask>,
    ) -> Result<Vec<(u32, f32)>> {
        head_top_k_of_logits(self, x, w, k, allowed).await
    }

    /// [`Backend::top_k`] among the ids `allowed` marks (bit `i % 32` of word `i / 32`: an
    /// output constraint's mask): fewer than `k` when fewer are allowed. The allowed values
    /// are the unmasked ones, bit for bit. A GPU applies the mask on the device and still
    /// reads back only these.
    async fn top_k_masked(
        &mut self,
        x: &Self::Tensor,
        k: usize,
        allowed: &TokenMask,
    ) -> Result<Vec<(u32, f32)>> {
        let v = self.read(x).await?;
        let n = self.width(x);
        let mut last = v.len().checked_sub(n).map_or(&v[..], |s| &v[s..]).to_vec();
        let ok = |i: usize| is_allowed(allowed, i);
        for (i, l) in last.iter_mut().enumerate() {
            if !ok(i) {
                *l = f32::NEG_INFINITY;
            }
        }
        let mut top = crate::logits::top_k(&last, k);
        top.retain(|&(i, _)| ok(i as usize));
        Ok(top)
    }

    /// Run what was recorded so far and wait for it (a GPU submits its encoder: prefill
    /// chunks stay short of watchdog timeouts, and their time is measured). CPU: nothing.
    async fn sync(&mut self) -> Result<()> {
        Ok(())
    }

    /// Values per row of `x`.
    fn width(&self, x: &Self::Tensor) -> usize;
}
