//! Streaming decode: each piece ends on a character boundary.

use super::encoding::Tokenizer;
use super::pipeline::SPACE;
use crate::error::Result;

/// Streams text: each piece ends on a character boundary, so a multi-byte character spread
/// over byte-fallback tokens comes out whole.
#[derive(Clone, Debug, Default)]
pub struct StreamDecoder {
    /// Ids not yet emitted: only a run of byte tokens that does not yet form a whole character.
    pending: Vec<u32>,
    /// Something was emitted already (a dummy-prefix vocabulary strips only the first space).
    emitted: bool,
}

/// A UTF-8 character has at most 4 bytes: a longer pending run is not going to complete.
const MAX_PENDING_BYTES: usize = 4;

impl StreamDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feed one id; get the text it completes (possibly empty).
    pub fn step(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        self.pending.push(id);
        let text = tok.decode(&self.pending, false)?;
        let is_byte = tok.byte_level || tok.byte_tokens.get(id as usize);
        if is_byte && text.ends_with('\u{FFFD}') && self.pending.len() < MAX_PENDING_BYTES {
            return Ok(String::new());
        }
        // Both decoders (▁ → space, byte fallback, fuse; byte-level) are concatenative across
        // pieces that end on a character boundary, so the pending ids can be forgotten here;
        // but for the first leading space, which a dummy-prefix vocabulary strips.
        let text = match self.pending.first() {
            Some(&first)
                if tok.space_prefix
                    && self.emitted
                    && tok
                        .token(first)
                        .is_some_and(|p| p.starts_with(SPACE) || p == "<0x20>") =>
            {
                format!(" {text}")
            }
            _ => text,
        };
        self.emitted |= !text.is_empty();
        self.pending.clear();
        Ok(text)
    }

    /// Whatever is still pending, with U+FFFD for an incomplete character.
    pub fn flush(&mut self, tok: &Tokenizer) -> Result<String> {
        let text = tok.decode(&self.pending, false)?;
        self.pending.clear();
        Ok(text)
    }
}
