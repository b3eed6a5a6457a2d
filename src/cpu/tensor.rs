//! The CPU backend's activations and weights.

use super::dense;
use super::int8;

/// Activations: `n_tok` rows of `width` f32.
#[derive(Clone, Debug, PartialEq)]
pub struct Act {
    pub data: Vec<f32>,
    pub width: usize,
}

impl Act {
    pub fn n_tok(&self) -> usize {
        self.data.len().checked_div(self.width).unwrap_or(0)
    }
}

/// A weight on the CPU.
pub enum CpuWeight {
    /// A vector (norm weights), f32.
    Vector(Vec<f32>),
    /// A float matrix (F32, F16, BF16 in the file), held as f32 panels.
    Dense(dense::DenseMatrix),
    /// An int8 matrix with a scale and zero per row (an int8 ONNX export's), kept int8.
    DenseI8(dense::I8Matrix),
    /// A quantized matrix unpacked to int8 for our kernel.
    Int8(int8::QMatrix),
    /// Natively, unless the exact path is asked for: a quantized matrix as the file's blocks,
    /// multiplied on 8-bit activations.
    #[cfg(not(target_arch = "wasm32"))]
    Blocks(super::q8::BlockMatrix),
}
