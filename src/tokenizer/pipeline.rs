//! What every tokenizer kind shares: the `tokenizers` pipeline type and the one seam a kind
//! goes through ([`Pipe`]), a bit set over ids, the byte-level alphabet and the word-boundary
//! marker, and the error of the `tokenizers` crate.

use crate::error::{Error, Result};
use tokenizers::{
    DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper, TokenizerImpl,
};

/// A `tokenizers` pipeline (added tokens, normalizer, pre-tokenizer, post-processor,
/// decoder) around model `M`: our GGUF BPE, or a model a `tokenizer.json` names (WordPiece).
pub(super) type Impl<M> =
    TokenizerImpl<M, NormalizerWrapper, PreTokenizerWrapper, PostProcessorWrapper, DecoderWrapper>;

/// What [`Tokenizer`] asks of its pipeline, whatever the model inside: the one seam a further
/// tokenizer kind goes through.
pub(super) trait Pipe: Send {
    fn encode(&mut self, text: &str, add_special: bool, split_special: bool) -> Result<Vec<u32>>;
    fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String>;
    fn token_to_id(&self, token: &str) -> Option<u32>;
    fn id_to_token(&self, id: u32) -> Option<String>;
}

impl<M: tokenizers::Model + Send> Pipe for Impl<M> {
    fn encode(&mut self, text: &str, add_special: bool, split_special: bool) -> Result<Vec<u32>> {
        self.set_encode_special_tokens(split_special);
        Ok(self
            .encode_fast(text, add_special)
            .map_err(tk_err)?
            .get_ids()
            .to_vec())
    }
    fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        TokenizerImpl::decode(self, ids, skip_special).map_err(tk_err)
    }
    fn token_to_id(&self, token: &str) -> Option<u32> {
        TokenizerImpl::token_to_id(self, token)
    }
    fn id_to_token(&self, id: u32) -> Option<String> {
        TokenizerImpl::id_to_token(self, id)
    }
}

/// GPT-2's reversible map of bytes to printable characters (the byte-level alphabet).
pub fn byte_chars() -> Vec<char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut extra = 256;
    (0u32..256)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap_or('?')
            } else {
                let c = char::from_u32(extra).unwrap_or('?');
                extra += 1;
                c
            }
        })
        .collect()
}

/// The word-boundary marker of SentencePiece vocabularies.
pub(super) const SPACE: &str = "\u{2581}";

pub(super) fn tk_err(e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(e.to_string())
}

/// One bit a token id (a `Vec<bool>` would take a byte: 448 KiB more for two such sets over
/// Gemma 3's 262 144 tokens, kept for the engine's life).
#[derive(Clone)]
pub(super) struct Bits(Vec<u64>);

impl Bits {
    pub(super) fn from_fn(n: usize, f: impl Fn(usize) -> bool) -> Self {
        let mut words = vec![0u64; n.div_ceil(64)];
        for i in (0..n).filter(|&i| f(i)) {
            words[i / 64] |= 1 << (i % 64);
        }
        Self(words)
    }

    /// Whether bit `i` is set (false past the end).
    pub(super) fn get(&self, i: usize) -> bool {
        self.0.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::Bits;

    /// Each id's bit, across word boundaries, and false past the end.
    #[test]
    fn bits_hold_each_id() {
        for n in [0usize, 1, 63, 64, 65, 200] {
            let set = |i: usize| i.is_multiple_of(3) || i == 63 || i == 64;
            let b = Bits::from_fn(n, set);
            for i in 0..n + 70 {
                assert_eq!(b.get(i), i < n && set(i), "n {n}, id {i}");
            }
        }
    }
}
