//! How a matrix holds 4- and 5-bit codes packed ([`Packing`]): the layout the load makes,
//! the kernels read, and this build's row unpacking ([`super::dispatch`]) takes apart.

use super::portable;

/// How values are packed ([`Values::Packed`](super::layout::Values::Packed)).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Packing {
    /// 16 bytes of nibbles per 32 values (byte l: value l low, value l + 16 high), as Q4_0
    /// and Q4_1 have them in the file; a value is its code less `bias`.
    Nibbles { bias: i8 },
    /// Q5_0's values (−16..=15) as codes (value + 16) three to a 16-bit lane, 64 bytes per 96
    /// values ([`portable::pack_fives`]): 0.67 bytes a value against int8's 1, where the
    /// file's bit planes (0.625) would cost a decode step more work than the bytes save. A
    /// kernel takes each field with one mask or shift where int8 takes one widening, and
    /// subtracts 16 · Σx per block once. Only in wasm, whose memory is the tab's (natively
    /// Q5_0 stays int8).
    Fives,
}

impl Packing {
    /// Bytes of a row of `cols` values (a multiple of 32).
    pub(super) const fn row_bytes(self, cols: usize) -> usize {
        match self {
            Packing::Nibbles { .. } => cols / 2,
            Packing::Fives => portable::fives_row_bytes(cols),
        }
    }
}
