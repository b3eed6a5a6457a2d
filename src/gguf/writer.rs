//! Writing GGUF files (the synthetic test models and the fuzz corpus).

use super::header::{DEFAULT_ALIGNMENT, MAGIC};
use super::types::GgmlType;
use super::value::{Array, Value};

/// Builds GGUF files: the synthetic test models and the fuzz corpus are made with it.
#[derive(Default)]
pub struct Writer {
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, GgmlType, Vec<u64>, Vec<u8>)>,
}

impl Writer {
    /// An empty file.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a metadata entry.
    pub fn kv(&mut self, key: &str, v: Value) -> &mut Self {
        self.metadata.push((key.to_string(), v));
        self
    }

    /// Add a tensor; `dims` in ggml order (row length first); `data` already encoded.
    pub fn tensor(&mut self, name: &str, ty: GgmlType, dims: &[u64], data: Vec<u8>) -> &mut Self {
        self.tensors
            .push((name.to_string(), ty, dims.to_vec(), data));
        self
    }

    /// The header (padded to the data's start), each tensor's offset in the data, and the
    /// data's length.
    fn layout(&self) -> (Vec<u8>, Vec<u64>, u64) {
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            write_str(&mut out, k);
            out.extend_from_slice(&v.type_id().to_le_bytes());
            write_value(&mut out, v);
        }
        let mut rel = 0u64;
        let mut offsets = Vec::new();
        for (name, ty, dims, data) in &self.tensors {
            write_str(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.id().to_le_bytes());
            out.extend_from_slice(&rel.to_le_bytes());
            offsets.push(rel);
            rel = (rel + data.len() as u64).div_ceil(DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT;
        }
        let data_start = (out.len() as u64).div_ceil(DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT;
        out.resize(data_start as usize, 0);
        (out, offsets, rel)
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let (mut out, offsets, _) = self.layout();
        let start = out.len();
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            out.resize(start + off as usize, 0);
            out.extend_from_slice(data);
        }
        out
    }

    /// The file's bytes, allocated once at their final size, each tensor's data freed once
    /// copied: the peak is the data plus the file, not twice the file.
    pub fn into_bytes(self) -> Vec<u8> {
        let (head, offsets, len) = self.layout();
        let start = head.len();
        let mut out = Vec::with_capacity(start + len as usize);
        out.extend_from_slice(&head);
        drop(head);
        for ((_, _, _, data), off) in self.tensors.into_iter().zip(offsets) {
            out.resize(start + off as usize, 0);
            out.extend_from_slice(&data);
        }
        out
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => write_str(out, s),
        Value::Array(a) => {
            out.extend_from_slice(&a.elem_type_id().to_le_bytes());
            out.extend_from_slice(&(a.len() as u64).to_le_bytes());
            macro_rules! each {
                ($v:expr) => {
                    $v.iter()
                        .for_each(|x| out.extend_from_slice(&x.to_le_bytes()))
                };
            }
            match a {
                Array::U8(v) => out.extend_from_slice(v),
                Array::I8(v) => each!(v),
                Array::U16(v) => each!(v),
                Array::I16(v) => each!(v),
                Array::U32(v) => each!(v),
                Array::I32(v) => each!(v),
                Array::F32(v) => each!(v),
                Array::Bool(v) => v.iter().for_each(|&b| out.push(u8::from(b))),
                Array::Str(v) => v.iter().for_each(|x| write_str(out, x)),
                Array::U64(v) => each!(v),
                Array::I64(v) => each!(v),
                Array::F64(v) => each!(v),
            }
        }
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}
