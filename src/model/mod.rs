//! Forward passes, one file per architecture family, each generic over [`crate::Backend`].
//! [`Model`] is the one place that matches on the family; everything above it (generate.rs,
//! engine.rs) holds a `Model<B>` and never names a family.

pub mod bert;
pub mod gemma3;
pub mod llama;

use crate::backend::{AttnParams, Backend};
use crate::config::{Family, ModelConfig};
use crate::error::{Error, Result};
use crate::gguf::{now, ByteSource, GgmlType, Gguf, SyncReads, TensorInfo};

/// The KV caches of all layers and how many positions they hold.
pub struct Cache<B: Backend> {
    pub layers: Vec<B::Kv>,
    pub n_past: usize,
}

/// Load progress: bytes copied so far, of all tensor bytes.
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64);

/// A loaded decoder of any family this build runs.
pub enum Model<B: Backend> {
    Gemma3(gemma3::Gemma3<B>),
    /// Llama, SmolLM, Qwen2 and Qwen3: one forward pass, the differences in the config.
    Llama(llama::Llama<B>),
    /// BERT-family encoders: token states for embeddings, no next token.
    Bert(bert::Bert<B>),
}

impl<B: Backend> Model<B> {
    /// The family's weights from `src` (every tensor's presence and shape checked first),
    /// every read done when asked ([`SyncReads`]).
    pub fn load(
        be: &mut B,
        g: &Gguf,
        src: &dyn ByteSource,
        cfg: ModelConfig,
        progress: Progress,
    ) -> Result<Self> {
        now(Self::load_async(be, g, &SyncReads(src), cfg, progress))?
    }

    /// [`Model::load`] awaiting each read ([`ByteSource::read_at_async`]): a source that
    /// reads ahead on another thread has the next bytes ready while these are unpacked.
    pub async fn load_async(
        be: &mut B,
        g: &Gguf,
        src: &dyn ByteSource,
        cfg: ModelConfig,
        progress: Progress<'_>,
    ) -> Result<Self> {
        match cfg.family {
            Family::Gemma3 => gemma3::Gemma3::load(be, g, src, cfg, progress)
                .await
                .map(Self::Gemma3),
            Family::Llama | Family::Qwen2 | Family::Qwen3 => {
                llama::Llama::load(be, g, src, cfg, progress)
                    .await
                    .map(Self::Llama)
            }
            Family::Bert => bert::Bert::load(be, g, src, cfg, progress)
                .await
                .map(Self::Bert),
        }
    }

    pub fn cfg(&self) -> &ModelConfig {
        match self {
            Self::Gemma3(m) => &m.cfg,
            Self::Llama(m) => &m.cfg,
            Self::Bert(m) => &m.cfg,
        }
    }

    /// An empty KV cache: per layer, a ring of `sliding_window` slots for sliding layers,
    /// `n_ctx` for global ones.
    pub fn new_cache(&self, be: &mut B) -> Result<Cache<B>> {
        let c = self.cfg();
        if c.family.is_encoder() {
            return Ok(Cache {
                layers: Vec::new(),
                n_past: 0,
            });
        }
        let layers = (0..c.n_layer)
            .map(|il| be.new_kv(c.kv_slots(il), c.n_head_kv, c.head_dim))
            .collect::<Result<_>>()?;
        Ok(Cache { layers, n_past: 0 })
    }

    /// Run `ids` after what `cache` holds: the hidden states `(ids.len(), n_embd)`.
    pub fn forward(&self, be: &mut B, ids: &[u32], cache: &mut Cache<B>) -> Result<B::Tensor> {
        self.forward_rows(be, ids, Rows::Next, cache)
    }

    /// Run `ids` as branches of `lens` ids, each continuing what `cache` holds, which keeps
    /// only that: the hidden states `(ids.len(), n_embd)`, a branch's rows together.
    pub fn forward_branches(
        &self,
        be: &mut B,
        ids: &[u32],
        lens: &[usize],
        cache: &mut Cache<B>,
    ) -> Result<B::Tensor> {
        self.forward_rows(be, ids, Rows::Branches(lens), cache)
    }

    fn forward_rows(
        &self,
        be: &mut B,
        ids: &[u32],
        rows: Rows,
        cache: &mut Cache<B>,
    ) -> Result<B::Tensor> {
        match self {
            Self::Gemma3(m) => m.forward(be, ids, rows, cache),
            Self::Llama(m) => m.forward(be, ids, rows, cache),
            Self::Bert(_) => Err(not_a_decoder()),
        }
    }

    /// A decoder's LM head `(n_vocab, n_embd)`.
    pub(crate) fn lm_weight(&self) -> Result<&B::Weight> {
        match self {
            Self::Gemma3(m) => Ok(m.head()),
            Self::Llama(m) => Ok(m.head()),
            Self::Bert(_) => Err(not_a_decoder()),
        }
    }

    /// Logits `(rows, n_vocab)` of hidden states `(rows, n_embd)`.
    pub fn lm_head(&self, be: &mut B, hidden: &B::Tensor) -> Result<B::Tensor> {
        be.matmul(hidden, self.lm_weight()?)
    }

