//! The part of ONNX's protobuf schema kerze reads (`ModelProto` → `GraphProto` → nodes,
//! initializers and their attributes), decoded by hand: no code generator, no copy of the
//! bytes. Names borrow from the file; tensor data stays a slice of it until a weight is
//! asked for.
//!
//! Hostile input is bounded: every length is checked against the bytes there before it is
//! used, sub-graphs (`If`/`Loop` bodies) are skipped rather than descended into, so nesting
//! cannot recurse, and the number of parsed items (nodes, attributes, names, data pieces) has
//! a ceiling, so a file of tiny repeated messages cannot turn into a giant allocation.

use crate::error::{excerpt, Error, Result};

/// The most names, values and data pieces one file may hold together (each costs 8–24 bytes
/// here): BERT-large's export has ~20 k.
const MAX_ITEMS: usize = 1_000_000;
/// The most nodes and initializers (~120 and ~150 bytes each here): an int8 BERT-large has
/// ~3 k nodes.
const MAX_NODES: usize = 100_000;
/// The most attributes of one node and dims of one tensor.
const MAX_ATTRS: usize = 256;
const MAX_DIMS: usize = 64;

pub(super) fn bad(msg: impl Into<String>) -> Error {
    Error::Onnx(msg.into())
}

/// ONNX `TensorProto.DataType` values kerze reads.
pub mod dtype {
    pub const FLOAT: i32 = 1;
    pub const UINT8: i32 = 2;
    pub const INT8: i32 = 3;
    pub const UINT16: i32 = 4;
    pub const INT16: i32 = 5;
    pub const INT32: i32 = 6;
    pub const INT64: i32 = 7;
    pub const BOOL: i32 = 9;
    pub const FLOAT16: i32 = 10;
    pub const DOUBLE: i32 = 11;
    pub const UINT32: i32 = 12;
    pub const UINT64: i32 = 13;
    pub const BFLOAT16: i32 = 16;

    pub fn name(t: i32) -> String {
        match t {
            FLOAT => "float32".into(),
            UINT8 => "uint8".into(),
            INT8 => "int8".into(),
            UINT16 => "uint16".into(),
            INT16 => "int16".into(),
            INT32 => "int32".into(),
            INT64 => "int64".into(),
            BOOL => "bool".into(),
            FLOAT16 => "float16".into(),
            DOUBLE => "float64".into(),
            UINT32 => "uint32".into(),
            UINT64 => "uint64".into(),
            BFLOAT16 => "bfloat16".into(),
            other => format!("data type {other}"),
        }
    }
}

/// A parsed model: what the graph mapper needs.
#[derive(Debug, Default)]
pub struct Model<'a> {
    pub ir_version: i64,
    pub producer: &'a str,
    /// (domain, version); the default domain is "".
    pub opsets: Vec<(&'a str, i64)>,
    pub graph: Graph<'a>,
}

#[derive(Debug, Default)]
pub struct Graph<'a> {
    pub nodes: Vec<Node<'a>>,
    pub initializers: Vec<Tensor<'a>>,
    pub inputs: Vec<&'a str>,
    pub outputs: Vec<&'a str>,
    /// Sparse initializers are not read; their count makes the error say so.
    pub sparse_initializers: usize,
}

#[derive(Debug, Default)]
pub struct Node<'a> {
    pub op: &'a str,
    pub domain: &'a str,
    pub name: &'a str,
    pub inputs: Vec<&'a str>,
    pub outputs: Vec<&'a str>,
    pub attrs: Vec<Attr<'a>>,
}

#[derive(Debug, Default)]
pub struct Attr<'a> {
    pub name: &'a str,
    pub f: Option<f32>,
    pub i: Option<i64>,
    pub ints: Vec<i64>,
    pub floats: Vec<f32>,
    /// A string attribute's bytes (`Gelu`'s `approximate`).
    pub s: Option<&'a [u8]>,
    pub t: Option<Tensor<'a>>,
}

