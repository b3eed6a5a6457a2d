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

pub mod proto;

use crate::error::{Error, Result};
use proto::{bad, Graph, Node, Tensor};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

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
    fn float(shape: Vec<usize>, values: Vec<f32>) -> Self {
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

/// A constant value the graph computes from initializers alone.
struct Const {
    dims: Vec<usize>,
    v: Vec<f32>,
    /// Stored as 8- or 16-bit integers before any dequantization.
    int: bool,
    f16: bool,
}

/// A linear layer found in the graph.
struct Lin {
    /// The index of its MatMul (graph order).
    at: usize,
    /// `(in, out)`, the layout of `MatMul(x, W)`.
    w: Rc<Const>,
    bias: Option<Rc<Const>>,
    /// Its output (after the bias when there is one) and the MatMul's own output.
    outs: Vec<String>,
    quantized: bool,
    /// A `MatMulInteger`'s weight as stored: `(q (in, out), scale, zero point)` per output
    /// (then `w` holds only the dims).
    int8: Option<(Rc<Const>, Vec<f32>, Vec<f32>)>,
}

struct Ln {
    at: usize,
    gamma: Rc<Const>,
    beta: Option<Rc<Const>>,
    eps: f32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Q,
    K,
    V,
}

/// Ops a traced value passes through on its way from a linear to attention.
const PASS: &[&str] = &[
    "Reshape",
    "Transpose",
    "Div",
    "Mul",
    "Unsqueeze",
    "Squeeze",
    "Identity",
    "Cast",
    "Dropout",
    "Add",
];

/// The most steps a constant or a traced value is followed (a cycle in a hostile graph
/// ends here).
const MAX_DEPTH: usize = 64;

struct View<'m, 'a> {
    g: &'m Graph<'a>,
    /// Bytes of values computed so far, and the most a graph of this file's size may
    /// compute (a hostile graph that transposes one big constant many times stops here).
    spent: std::cell::Cell<usize>,
    limit: usize,
    producer: HashMap<&'a str, usize>,
    consumers: HashMap<&'a str, Vec<usize>>,
    inits: HashMap<&'a str, &'m Tensor<'a>>,
    consts: RefCell<HashMap<String, Option<Rc<Const>>>>,
}

fn attr_i(n: &Node, name: &str) -> Option<i64> {
    n.attrs.iter().find(|a| a.name == name).and_then(|a| a.i)
}

fn attr_f(n: &Node, name: &str) -> Option<f32> {
    n.attrs.iter().find(|a| a.name == name).and_then(|a| a.f)
}

fn attr_s<'n>(n: &'n Node, name: &str) -> Option<&'n [u8]> {
    n.attrs.iter().find(|a| a.name == name).and_then(|a| a.s)
}

fn attr_ints<'n>(n: &'n Node, name: &str) -> Option<&'n [i64]> {
    n.attrs
        .iter()
        .find(|a| a.name == name)
        .map(|a| a.ints.as_slice())
}

fn tensor_const(t: &Tensor, v: &View) -> Result<Const> {
    v.charge(t.count()?)?;
    let dims = t
        .dims
        .iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| bad(format!("tensor {}: dims {:?}", t.name, t.dims)))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Const {
        v: t.to_f32()?,
        dims,
        int: matches!(
            t.dtype,
            proto::dtype::INT8 | proto::dtype::UINT8 | proto::dtype::INT16 | proto::dtype::UINT16
        ),
        f16: t.dtype == proto::dtype::FLOAT16 || t.dtype == proto::dtype::BFLOAT16,
    })
}

impl<'m, 'a> View<'m, 'a> {
    /// Count `n` more f32 values against the limit.
    fn charge(&self, n: usize) -> Result<()> {
        let spent = n
            .checked_mul(4)
            .and_then(|b| b.checked_add(self.spent.get()))
            .filter(|&s| s <= self.limit)
            .ok_or_else(|| {
                bad(format!(
                    "the graph's constants come to more than {} MB of values (a file of this size has far less)",
                    self.limit >> 20
                ))
            })?;
        self.spent.set(spent);
        Ok(())
    }

