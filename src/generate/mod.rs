//! Generation: the one loop over a [`Session`] (or an [`crate::Engine`], which moves to the
//! CPU when the GPU fails between turns). [`Steps::begin`] sets a generation up and
//! [`Steps::next`] runs it a turn at a time: a chunk of the prompt, then a token, until it
//! ends. The CLI ([`generate`]), the server's slots and the browser's worker all drive this
//! loop; only what they do with its [`Event`]s differs.
//!
//! - `options.rs`: what a generation is asked for and what it reports;
//! - `generation.rs`: one generation's state between turns;
//! - `step.rs`: the loop's turns on a session (prefill, sampling, decoding, choices);
//! - `stop.rs`: stop strings held back across pieces.

mod generation;
mod options;
mod step;
mod stop;

pub use generation::Generation;
pub use options::{Chunk, Event, FinishReason, GenerateOptions, Usage};

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::session::Session;

/// What runs the generation loop: a [`Session`], or an [`crate::Engine`]. [`start`] and
/// [`generate`] are written once, for both.
#[allow(async_fn_in_trait)]
pub trait Steps {
    /// See [`Session::begin`].
    fn begin(&mut self, prompt_ids: Vec<u32>, opts: &GenerateOptions) -> Result<Generation>;
    /// See [`Session::next`].
    async fn next(&mut self, g: &mut Generation, abort: &dyn Fn() -> bool)
        -> Result<Option<Event>>;
}

impl<B: Backend> Steps for Session<B> {
    fn begin(&mut self, prompt_ids: Vec<u32>, opts: &GenerateOptions) -> Result<Generation> {
        Session::begin(self, prompt_ids, opts)
    }
    async fn next(
        &mut self,
        g: &mut Generation,
        abort: &dyn Fn() -> bool,
    ) -> Result<Option<Event>> {
        Session::next(self, g, abort).await
    }
}

/// Begin, and run the loop until the prompt is in the cache and the first token sampled.
pub async fn start(
    s: &mut impl Steps,
    prompt_ids: Vec<u32>,
    opts: &GenerateOptions,
    abort: &dyn Fn() -> bool,
) -> Result<Generation> {
    let mut g = s.begin(prompt_ids, opts)?;
    while g.is_prefilling() {
        if s.next(&mut g, abort).await?.is_none() {
            return Err(Error::Backend(
                "the loop ended before the prompt was in".into(),
            ));
        }
    }
    Ok(g)
}

/// Begin, then run the loop to its end, calling `on_chunk` for every piece.
pub async fn generate(
    s: &mut impl Steps,
    prompt_ids: Vec<u32>,
    opts: &GenerateOptions,
    abort: &dyn Fn() -> bool,
    on_chunk: &mut dyn FnMut(&Chunk),
) -> Result<Generation> {
    let mut g = s.begin(prompt_ids, opts)?;
    while let Some(event) = s.next(&mut g, abort).await? {
        if let Event::Chunk(c) = event {
            on_chunk(&c);
        }
    }
    Ok(g)
}