/// One tensor: its shape, type and where its values lie in the file.
#[derive(Debug, Default)]
pub struct Tensor<'a> {
    pub name: &'a str,
    pub dims: Vec<i64>,
    pub dtype: i32,
    /// `raw_data`: little-endian values.
    raw: Option<&'a [u8]>,
    /// `float_data` (fixed32), `double_data` (fixed64): packed byte runs, in order.
    fixed: Vec<&'a [u8]>,
    /// `int32_data`, `int64_data`, `uint64_data`: varint byte runs, in order.
    varints: Vec<&'a [u8]>,
    /// Stored in another file (`data_location = EXTERNAL`).
    pub external: bool,
}

/// Protobuf wire values.
enum Wire<'a> {
    Varint(u64),
    Fixed64(&'a [u8]),
    Bytes(&'a [u8]),
    Fixed32(&'a [u8]),
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = *self
                .buf
                .get(self.pos)
                .ok_or_else(|| bad("the file ends inside a number (truncated?)"))?;
            self.pos += 1;
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(bad("a number longer than 10 bytes"))
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8]> {
        let left = (self.buf.len() - self.pos) as u64;
        if n > left {
            return Err(bad(format!(
                "a field of {n} bytes where {left} are left (truncated or corrupt)"
            )));
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    /// The next (field number, value), or None at the end.
    fn field(&mut self) -> Result<Option<(u64, Wire<'a>)>> {
        if self.pos == self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let (field, wire) = (key >> 3, key & 7);
        if field == 0 {
            return Err(bad("field number 0 (not a protobuf message)"));
        }
        let v = match wire {
            0 => Wire::Varint(self.varint()?),
            1 => Wire::Fixed64(self.take(8)?),
            2 => {
                let n = self.varint()?;
                Wire::Bytes(self.take(n)?)
            }
            5 => Wire::Fixed32(self.take(4)?),
            other => {
                return Err(bad(format!(
                    "wire type {other} (groups or garbage: not an ONNX file)"
                )))
            }
        };
        Ok(Some((field, v)))
    }
}

/// Counts parsed items against [`MAX_ITEMS`].
struct Budget(usize);

impl Budget {
    fn take(&mut self) -> Result<()> {
        self.0 += 1;
        if self.0 > MAX_ITEMS {
            return Err(bad(format!(
                "more than {MAX_ITEMS} nodes, names and tensor pieces: not a model kerze reads"
            )));
        }
        Ok(())
    }
}

fn text<'a>(b: &'a [u8], what: &str) -> Result<&'a str> {
    std::str::from_utf8(b).map_err(|_| bad(format!("{what} is not UTF-8")))
}

fn want_bytes<'a>(w: Wire<'a>, what: &str) -> Result<&'a [u8]> {
    match w {
        Wire::Bytes(b) => Ok(b),
        _ => Err(bad(format!("{what}: wrong wire type"))),
    }
}

fn want_varint(w: Wire<'_>, what: &str) -> Result<u64> {
    match w {
        Wire::Varint(v) => Ok(v),
        _ => Err(bad(format!("{what}: wrong wire type"))),
    }
}

/// Repeated int64 (packed or one by one) appended to `out`.
fn ints(w: Wire<'_>, out: &mut Vec<i64>, budget: &mut Budget, what: &str) -> Result<()> {
    match w {
        Wire::Varint(v) => {
            budget.take()?;
            out.push(v as i64);
        }
        Wire::Bytes(b) => {
            let mut r = Reader::new(b);
            while r.pos < b.len() {
                budget.take()?;
                out.push(r.varint()? as i64);
            }
        }
        _ => return Err(bad(format!("{what}: wrong wire type"))),
    }
    Ok(())
}