    fn new(g: &'m Graph<'a>, file_len: usize) -> Self {
        let mut producer = HashMap::new();
        let mut consumers: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, n) in g.nodes.iter().enumerate() {
            for o in &n.outputs {
                producer.insert(*o, i);
            }
            for x in &n.inputs {
                if !x.is_empty() {
                    consumers.entry(*x).or_default().push(i);
                }
            }
        }
        let inits = g.initializers.iter().map(|t| (t.name, t)).collect();
        Self {
            g,
            // int8 weights grow 4× as f32, and each is copied once more into the output.
            spent: std::cell::Cell::new(0),
            limit: file_len.saturating_mul(10).saturating_add(64 << 20),
            producer,
            consumers,
            inits,
            consts: RefCell::new(HashMap::new()),
        }
    }

    fn node_of(&self, name: &str) -> Option<&'m Node<'a>> {
        self.producer.get(name).map(|&i| &self.g.nodes[i])
    }

    fn users(&self, name: &str) -> impl Iterator<Item = (usize, &'m Node<'a>)> + '_ {
        self.consumers
            .get(name)
            .into_iter()
            .flatten()
            .map(|&i| (i, &self.g.nodes[i]))
    }

    /// The value of `name` when it is computed from constants alone.
    fn constant(&self, name: &str) -> Result<Option<Rc<Const>>> {
        self.constant_at(name, 0)
    }

    fn constant_at(&self, name: &str, depth: usize) -> Result<Option<Rc<Const>>> {
        if name.is_empty() {
            return Ok(None);
        }
        if let Some(c) = self.consts.borrow().get(name) {
            return Ok(c.clone());
        }
        if depth > MAX_DEPTH {
            return Err(bad(format!(
                "constants nested more than {MAX_DEPTH} deep at {name} (a cycle?)"
            )));
        }
        let c = self.compute(name, depth)?;
        self.consts.borrow_mut().insert(name.to_string(), c.clone());
        Ok(c)
    }

    fn compute(&self, name: &str, depth: usize) -> Result<Option<Rc<Const>>> {
        if let Some(t) = self.inits.get(name) {
            return tensor_const(t, self).map(|c| Some(Rc::new(c)));
        }
        let Some(n) = self.node_of(name) else {
            return Ok(None);
        };
        let input = |i: usize| -> Result<Option<Rc<Const>>> {
            match n.inputs.get(i) {
                Some(x) => self.constant_at(x, depth + 1),
                None => Ok(None),
            }
        };
        let copy = |c: &Const| -> Result<Const> {
            self.charge(c.v.len())?;
            Ok(Const {
                dims: c.dims.clone(),
                v: c.v.clone(),
                int: c.int,
                f16: c.f16,
            })
        };
        // Identity and a Cast to float share the value (no copy).
        if n.op == "Identity"
            || (n.op == "Cast" && attr_i(n, "to") == Some(proto::dtype::FLOAT as i64))
        {
            return match input(0)? {
                Some(c) if n.op == "Identity" || !c.int => Ok(Some(c)),
                // A cast to float keeps the values (int8 → f32 is exact), no longer narrow.
                Some(c) => copy(&c).map(|mut c| {
                    c.int = false;
                    Some(Rc::new(c))
                }),
                None => Ok(None),
            };
        }
        Ok(match n.op {
            "Constant" => match n.attrs.iter().find(|a| a.name == "value") {
                Some(a) => match &a.t {
                    Some(t) => Some(tensor_const(t, self)?),
                    None => None,
                },
                None => {
                    if let Some(f) = attr_f(n, "value_float") {
                        Some(Const {
                            dims: vec![],
                            v: vec![f],
                            int: false,
                            f16: false,
                        })
                    } else {
                        attr_i(n, "value_int").map(|i| Const {
                            dims: vec![],
                            v: vec![i as f32],
                            int: false,
                            f16: false,
                        })
                    }
                }
            },
            "Transpose" => match input(0)? {
                Some(c) if c.dims.len() == 2 => {
                    let perm = attr_ints(n, "perm").unwrap_or(&[1, 0]);
                    if perm == [0, 1] {
                        return Ok(Some(c));
                    }
                    self.charge(c.v.len())?;
                    Some(Const {
                        dims: vec![c.dims[1], c.dims[0]],
                        v: transpose(&c.v, c.dims[0], c.dims[1]),
                        int: c.int,
                        f16: c.f16,
                    })
                }
                _ => None,
            },
            "DequantizeLinear" => {
                let (Some(x), Some(s)) = (input(0)?, input(1)?) else {
                    return Ok(None);
                };
                let zp = input(2)?;
                self.charge(x.v.len())?;
                Some(Const {
                    v: dequantize(&x, &s, zp.as_deref(), attr_i(n, "axis").unwrap_or(1), name)?,
                    dims: x.dims.clone(),
                    int: true,
                    f16: false,
                })
            }
            _ => None,
        }
        .map(Rc::new))
    }

    /// The linear whose MatMul is node `i`, if it is one.
    fn linear(&self, i: usize, n: &Node) -> Result<Option<Lin>> {
        let two_d = |c: &Option<Rc<Const>>| c.as_ref().is_some_and(|c| c.dims.len() == 2);
        let mut int8 = None;
        let (w, mut out, quantized) = match n.op {
            "MatMul" => {
                let w = self.constant(n.inputs.get(1).copied().unwrap_or(""))?;
                let a = self.constant(n.inputs.first().copied().unwrap_or(""))?;
                if !two_d(&w) || a.is_some() {
                    return Ok(None);
                }
                let q = w.as_ref().is_some_and(|w| w.int);
                (w, n.outputs[0].to_string(), q)
            }
            "Gemm" => {
                let w = self.constant(n.inputs.get(1).copied().unwrap_or(""))?;
                if !two_d(&w) {
                    return Ok(None);
                }
                if attr_i(n, "transA").unwrap_or(0) != 0
                    || attr_f(n, "alpha").unwrap_or(1.0) != 1.0
                    || attr_f(n, "beta").unwrap_or(1.0) != 1.0
                {
                    return Err(bad(format!(
                        "Gemm {} with transA, alpha or beta: not a linear layer kerze maps",
                        n.name
                    )));
                }
                let mut w = w.ok_or_else(|| bad("Gemm without weight"))?;
                if attr_i(n, "transB").unwrap_or(0) != 0 {
                    self.charge(w.v.len())?;
                    w = Rc::new(Const {
                        dims: vec![w.dims[1], w.dims[0]],
                        v: transpose(&w.v, w.dims[0], w.dims[1]),
                        int: w.int,
                        f16: w.f16,
                    });
                }
                let bias = self.constant(n.inputs.get(2).copied().unwrap_or(""))?;
                let quantized = w.int;
                return Ok(Some(Lin {
                    at: i,
                    bias: check_bias(bias, w.dims[1], n.name)?,
                    w,
                    outs: vec![n.outputs[0].to_string()],
                    quantized,
                    int8: None,
                }));
            }
            "MatMulInteger" => {
                // onnxruntime's dynamic quantization: DynamicQuantizeLinear(x) → MatMulInteger
                // (x_q, W_q, x_zp, W_zp) → Cast → Mul(·, x_scale · W_scale).
                let wq = self.constant(n.inputs.get(1).copied().unwrap_or(""))?;
                if !two_d(&wq) {
                    return Ok(None);
                }
                let wq = wq.ok_or_else(|| bad("MatMulInteger without weight"))?;
                let zp = self.constant(n.inputs.get(3).copied().unwrap_or(""))?;
                let scale = self.integer_scale(n)?;
                let Some((scale, out)) = scale else {
                    return Err(bad(format!(
                        "MatMulInteger {}: no Cast → Mul by the weight's scale after it (not onnxruntime's dynamic quantization)",
                        n.name
                    )));
                };
                let per_out = |c: &Const, what: &str| match c.v.len() {
                    1 => Ok(vec![c.v[0]; wq.dims[1]]),
                    n if n == wq.dims[1] => Ok(c.v.clone()),
                    len => Err(bad(format!(
                        "{}: {len} {what} for a weight of {:?} (one, or one per output)",
                        n.name, wq.dims
                    ))),
                };
                let scales = per_out(&scale, "scales")?;
                let zeros = match &zp {
                    Some(z) => per_out(z, "zero points")?,
                    None => vec![0.0; wq.dims[1]],
                };
                // The matrix stays int8; `w` carries its dims (and its kind) only.
                let w = Const {
                    dims: wq.dims.clone(),
                    v: Vec::new(),
                    int: true,
                    f16: false,
                };
                int8 = Some((wq, scales, zeros));
                (Some(Rc::new(w)), out, true)
            }
            _ => return Ok(None),
        };
        let w = w.ok_or_else(|| bad("linear without weight"))?;
        let mut outs = vec![out.clone()];
        // The bias: an Add of a constant vector of `out` values, the only user.
        let mut bias = None;
        let users: Vec<_> = self.users(&out).collect();
        if let [(_, add)] = users[..] {
            if add.op == "Add" && add.inputs.len() == 2 {
                let other = if add.inputs[0] == out {
                    add.inputs[1]
                } else {
                    add.inputs[0]
                };
                if let Some(b) = self.constant(other)? {
                    bias = check_bias(Some(b), w.dims[1], add.name)?;
                    out = add.outputs[0].to_string();
                    outs.push(out.clone());
                }
            }
        }
        Ok(Some(Lin {
            at: i,
            w,
            bias,
            outs,
            quantized,
            int8,
        }))
    }

    /// The weight scale of a MatMulInteger: the constant factor of the `Mul` its (cast)
    /// output goes into, and that Mul's output.
    fn integer_scale(&self, n: &Node) -> Result<Option<(Rc<Const>, String)>> {
        for (_, cast) in self.users(n.outputs[0]) {
            if cast.op != "Cast" {
                continue;
            }
            for (_, mul) in self.users(cast.outputs[0]) {
                if mul.op != "Mul" || mul.inputs.len() != 2 {
                    continue;
                }
                let other = if mul.inputs[0] == cast.outputs[0] {
                    mul.inputs[1]
                } else {
                    mul.inputs[0]
                };
                // other = Mul(x_scale, W_scale): the constant one is the weight's.
                if let Some(p) = self.node_of(other) {
                    if p.op == "Mul" && p.inputs.len() == 2 {
                        for x in &p.inputs {
                            if let Some(s) = self.constant(x)? {
                                return Ok(Some((s, mul.outputs[0].to_string())));
                            }
                        }
                    }
                }
                if let Some(s) = self.constant(other)? {
                    return Ok(Some((s, mul.outputs[0].to_string())));
                }
            }
        }
        Ok(None)
    }

    /// The LayerNorm ending at node `i`, if one does.
    fn layer_norm(&self, i: usize, n: &Node) -> Result<Option<Ln>> {
        if n.op == "LayerNormalization" {
            let axis = attr_i(n, "axis").unwrap_or(-1);
            if axis != -1 && axis != 2 {
                return Err(bad(format!(
                    "LayerNormalization {} over axis {axis}: not a BERT LayerNorm",
                    n.name
                )));
            }
            let gamma = self
                .constant(n.inputs.get(1).copied().unwrap_or(""))?
                .ok_or_else(|| {
                    bad(format!(
                        "LayerNormalization {} without a constant scale",
                        n.name
                    ))
                })?;
            let beta = self.constant(n.inputs.get(2).copied().unwrap_or(""))?;
            return Ok(Some(Ln {
                at: i,
                gamma,
                beta,
                eps: attr_f(n, "epsilon").unwrap_or(1e-5),
            }));
        }
        // The decomposition ends in Add(Mul(Div(x − mean, Sqrt(var + ε)), γ), β).
        if n.op != "Add" || n.inputs.len() != 2 {
            return Ok(None);
        }
        for (mul_in, beta_in) in [(n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])] {
            let Some(mul) = self
                .node_of(mul_in)
                .filter(|m| m.op == "Mul" && m.inputs.len() == 2)
            else {
                continue;
            };
            for (div_in, gamma_in) in [
                (mul.inputs[0], mul.inputs[1]),
                (mul.inputs[1], mul.inputs[0]),
            ] {
                let Some(div) = self
                    .node_of(div_in)
                    .filter(|d| d.op == "Div" && d.inputs.len() == 2)
                else {
                    continue;
                };
                let Some(sqrt) = self.node_of(div.inputs[1]).filter(|s| s.op == "Sqrt") else {
                    continue;
                };
                let Some(add) = sqrt
                    .inputs
                    .first()
                    .and_then(|x| self.node_of(x))
                    .filter(|a| a.op == "Add" && a.inputs.len() == 2)
                else {
                    continue;
                };
                let mut eps = None;
                for x in &add.inputs {
                    if let Some(c) = self.constant(x)? {
                        eps = c.v.first().copied().filter(|_| c.v.len() == 1);
                    }
                }
                let mean = self.node_of(div.inputs[0]).is_some_and(|s| s.op == "Sub");
                let (Some(eps), Some(gamma), Some(beta), true) =
                    (eps, self.constant(gamma_in)?, self.constant(beta_in)?, mean)
                else {
                    continue;
                };
                return Ok(Some(Ln {
                    at: i,
                    gamma,
                    beta: Some(beta),
                    eps,
                }));
            }
        }
        Ok(None)
    }

    /// Where `name` comes from, followed back through reshapes, transposes and scalings: a
    /// linear (by output), a Softmax, or neither.
    fn trace(&self, name: &str, lin_of: &HashMap<String, usize>) -> Option<Result<usize, ()>> {
        let mut x = name.to_string();
        for _ in 0..MAX_DEPTH {
            if let Some(&l) = lin_of.get(&x) {
                return Some(Ok(l));
            }
            let n = self.node_of(&x)?;
            if n.op == "Softmax" {
                return Some(Err(()));
            }
            if !PASS.contains(&n.op) {
                return None;
            }
            // Follow the input that is computed (the other is a constant scale or shape).
            let next = n.inputs.iter().find(|i| {
                !i.is_empty()
                    && !self.inits.contains_key(*i)
                    && self.node_of(i).is_some_and(|p| {
                        p.op != "Constant" && p.op != "Shape" && p.op != "Concat" && p.op != "Sqrt"
                    })
            })?;
            x = next.to_string();
        }
        None
    }
}