    /// The `k` largest logits of the last hidden row (among `allowed`, an output
    /// constraint's mask), as [`Backend::top_k`] of [`Model::lm_head`] gives them, without
    /// every logit where the backend can (see [`Backend::head_top_k`]).
    pub async fn lm_head_top_k(
        &self,
        be: &mut B,
        hidden: &B::Tensor,
        k: usize,
        allowed: Option<&[u32]>,
    ) -> Result<Vec<(u32, f32)>> {
        be.head_top_k(hidden, self.lm_weight()?, k, allowed).await
    }

    /// The sequence-classification head of an encoder that has one.
    pub fn head(&self) -> Option<&bert::Head> {
        match self {
            Self::Bert(m) => m.head.as_ref(),
            _ => None,
        }
    }

    /// Every token's state for a batch of texts, packed `(Σ len, n_embd)`: encoders only.
    pub fn encode(&self, be: &mut B, texts: &[Vec<u32>]) -> Result<B::Tensor> {
        match self {
            Self::Bert(m) => m.forward(be, texts),
            _ => Err(Error::InvalidArgument(format!(
                "{} is a decoder: embeddings come from an encoder model (bert)",
                self.cfg().arch
            ))),
        }
    }
}

/// `x @ wᵀ` for each of `ws` in one [`Backend::matmuls`] call (q, k and v; gate and up).
pub(crate) fn matmuls<B: Backend, const N: usize>(
    be: &mut B,
    x: &B::Tensor,
    ws: [&B::Weight; N],
) -> Result<[B::Tensor; N]> {
    be.matmuls(x, &ws)?
        .try_into()
        .map_err(|_| Error::Backend("matmuls: not one output per weight".into()))
}

fn not_a_decoder() -> Error {
    Error::InvalidArgument(
        "this model is an encoder (embeddings): it does not generate text; use embed".into(),
    )
}

/// Where a forward pass's rows go.
#[derive(Clone, Copy, Debug)]
pub enum Rows<'a> {
    /// After what the cache holds, and into it.
    Next,
    /// Consecutive runs of `lens` rows, each continuing what the cache holds (which keeps
    /// only that prefix): many continuations of one prompt in one pass.
    Branches(&'a [usize]),
}

/// The positions of a forward pass's rows and how they attend, checked against the context.
pub struct Span<'a> {
    pub pos: Vec<usize>,
    first: usize,
    branches: Option<&'a [usize]>,
}

impl<'a> Span<'a> {
    /// The span of `n` rows placed by `rows` after what `cache` holds, or the typed error
    /// when they pass the context.
    pub fn new<B: Backend>(
        cfg: &ModelConfig,
        cache: &Cache<B>,
        n: usize,
        rows: Rows<'a>,
    ) -> Result<Self> {
        let first = cache.n_past;
        let (pos, branches) = match rows {
            Rows::Next => ((first..first + n).collect::<Vec<_>>(), None),
            Rows::Branches(lens) => {
                if lens.iter().sum::<usize>() != n {
                    return Err(Error::Backend(
                        "forward: the branches' lengths disagree with the rows".into(),
                    ));
                }
                let pos = lens.iter().flat_map(|&len| first..first + len).collect();
                (pos, Some(lens))
            }
        };
        let needed = pos.iter().map(|&p| p + 1).max().unwrap_or(first);
        if needed > cfg.n_ctx {
            return Err(Error::ContextFull {
                needed,
                n_ctx: cfg.n_ctx,
            });
        }
        Ok(Self {
            pos,
            first,
            branches,
        })
    }

    /// One layer's attention of the span's rows.
    #[allow(clippy::too_many_arguments)]
    pub fn attend<B: Backend>(
        &self,
        be: &mut B,
        q: &B::Tensor,
        k: &B::Tensor,
        v: &B::Tensor,
        kv: &mut B::Kv,
        p: AttnParams,
    ) -> Result<B::Tensor> {
        match self.branches {
            None => be.attention(q, k, v, kv, &self.pos, p),
            Some(lens) => be.attention_branches(q, k, v, kv, self.first, lens, p),
        }
    }

    /// After the pass: the cache holds the rows that entered it.
    pub fn done<B: Backend>(&self, cache: &mut Cache<B>) {
        if self.branches.is_none() {
            cache.n_past += self.pos.len();
        }
    }
}

/// A tensor a family reads: its name, its dims as ggml lists them (fastest first) and
/// whether the file must have it.
pub struct Want {
    pub name: String,
    pub dims: Vec<u64>,
    pub required: bool,
    /// It serves as the LM head ([`Backend::load_head`]).
    pub head: bool,
}

impl Want {
    /// A tensor the file must have, `dims` in ggml order (`[cols, rows]` for a matrix).
    pub fn new(name: &str, dims: &[usize]) -> Self {
        Self {
            name: name.to_string(),
            dims: dims.iter().map(|&d| d as u64).collect(),
            required: true,
            head: false,
        }
    }

    /// This tensor serves as the LM head.
    pub fn head(self) -> Self {
        Self { head: true, ..self }
    }