/// Parse a `ModelProto`.
pub fn parse(bytes: &[u8]) -> Result<Model<'_>> {
    if bytes.is_empty() {
        return Err(bad("the file is empty"));
    }
    if bytes.starts_with(b"GGUF") {
        return Err(bad("this is a GGUF file, not ONNX"));
    }
    let mut budget = Budget(0);
    let mut m = Model::default();
    let mut graphs = 0;
    let mut r = Reader::new(bytes);
    while let Some((f, w)) = r.field()? {
        match f {
            1 => m.ir_version = want_varint(w, "ir_version")? as i64,
            2 => m.producer = text(want_bytes(w, "producer_name")?, "producer_name")?,
            7 => {
                graphs += 1;
                m.graph = graph(want_bytes(w, "graph")?, &mut budget)?;
            }
            8 => {
                budget.take()?;
                let mut r = Reader::new(want_bytes(w, "opset_import")?);
                let (mut domain, mut version) = ("", 0i64);
                while let Some((f, w)) = r.field()? {
                    match f {
                        1 => domain = text(want_bytes(w, "opset domain")?, "opset domain")?,
                        2 => version = want_varint(w, "opset version")? as i64,
                        _ => {}
                    }
                }
                m.opsets.push((domain, version));
            }
            _ => {}
        }
    }
    if graphs != 1 {
        return Err(bad(format!(
            "{graphs} graphs in the file (an ONNX model has one; truncated or not ONNX?)"
        )));
    }
    if m.ir_version <= 0 {
        return Err(bad("no ir_version: not an ONNX model"));
    }
    Ok(m)
}

fn graph<'a>(b: &'a [u8], budget: &mut Budget) -> Result<Graph<'a>> {
    let mut g = Graph::default();
    let mut r = Reader::new(b);
    while let Some((f, w)) = r.field()? {
        match f {
            1 => {
                budget.take()?;
                if g.nodes.len() == MAX_NODES {
                    return Err(bad(format!("more than {MAX_NODES} nodes")));
                }
                g.nodes.push(node(want_bytes(w, "node")?, budget)?);
            }
            5 => {
                budget.take()?;
                if g.initializers.len() == MAX_NODES {
                    return Err(bad(format!("more than {MAX_NODES} initializers")));
                }
                g.initializers
                    .push(tensor(want_bytes(w, "initializer")?, budget)?);
            }
            11 | 12 => {
                budget.take()?;
                let mut vr = Reader::new(want_bytes(w, "graph input")?);
                let mut name = "";
                while let Some((f, w)) = vr.field()? {
                    if f == 1 {
                        name = text(want_bytes(w, "value name")?, "value name")?;
                    }
                }
                if f == 11 {
                    g.inputs.push(name);
                } else {
                    g.outputs.push(name);
                }
            }
            15 => g.sparse_initializers += 1,
            _ => {}
        }
    }
    Ok(g)
}

fn node<'a>(b: &'a [u8], budget: &mut Budget) -> Result<Node<'a>> {
    let mut n = Node::default();
    let mut r = Reader::new(b);
    while let Some((f, w)) = r.field()? {
        match f {
            1 | 2 => {
                budget.take()?;
                let s = text(want_bytes(w, "node input")?, "a node's input name")?;
                if f == 1 {
                    n.inputs.push(s);
                } else {
                    n.outputs.push(s);
                }
            }
            3 => n.name = text(want_bytes(w, "node name")?, "node name")?,
            4 => n.op = text(want_bytes(w, "op_type")?, "op_type")?,
            5 => {
                budget.take()?;
                if n.attrs.len() == MAX_ATTRS {
                    return Err(bad(format!("a node with more than {MAX_ATTRS} attributes")));
                }
                n.attrs.push(attr(want_bytes(w, "attribute")?, budget)?);
            }
            7 => n.domain = text(want_bytes(w, "node domain")?, "node domain")?,
            _ => {}
        }
    }
    // Every ONNX operator has an output; the graph's walk reads each node's first.
    if n.outputs.is_empty() {
        let (name, op) = (excerpt(n.name, 64), excerpt(n.op, 64));
        return Err(bad(format!("node '{name}' ({op}) has no output")));
    }
    Ok(n)
}