fn check_bias(b: Option<Rc<Const>>, out: usize, at: &str) -> Result<Option<Rc<Const>>> {
    match b {
        Some(b) if b.v.len() == out => Ok(Some(b)),
        Some(b) => Err(bad(format!(
            "{at}: a bias of {} values after a linear of {out} outputs",
            b.v.len()
        ))),
        None => Ok(None),
    }
}

/// A row-major `rows × cols` matrix transposed.
fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; x.len()];
    for (i, row) in x.chunks_exact(cols).enumerate().take(rows) {
        for (j, &v) in row.iter().enumerate() {
            t[j * rows + i] = v;
        }
    }
    t
}

/// A `MatMulInteger`'s `(in, out)` weight `q` with a scale and zero point per output, as
/// `(out, in)` int8 rows: `q` and the zero points less 128 when `q` is uint8.
fn int8_rows(q: &Const, scale: &[f32], zero: &[f32], at: &str) -> Result<Weight> {
    let (k, o) = (q.dims[0], q.dims[1]);
    let (lo, hi) =
        q.v.iter()
            .fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let shift = if hi > 127.0 { 128.0 } else { 0.0 };
    if lo - shift < -128.0 || hi - shift > 127.0 || q.v.iter().any(|v| v.fract() != 0.0) {
        return Err(bad(format!(
            "{at}: an integer weight from {lo} to {hi}: not int8 or uint8"
        )));
    }
    let mut values = vec![0i8; k * o];
    for (i, row) in q.v.chunks_exact(o).enumerate() {
        for (j, &x) in row.iter().enumerate() {
            values[j * k + i] = (x - shift) as i8;
        }
    }
    Ok(Weight {
        shape: vec![o, k],
        values: Vec::new(),
        int8: Some(Int8Rows {
            values,
            scale: scale.to_vec(),
            zero: zero.iter().map(|z| z - shift).collect(),
        }),
    })
}

