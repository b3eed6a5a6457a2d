//! The shapes every instruction set's dense kernels share: a float panel and its result
//! tile, an int8 panel and its exact result tile.

/// Output rows per panel.
pub const PANEL: usize = 8;
/// A kernel's result: up to 8 rows of one panel's 8 columns.
pub type Tile = [[f32; PANEL]; 8];
/// Weight rows per int8 panel.
pub const I8_PANEL: usize = 4;
/// An int8 kernel's result: up to 4 activation rows × one panel's 4 weight rows, exact.
pub type TileI8 = [[i64; I8_PANEL]; 4];