fn attr<'a>(b: &'a [u8], budget: &mut Budget) -> Result<Attr<'a>> {
    let mut a = Attr::default();
    let mut r = Reader::new(b);
    while let Some((f, w)) = r.field()? {
        match f {
            1 => a.name = text(want_bytes(w, "attribute name")?, "attribute name")?,
            2 => match w {
                Wire::Fixed32(x) => a.f = Some(f32::from_le_bytes([x[0], x[1], x[2], x[3]])),
                _ => return Err(bad("attribute f: wrong wire type")),
            },
            3 => a.i = Some(want_varint(w, "attribute i")? as i64),
            4 => a.s = Some(want_bytes(w, "attribute s")?),
            5 => a.t = Some(tensor(want_bytes(w, "attribute t")?, budget)?),
            7 => match w {
                Wire::Fixed32(x) => {
                    budget.take()?;
                    a.floats.push(f32::from_le_bytes([x[0], x[1], x[2], x[3]]))
                }
                Wire::Bytes(x) if x.len() % 4 == 0 => {
                    for c in x.chunks_exact(4) {
                        budget.take()?;
                        a.floats.push(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
                    }
                }
                _ => return Err(bad("attribute floats: wrong wire type")),
            },
            8 => ints(w, &mut a.ints, budget, "attribute ints")?,
            // 6 (g) and 11 (graphs): sub-graphs, never descended into.
            _ => {}
        }
    }
    Ok(a)
}

fn tensor<'a>(b: &'a [u8], budget: &mut Budget) -> Result<Tensor<'a>> {
    let mut t = Tensor::default();
    let mut r = Reader::new(b);
    while let Some((f, w)) = r.field()? {
        match f {
            1 => {
                ints(w, &mut t.dims, budget, "tensor dims")?;
                if t.dims.len() > MAX_DIMS {
                    return Err(bad(format!("a tensor of more than {MAX_DIMS} dims")));
                }
            }
            2 => t.dtype = want_varint(w, "data_type")? as i32,
            4 | 10 => {
                budget.take()?;
                t.fixed.push(match w {
                    Wire::Bytes(x) | Wire::Fixed32(x) | Wire::Fixed64(x) => x,
                    Wire::Varint(_) => return Err(bad("float_data: wrong wire type")),
                });
            }
            5 | 7 | 11 => {
                budget.take()?;
                match w {
                    Wire::Bytes(x) => t.varints.push(x),
                    Wire::Varint(_) => {
                        // onnx.proto declares these fields packed; exporters write them so.
                        return Err(bad(
                            "unpacked int data in a tensor (not written by any ONNX exporter)",
                        ));
                    }
                    _ => return Err(bad("int data: wrong wire type")),
                }
            }
            8 => t.name = text(want_bytes(w, "tensor name")?, "tensor name")?,
            9 => t.raw = Some(want_bytes(w, "raw_data")?),
            14 => t.external = want_varint(w, "data_location")? == 1,
            _ => {}
        }
    }
    Ok(t)
}