/// `(x − zero_point) · scale` in f32, per tensor or per slice along `axis`.
fn dequantize(x: &Const, s: &Const, zp: Option<&Const>, axis: i64, at: &str) -> Result<Vec<f32>> {
    let rank = x.dims.len() as i64;
    let axis = if axis < 0 { axis + rank } else { axis };
    if let Some(z) = zp {
        if z.v.len() != s.v.len() {
            return Err(bad(format!(
                "{at}: {} scales but {} zero points",
                s.v.len(),
                z.v.len()
            )));
        }
    }
    if s.v.len() == 1 {
        let (s, z) = (s.v[0], zp.map_or(0.0, |z| z.v[0]));
        return Ok(x.v.iter().map(|&q| (q - z) * s).collect());
    }
    let ax = usize::try_from(axis).ok().filter(|&a| a < x.dims.len());
    let Some(ax) = ax.filter(|&a| x.dims[a] == s.v.len()) else {
        return Err(bad(format!(
            "{at}: {} scales for a tensor of dims {:?} along axis {axis}",
            s.v.len(),
            x.dims
        )));
    };
    let inner: usize = x.dims[ax + 1..].iter().product();
    let n = x.dims[ax];
    Ok(x.v
        .iter()
        .enumerate()
        .map(|(i, &q)| {
            let c = (i / inner) % n;
            (q - zp.map_or(0.0, |z| z.v[c])) * s.v[c]
        })
        .collect())
}

