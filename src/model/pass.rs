//! What every family's forward pass shares: the KV cache and the ids it holds, where a
//! pass's rows go and their positions, and products of one input grouped into one call.

use crate::backend::{AttnParams, Backend};
use crate::config::ModelConfig;
use crate::error::{Error, Result};

/// The KV caches of all layers, and the ids whose keys and values they hold, in order: how
/// many positions they hold is derived from these, never kept apart.
pub struct Cache<B: Backend> {
    pub layers: Vec<B::Kv>,
    ids: Vec<u32>,
}

impl<B: Backend> Cache<B> {
    /// An empty cache over these layers' caches.
    pub fn new(layers: Vec<B::Kv>) -> Self {
        Self {
            layers,
            ids: Vec::new(),
        }
    }

    /// Positions held.
    pub fn n_past(&self) -> usize {
        self.ids.len()
    }

    /// The ids held, in order.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Forget every position (each layer's cache cleared on `be`).
    pub fn clear(&mut self, be: &mut B) {
        for kv in &mut self.layers {
            be.clear_kv(kv);
        }
        self.ids.clear();
    }

    /// Keep the first `n` positions: the attention ignores the slots at or after them, and
    /// the next rows overwrite them. Only while no sliding-window ring has wrapped past them
    /// (the caller checks: see `Session::cached_common`).
    pub fn truncate(&mut self, n: usize) {
        self.ids.truncate(n);
    }

    /// The cache now holds `ids` (its layers were just loaded with their keys and values).
    pub fn set_restored(&mut self, ids: Vec<u32>) {
        self.ids = ids;
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
    ids: &'a [u32],
    branches: Option<&'a [usize]>,
}

impl<'a> Span<'a> {
    /// The span of rows `ids` placed by `rows` after what `cache` holds, or the typed error
    /// when they pass the context.
    pub fn new<B: Backend>(
        cfg: &ModelConfig,
        cache: &Cache<B>,
        ids: &'a [u32],
        rows: Rows<'a>,
    ) -> Result<Self> {
        let (first, n) = (cache.n_past(), ids.len());
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
            ids,
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

    /// After the pass: the cache holds the rows that entered it (branches enter nothing).
    pub fn done<B: Backend>(&self, cache: &mut Cache<B>) {
        if self.branches.is_none() {
            cache.ids.extend_from_slice(self.ids);
        }
    }
}
