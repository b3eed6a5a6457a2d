//! BERT-family ONNX exports (the `model.onnx`, `model_fp16.onnx` and int8
//! `model_quantized.onnx` files transformers.js and onnxruntime users have) mapped onto the
//! one encoder of `model/bert.rs`: the graph is read for its weights, never run.
//!
//! The mapping follows the graph's structure, not its tensor names (exporters rename the
//! matrices `onnx::MatMul_1234`):
//! - a **linear** is a `MatMul` (or `Gemm`, or a dynamically quantized `MatMulInteger` with
//!   its scale) whose second input is a constant, and the `Add` of a constant bias after it;
//! - a **LayerNorm** is a `LayerNormalization` node or the decomposition opset < 17 exports
//!   write (`ReduceMean → Sub → Pow → ReduceMean → Add ε → Sqrt → Div → Mul γ → Add β`);
//! - **attention**: the `MatMul` of two computed values whose inputs trace back (through
//!   reshapes, transposes and scalings) to two linears is `Q·Kᵀ`; the one whose first input
//!   traces to a `Softmax` takes V from the linear its second input traces to;
//! - the **embedding tables** are the constant inputs of `Gather`s, told apart by their row
//!   counts (`config.json`'s vocabulary, positions and token types);
//! - constants are initializers, `Constant` nodes, and `Cast`, `Identity`, `Transpose` or
//!   `DequantizeLinear` of constants: an int8 weight is dequantized exactly as onnxruntime
//!   does, `(q − zero_point) · scale` in f32.
//!
//! The linears are then taken six per layer in graph order (Q, K and V by their roles, then
//! the attention output, up and down, checked by shape), the LayerNorms two per layer after
//! the embeddings' one; linears after the last layer are a sequence-classification head
//! (pooler → tanh → classifier, or a classifier alone). Anything else is a typed error that
//! says what the graph holds.
//!
//! The files: `proto.rs` decodes the protobuf; `view.rs` indexes the graph and computes its
//! constants; `patterns.rs` finds linears, LayerNorms and attention roles; `map.rs` takes
//! them onto BERT's layers ([`read_bert`]); `weights.rs` holds what that gives.

mod map;
mod patterns;
pub mod proto;
mod view;
mod weights;

pub use map::read_bert;
pub use weights::{Found, HeadActivation, Int8Rows, Sizes, Stored, Weight};