impl Tensor<'_> {
    /// The element count its dims give, checked for overflow and negative dims.
    pub fn count(&self) -> Result<usize> {
        self.dims.iter().try_fold(1usize, |acc, &d| {
            usize::try_from(d)
                .ok()
                .and_then(|d| acc.checked_mul(d))
                .ok_or_else(|| bad(format!("tensor {}: dims {:?}", self.name, self.dims)))
        })
    }

    fn width(&self) -> Result<usize> {
        Ok(match self.dtype {
            dtype::FLOAT | dtype::INT32 | dtype::UINT32 => 4,
            dtype::UINT8 | dtype::INT8 | dtype::BOOL => 1,
            dtype::UINT16 | dtype::INT16 | dtype::FLOAT16 | dtype::BFLOAT16 => 2,
            dtype::INT64 | dtype::DOUBLE | dtype::UINT64 => 8,
            other => {
                return Err(Error::UnsupportedTensorType {
                    tensor: self.name.to_string(),
                    ty: dtype::name(other),
                    supported: "float32, float16, bfloat16, float64 and integer ONNX tensors",
                })
            }
        })
    }

    /// The values as f64 (integers exactly up to 2^53), their count checked against the
    /// bytes that are there before anything is allocated.
    pub fn values(&self) -> Result<Vec<f64>> {
        self.collect(|v| v)
    }

    /// The values as f32: exact for float32, float16, bfloat16 and 8/16-bit integers.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        self.collect(|v| v as f32)
    }

    fn collect<T>(&self, conv: impl Fn(f64) -> T) -> Result<Vec<T>> {
        if self.external {
            return Err(bad(format!(
                "tensor {} is stored in a separate file (external data): export the model as one file",
                self.name
            )));
        }
        let n = self.count()?;
        let width = self.width()?;
        let mismatch = |have: usize| {
            bad(format!(
                "tensor {}: dims {:?} need {n} values, the file has {have}",
                self.name, self.dims
            ))
        };
        if let Some(raw) = self.raw {
            if raw.len() != n.checked_mul(width).ok_or_else(|| mismatch(0))? {
                return Err(mismatch(raw.len() / width));
            }
            return Ok(raw
                .chunks_exact(width)
                .map(|b| conv(self.decode(b)))
                .collect());
        }
        if !self.fixed.is_empty() {
            let w = if self.dtype == dtype::DOUBLE { 8 } else { 4 };
            let have: usize = self.fixed.iter().map(|c| c.len() / w).sum();
            if have != n || self.fixed.iter().any(|c| c.len() % w != 0) {
                return Err(mismatch(have));
            }
            return Ok(self
                .fixed
                .iter()
                .flat_map(|c| c.chunks_exact(w))
                .map(|b| {
                    conv(match b.len() {
                        8 => f64::from_le_bytes(b.try_into().unwrap_or_default()),
                        _ => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
                    })
                })
                .collect());
        }
        // Varints: each is at least one byte, so `n` is bounded by the bytes there.
        let bytes: usize = self.varints.iter().map(|c| c.len()).sum();
        if n > bytes {
            return Err(mismatch(bytes));
        }
        let mut out = Vec::with_capacity(n);
        for c in &self.varints {
            let mut r = Reader::new(c);
            while r.pos < c.len() {
                let v = r.varint()?;
                out.push(conv(match self.dtype {
                    // float16/bfloat16 in int32_data: the 16 bits.
                    dtype::FLOAT16 => half::f16::from_bits(v as u16).to_f64(),
                    dtype::BFLOAT16 => half::bf16::from_bits(v as u16).to_f64(),
                    dtype::INT8 => (v as u8 as i8) as f64,
                    dtype::INT16 => (v as u16 as i16) as f64,
                    dtype::INT32 => (v as u32 as i32) as f64,
                    dtype::UINT64 => v as f64,
                    _ => (v as i64) as f64,
                }));
            }
        }
        if out.len() != n {
            return Err(mismatch(out.len()));
        }
        Ok(out)
    }

    fn decode(&self, b: &[u8]) -> f64 {
        match self.dtype {
            dtype::FLOAT => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
            dtype::FLOAT16 => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
            dtype::BFLOAT16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
            dtype::DOUBLE => f64::from_le_bytes(b.try_into().unwrap_or_default()),
            dtype::UINT8 | dtype::BOOL => b[0] as f64,
            dtype::INT8 => b[0] as i8 as f64,
            dtype::UINT16 => u16::from_le_bytes([b[0], b[1]]) as f64,
            dtype::INT16 => i16::from_le_bytes([b[0], b[1]]) as f64,
            dtype::INT32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
            dtype::UINT32 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
            dtype::UINT64 => u64::from_le_bytes(b.try_into().unwrap_or_default()) as f64,
            _ => i64::from_le_bytes(b.try_into().unwrap_or_default()) as f64,
        }
    }
}