/// What a graph's op types are, most frequent first, for an error message.
fn op_summary(g: &Graph) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for n in &g.nodes {
        *counts
            .entry(if n.op.is_empty() { "(no op)" } else { n.op })
            .or_default() += 1;
    }
    let mut v: Vec<_> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let shown: Vec<String> = v
        .iter()
        .take(12)
        .map(|(op, n)| format!("{op}×{n}"))
        .collect();
    let more = if v.len() > 12 {
        format!(" and {} more op types", v.len() - 12)
    } else {
        String::new()
    };
    format!("{} nodes: {}{more}", g.nodes.len(), shown.join(", "))
}

const SUPPORTED: &str = "ONNX exports of BERT-family encoders (BertModel, BertForSequenceClassification, DistilBERT; f32, f16 or int8) mapped onto its encoder";

fn unsupported(g: &Graph, why: String) -> Error {
    Error::UnsupportedArch {
        arch: format!("ONNX graph ({why}; {})", op_summary(g)),
        supported: SUPPORTED,
    }
}

/// The encoder weights of an ONNX file whose sizes `config.json` gives.
pub fn read_bert(bytes: &[u8], s: &Sizes) -> Result<Found> {
    let m = proto::parse(bytes)?;
    let g = &m.graph;
    if g.sparse_initializers > 0 {
        return Err(bad("sparse initializers are not supported"));
    }
    if let Some(n) = g
        .nodes
        .iter()
        .find(|n| !n.domain.is_empty() && n.domain != "ai.onnx")
    {
        return Err(unsupported(
            g,
            format!(
                "op {} of domain {} (a fused, runtime-specific graph: give the plain export, not an optimized one)",
                n.op, n.domain
            ),
        ));
    }
    let v = View::new(g, bytes.len());
    let (e, f) = (s.n_embd, s.n_ff);

    // Linears, LayerNorms and embedding tables, in graph order.
    let mut lins: Vec<Lin> = Vec::new();
    let mut lns: Vec<Ln> = Vec::new();
    let mut tables: Vec<(usize, Rc<Const>, String)> = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if let Some(l) = v.linear(i, n)? {
            lins.push(l);
        } else if let Some(l) = v.layer_norm(i, n)? {
            lns.push(l);
        } else if n.op == "Gather" && n.inputs.len() == 2 {
            if let Some(t) = v.constant(n.inputs[0])? {
                if t.dims.len() == 2 && t.dims[1] == e {
                    let t = if t.int {
                        // onnxruntime's quantized Gather: the rows, then DequantizeLinear.
                        let dq = v
                            .users(n.outputs[0])
                            .find(|(_, d)| d.op == "DequantizeLinear");
                        let Some((_, dq)) = dq else {
                            return Err(bad(format!(
                                "Gather {} of an integer table without DequantizeLinear",
                                n.name
                            )));
                        };
                        let sc = v.constant(dq.inputs.get(1).copied().unwrap_or(""))?;
                        let zp = v.constant(dq.inputs.get(2).copied().unwrap_or(""))?;
                        let sc = sc.ok_or_else(|| {
                            bad(format!(
                                "DequantizeLinear {} without a constant scale",
                                dq.name
                            ))
                        })?;
                        v.charge(t.v.len())?;
                        let vals = dequantize(
                            &t,
                            &sc,
                            zp.as_deref(),
                            attr_i(dq, "axis").unwrap_or(1),
                            dq.name,
                        )?;
                        Rc::new(Const {
                            dims: t.dims.clone(),
                            v: vals,
                            int: true,
                            f16: false,
                        })
                    } else {
                        t
                    };
                    tables.push((i, t, n.inputs[1].to_string()));
                }
            }
        }
    }
    if lins.is_empty() && lns.is_empty() {
        return Err(unsupported(g, "no linear layers or LayerNorms".into()));
    }

    // Attention roles.
    let mut lin_of: HashMap<String, usize> = HashMap::new();
    for (k, l) in lins.iter().enumerate() {
        for o in &l.outs {
            lin_of.insert(o.clone(), k);
        }
    }
    let mut roles: HashMap<usize, Role> = HashMap::new();
    let mut attentions = 0;
    for n in &g.nodes {
        if n.op != "MatMul" || n.inputs.len() != 2 || v.constant(n.inputs[1])?.is_some() {
            continue;
        }
        let (a, b) = (v.trace(n.inputs[0], &lin_of), v.trace(n.inputs[1], &lin_of));
        match (a, b) {
            (Some(Ok(q)), Some(Ok(k))) => {
                attentions += 1;
                roles.insert(q, Role::Q);
                roles.insert(k, Role::K);
            }
            (Some(Err(())), Some(Ok(val))) => {
                roles.insert(val, Role::V);
            }
            _ => {}
        }
    }
    if attentions != s.n_layer {
        return Err(unsupported(
            g,
            format!(
                "{attentions} attention blocks found, config.json says {} layers",
                s.n_layer
            ),
        ));
    }
    // Erf (the decomposition) or an opset-20 Gelu that is not the tanh approximation.
    let erf_gelu = |n: &&Node| {
        n.op == "Erf" || (n.op == "Gelu" && attr_s(n, "approximate").is_none_or(|a| a == b"none"))
    };
    let gelus = g.nodes.iter().filter(erf_gelu).count();
    if gelus < s.n_layer {
        return Err(unsupported(
            g,
            format!("{gelus} erf GELUs for {} layers", s.n_layer),
        ));
    }
    if lins.len() < 6 * s.n_layer || lns.len() != 2 * s.n_layer + 1 {
        return Err(unsupported(
            g,
            format!(
                "{} linear layers and {} LayerNorms; a {}-layer BERT has {} and {}",
                lins.len(),
                lns.len(),
                s.n_layer,
                6 * s.n_layer,
                2 * s.n_layer + 1
            ),
        ));
    }

    let stored = if lins.iter().any(|l| l.quantized) {
        Stored::Int8
    } else if lins.iter().all(|l| l.w.f16) {
        Stored::F16
    } else {
        Stored::F32
    };
    let eps = lns.first().map(|l| l.eps);
    // From here each value has one owner (the cache let go), so the tables move out and
    // each matrix is freed once transposed: the peak is the file, its values and one matrix.
    v.consts.borrow_mut().clear();
    let mut out: BTreeMap<String, Weight> = BTreeMap::new();
    let owned = |c: Rc<Const>| Rc::try_unwrap(c).map_or_else(|c| c.v.clone(), |c| c.v);
    let matrix = |c: &Const| -> Result<Weight> {
        // (in, out) → (out, in)
        v.charge(c.v.len())?;
        Ok(Weight::float(
            vec![c.dims[1], c.dims[0]],
            transpose(&c.v, c.dims[0], c.dims[1]),
        ))
    };
    let vector = |c: &Const| Weight::float(vec![c.v.len()], c.v.clone());
    let put_lin = |out: &mut BTreeMap<String, Weight>,
                   name: &str,
                   l: Lin,
                   k: usize,
                   o: usize|
     -> Result<()> {
        if l.w.dims != [k, o] {
            return Err(bad(format!(
                "{name}: a {}×{} matrix where {k}×{o} belongs",
                l.w.dims[0], l.w.dims[1]
            )));
        }
        let w = match &l.int8 {
            Some((q, scale, zero)) => int8_rows(q, scale, zero, name)?,
            None => matrix(&l.w)?,
        };
        out.insert(format!("{name}.weight"), w);
        let b = l
            .bias
            .as_ref()
            .map_or_else(|| Weight::float(vec![o], vec![0.0; o]), |b| vector(b));
        out.insert(format!("{name}.bias"), b);
        Ok(())
    };
    let put_ln = |out: &mut BTreeMap<String, Weight>, name: &str, l: &Ln| -> Result<()> {
        if l.gamma.v.len() != e || l.beta.as_ref().is_some_and(|b| b.v.len() != e) {
            return Err(bad(format!(
                "{name}: a LayerNorm of {} values where {e} belong",
                l.gamma.v.len()
            )));
        }
        out.insert(format!("{name}.weight"), vector(&l.gamma));
        out.insert(
            format!("{name}.bias"),
            l.beta
                .as_ref()
                .map_or_else(|| Weight::float(vec![e], vec![0.0; e]), |b| vector(b)),
        );
        Ok(())
    };

    put_ln(&mut out, "token_embd_norm", &lns[0])?;
    let n_lins = lins.len();
    let mut slots: Vec<Option<Lin>> = lins.into_iter().map(Some).collect();
    let mut take = |j: usize| {
        slots
            .get_mut(j)
            .and_then(Option::take)
            .ok_or_else(|| bad("a linear layer taken twice"))
    };
    for il in 0..s.n_layer {
        let mut qkv = [None; 3];
        let mut rest = Vec::new();
        for j in 6 * il..6 * il + 6 {
            match roles.get(&j) {
                Some(Role::Q) => qkv[0] = Some(j),
                Some(Role::K) => qkv[1] = Some(j),
                Some(Role::V) => qkv[2] = Some(j),
                None => rest.push(j),
            }
        }
        let (Some(q), Some(k), Some(val), &[o, up, down]) = (qkv[0], qkv[1], qkv[2], &rest[..])
        else {
            return Err(unsupported(
                g,
                format!("layer {il}'s six linear layers are not Q, K, V, output, up and down"),
            ));
        };
        let (n1, n2) = (&lns[1 + 2 * il], &lns[2 + 2 * il]);
        let b = |n: &str| format!("blk.{il}.{n}");
        let (o, up, down) = (take(o)?, take(up)?, take(down)?);
        // Each LayerNorm sits between its layer's linears: after the attention output,
        // before up; after down.
        if !(o.at < n1.at && n1.at < up.at && down.at < n2.at) {
            return Err(unsupported(g, format!("layer {il}'s LayerNorms are not post-LN (after attention and after the feed-forward)")));
        }
        put_lin(&mut out, &b("attn_q"), take(q)?, e, e)?;
        put_lin(&mut out, &b("attn_k"), take(k)?, e, e)?;
        put_lin(&mut out, &b("attn_v"), take(val)?, e, e)?;
        put_lin(&mut out, &b("attn_output"), o, e, e)?;
        put_lin(&mut out, &b("ffn_up"), up, e, f)?;
        put_lin(&mut out, &b("ffn_down"), down, f, e)?;
        put_ln(&mut out, &b("attn_output_norm"), n1)?;
        put_ln(&mut out, &b("layer_output_norm"), n2)?;
    }
    let head_lins: Vec<Lin> = (6 * s.n_layer..n_lins)
        .map(&mut take)
        .collect::<Result<_>>()?;
    let mut head_lins = head_lins.into_iter();
    let head = match (head_lins.next(), head_lins.next(), head_lins.len()) {
        (None, _, _) => None,
        (Some(cls), None, _) => {
            let n = cls.w.dims[1];
            put_lin(&mut out, "cls.output", cls, e, n)?;
            None
        }
        (Some(pool), Some(cls), 0) => {
            let act = pool.outs.last().and_then(|o| {
                v.users(o).find_map(|(_, n)| match n.op {
                    "Tanh" => Some(HeadActivation::Tanh),
                    "Relu" => Some(HeadActivation::Relu),
                    _ => None,
                })
            });
            let act = act.ok_or_else(|| {
                unsupported(
                    g,
                    "a head whose pooler is followed by neither Tanh nor Relu".into(),
                )
            })?;
            put_lin(&mut out, "cls", pool, e, e)?;
            let n = cls.w.dims[1];
            put_lin(&mut out, "cls.output", cls, e, n)?;
            Some(act)
        }
        (_, _, more) => {
            return Err(unsupported(
                g,
                format!(
                "{} linear layers after the last encoder layer (a head kerze maps has one or two)",
                more + 2
            ),
            ))
        }
    };

    // Embedding tables by their rows (the word table also by its indices: input_ids).
    let mut word = None;
    let mut pos = None;
    let mut types = None;
    let n_tables = tables.len();
    for (_, t, idx) in tables {
        let rows = t.dims[0];
        let from_ids = g.inputs.contains(&idx.as_str()) && idx.contains("input_ids");
        if (from_ids || rows == s.n_vocab) && word.is_none() {
            word = Some(t);
        } else if rows == s.n_pos && pos.is_none() {
            pos = Some(t);
        } else if rows == s.n_types && types.is_none() {
            types = Some(t);
        }
    }
    let (Some(word), Some(pos)) = (word, pos) else {
        return Err(unsupported(
            g,
            format!("{n_tables} embedding tables, no word or position table among them"),
        ));
    };
    if word.dims[0] != s.n_vocab {
        return Err(bad(format!(
            "the word table has {} rows, config.json says vocab_size {}",
            word.dims[0], s.n_vocab
        )));
    }
    let table = |c: Rc<Const>| Weight::float(c.dims.clone(), owned(c));
    out.insert("token_embd.weight".into(), table(word));
    out.insert("position_embd.weight".into(), table(pos));
    if let Some(t) = types {
        out.insert("token_types.weight".into(), table(t));
    }
    Ok(Found {
        tensors: out,
        eps,
        head,
        stored,
        producer: m.producer.to_string(),
    })
}
