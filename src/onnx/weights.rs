//! What reading an ONNX file gives: the encoder's weights by their GGUF names ([`Found`]),
//! each in f32 or as the int8 rows a `MatMulInteger` stores ([`Weight`], [`Int8Rows`]), and
//! the sizes `config.json` gives that the graph must agree with ([`Sizes`]).

use std::collections::BTreeMap;

/// What `config.json` says the encoder's sizes are: the graph must agree.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_layer: usize,
    pub n_vocab: usize,
    pub n_pos: usize,
    pub n_types: usize,
}

/// How the file stores its matrices (the default type of the converted weights).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    F32,
    F16,
    /// Quantized (int8/uint8 with scales), dequantized exactly to f32.
    Int8,
}

/// The activation between a classification head's pooler and its classifier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadActivation {
    Tanh,
    Relu,
}

/// One weight: its shape as Hugging Face and GGUF rows see it (`(out, in)` for a matrix,
/// `(n)` for a vector) and its values.
#[derive(Clone, Debug)]
pub struct Weight {
    pub shape: Vec<usize>,
    /// Empty when `int8` holds the matrix.
    pub values: Vec<f32>,
    /// An int8 matrix as the file stores it (a `MatMulInteger`'s weight).
    pub int8: Option<Int8Rows>,
}

impl Weight {
    pub(super) fn float(shape: Vec<usize>, values: Vec<f32>) -> Self {
        Self {
            shape,
            values,
            int8: None,
        }
    }

    /// The values in f32: the float ones, or the int8 ones dequantized.
    pub fn to_f32(&self) -> Vec<f32> {
        match &self.int8 {
            Some(q) if self.values.is_empty() => q.dequantize(),
            _ => self.values.clone(),
        }
    }
}

/// An `(out, in)` int8 matrix whose weight `(r, c)` is `(values[r·in + c] − zero[r]) ·
/// scale[r]`: `DequantizeLinear`'s `(q − zero_point) · scale` with `q` and the zero point both
/// less 128 for uint8, so the values fit in i8 and the differences (small integers, exact in
/// f32) are unchanged: dequantized, it is onnxruntime's f32 bit for bit.
#[derive(Clone, Debug)]
pub struct Int8Rows {
    pub values: Vec<i8>,
    pub scale: Vec<f32>,
    pub zero: Vec<f32>,
}

impl Int8Rows {
    pub fn dequantize(&self) -> Vec<f32> {
        crate::quant::dequantize_int8_rows(&self.values, &self.scale, &self.zero)
    }
}

/// An encoder's weights, by their GGUF names (`token_embd.weight`, `blk.0.attn_q.weight`,
/// `cls.weight`, `cls.output.weight`, …).
#[derive(Debug)]
pub struct Found {
    pub tensors: BTreeMap<String, Weight>,
    /// The LayerNorms' ε as the graph has it.
    pub eps: Option<f32>,
    /// `Some` when the graph ends in a classification head with a pooler.
    pub head: Option<HeadActivation>,
    pub stored: Stored,
    /// The exporter (`producer_name`), for messages.
    pub producer: String,
}