    /// A tensor the file may leave out (then the family does without it).
    pub fn optional(name: &str, dims: &[usize]) -> Self {
        Self {
            required: false,
            ..Self::new(name, dims)
        }
    }
}

/// The weights of [`load_weights`], in the order they were wanted.
pub struct Weights<W>(std::vec::IntoIter<(String, Option<W>)>);

impl<W> Weights<W> {
    /// The next wanted tensor, which the file may have left out.
    pub fn next_optional(&mut self) -> Result<Option<W>> {
        self.0
            .next()
            .map(|(_, w)| w)
            .ok_or_else(|| Error::Config("tensor list exhausted".into()))
    }

    /// The next wanted tensor, which the file has.
    pub fn next_required(&mut self) -> Result<W> {
        match self.0.next() {
            Some((_, Some(w))) => Ok(w),
            Some((name, None)) => Err(Error::Config(format!("tensor {name} is missing"))),
            None => Err(Error::Config("tensor list exhausted".into())),
        }
    }
}

/// Check every wanted tensor's presence and shape first (a wrong file fails before any
/// weight is copied), then copy them one by one in the file's order (so a source reading
/// ahead reads on, never back), reporting progress in bytes.
pub async fn load_weights<B: Backend>(
    be: &mut B,
    g: &Gguf,
    src: &dyn ByteSource,
    wanted: &[Want],
    progress: Progress<'_>,
) -> Result<Weights<B::Weight>> {
    let mut infos: Vec<Option<&TensorInfo>> = Vec::with_capacity(wanted.len());
    for w in wanted {
        let info = match g.tensor(&w.name) {
            Some(info) => info,
            None if !w.required => {
                infos.push(None);
                continue;
            }
            None => return Err(Error::Config(format!("tensor {} is missing", w.name))),
        };
        if info.dims != w.dims {
            return Err(Error::Config(format!(
                "tensor {} has shape {:?}, expected {:?}",
                w.name, info.dims, w.dims
            )));
        }
        infos.push(Some(info));
    }
    let total: u64 = infos.iter().flatten().map(|t| t.n_bytes).sum();
    let mut done = 0u64;
    let mut order: Vec<usize> = (0..wanted.len()).collect();
    order.sort_by_key(|&i| infos[i].map_or(0, |t| t.offset));
    let mut loaded: Vec<Option<B::Weight>> =
        std::iter::repeat_with(|| None).take(wanted.len()).collect();
    for i in order {
        let (w, info) = (&wanted[i], infos[i]);
        loaded[i] = match info {
            Some(info) if info.ty == GgmlType::I8 && info.dims.len() == 2 => {
                // An int8 matrix with its scale and zero per row (convert.rs, OutType::I8).
                let rows = info.dims[1] as usize;
                let scale = host_f32(g, src, &format!("{}.scale", info.name), &[rows])?;
                let zero = host_f32(g, src, &format!("{}.zero", info.name), &[rows])?;
                let weight = be.load_int8_weight(info, &scale, &zero, src)?;
                done += info.n_bytes;
                progress(done, total);
                Some(weight)
            }
            Some(info) => {
                let weight = be.load_weight_async(info, src, w.head).await?;
                done += info.n_bytes;
                progress(done, total);
                Some(weight)
            }
            None => None,
        };
    }
    let out: Vec<_> = wanted.iter().map(|w| w.name.clone()).zip(loaded).collect();
    Ok(Weights(out.into_iter()))
}

/// An F32 tensor of `dims` (ggml order) read on the host, every value finite.
pub fn host_f32(g: &Gguf, src: &dyn ByteSource, name: &str, dims: &[usize]) -> Result<Vec<f32>> {
    let info = g
        .tensor(name)
        .ok_or_else(|| Error::Config(format!("tensor {name} is missing")))?;
    let want: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
    if info.ty != GgmlType::F32 || info.dims != want {
        return Err(Error::Config(format!(
            "tensor {name} is {} {:?}, expected F32 {want:?}",
            info.ty, info.dims
        )));
    }
    let n: usize = dims.iter().product();
    let mut buf = vec![0u8; n * 4];
    src.read_at(info.offset, &mut buf)?;
    let v: Vec<f32> = buf
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    if v.iter().any(|x| !x.is_finite()) {
        return Err(Error::Config(format!(
            "tensor {name} holds a value that is not finite"
        )));
    }
    Ok(v)
}

/// A small F32 vector read on the host (Llama 3's `rope_freqs.weight`), if the file has it
/// with `len` values.
pub fn host_vector(
    g: &Gguf,
    src: &dyn ByteSource,
    name: &str,
    len: usize,
) -> Result<Option<Vec<f32>>> {
    if g.tensor(name).is_none() {
        return Ok(None);
    }
    let v = host_f32(g, src, name, &[len])?;
    if v.iter().any(|x| !x.is_finite() || *x <= 0.0) {
        return Err(Error::Config(format!(
            "tensor {name} holds a value that is not a positive number"
        )));
    }
    Ok(Some(v))
}
