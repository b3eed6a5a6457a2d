//! The header: its parse ([`Gguf::read`], [`Gguf::read_index`]) into metadata and the
//! validated tensor index ([`TensorInfo`]), every count and offset checked against the file.

use super::source::ByteSource;
use super::types::GgmlType;
use super::value::{self, Array, Strings, Value};
use crate::error::{Error, Result};
use std::collections::BTreeMap;

pub(super) const MAGIC: &[u8; 4] = b"GGUF";
pub(super) const DEFAULT_ALIGNMENT: u64 = 32;
const MAX_DIMS: usize = 4;
/// The longest tensor name GGUF allows (its specification: at most 64 bytes; ggml refuses
/// longer ones). A bound, so that a hostile header's name cannot be megabytes of the file
/// copied into memory and into every error message that names the tensor.
const MAX_TENSOR_NAME: u64 = 64;
/// The longest metadata key GGUF allows (2¹⁶ − 1 bytes).
const MAX_KEY: u64 = 65_535;

/// One entry of the tensor index.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// ggml order: `dims[0]` is the innermost (row length), as in the file.
    pub dims: Vec<u64>,
    /// Absolute offset of the first byte in the file.
    pub offset: u64,
    /// Number of bytes of the tensor's data.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// (rows, row length) for a matrix; a vector is one row.
    pub fn rows_cols(&self) -> (usize, usize) {
        let cols = self.dims.first().copied().unwrap_or(1);
        let rows: u64 = self.dims.iter().skip(1).product();
        (rows as usize, cols as usize)
    }
}

/// A parsed GGUF header: version, metadata and the validated tensor index.
#[derive(Clone, Debug)]
pub struct Gguf {
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    /// Absolute offset where tensor data begins.
    pub data_offset: u64,
    /// Length of the whole file.
    pub file_len: u64,
}

impl Gguf {
    /// Parse the header of `src`, reading only as much of it as the header needs.
    pub fn read(src: &(impl ByteSource + ?Sized)) -> Result<Self> {
        Self::read_with(src, true)
    }

    /// The header alone: the metadata and the tensor index of a file whose tensors' data may
    /// lie past its end (a GGUF's first [`Gguf::data_offset`] bytes, as `kerze inspect`
    /// reports them in `header_bytes`). What `kerze synth --shape-of` reads: a model's shape
    /// without its weights. Nothing here may be loaded as a model.
    pub fn read_index(src: &(impl ByteSource + ?Sized)) -> Result<Self> {
        Self::read_with(src, false)
    }

    /// The header from a file's first bytes, `prefix`, of a file of `file_len` bytes (its
    /// tensors' data may lie past them), or `None` when the header runs past `prefix`: what
    /// `probe` reads before a download, a larger prefix asked for where it needs one.
    pub fn read_prefix(prefix: &[u8], file_len: u64) -> Result<Option<Self>> {
        let have = prefix.len() as u64;
        match parse_header(prefix, file_len.max(have), false) {
            Ok(g) => Ok(Some(g)),
            Err(ParseError::NeedMore) if have < file_len => Ok(None),
            Err(ParseError::NeedMore) => Err(truncated(file_len)),
            Err(ParseError::Bad(msg)) => Err(Error::Gguf(msg)),
        }
    }

    fn read_with(src: &(impl ByteSource + ?Sized), whole: bool) -> Result<Self> {
        let file_len = src.len();
        // Gemma 3's header (with a 262 144-token vocabulary) is about 6.5 MB: start at 8 MiB
        // and grow only if the header really is longer.
        let mut window = file_len.min(8 << 20);
        loop {
            let len = usize::try_from(window).map_err(|_| Error::Gguf("file too large".into()))?;
            let mut buf = vec![0u8; len];
            src.read_at(0, &mut buf)?;
            match parse_header(&buf, file_len, whole) {
                Err(ParseError::NeedMore) if window < file_len => {
                    window = file_len.min(window.saturating_mul(4));
                }
                Err(ParseError::NeedMore) => return Err(truncated(file_len)),
                Err(ParseError::Bad(msg)) => return Err(Error::Gguf(msg)),
                Ok(g) => return Ok(g),
            }
        }
    }

    /// A metadata value by key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// A tensor by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The general.architecture string.
    pub fn architecture(&self) -> Result<&str> {
        self.get("general.architecture")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::Gguf("metadata has no general.architecture".into()))
    }
}

enum ParseError {
    /// The buffer ended inside the header; more of the file may complete it.
    NeedMore,
    Bad(String),
}

impl From<String> for ParseError {
    fn from(s: String) -> Self {
        ParseError::Bad(s)
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Bytes in the whole file: counts are checked against what the file could still hold.
    file_len: u64,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ParseError> {
        let end = self.pos.checked_add(n).ok_or(ParseError::NeedMore)?;
        match self.buf.get(self.pos..end) {
            Some(s) => {
                self.pos = end;
                Ok(s)
            }
            None if (end as u64) <= self.file_len => Err(ParseError::NeedMore),
            None => Err(ParseError::Bad(format!(
                "the header needs byte {end} but the file has {} bytes: the file is truncated",
                self.file_len
            ))),
        }
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], ParseError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn u32(&mut self) -> Result<u32, ParseError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, ParseError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// Bytes left in the file after the cursor: the bound for every count read here.
    fn remaining_in_file(&self) -> u64 {
        self.file_len.saturating_sub(self.pos as u64)
    }
    /// A count of items each at least `min_size` bytes, refused if the file cannot hold them.
    fn count(&mut self, what: &str, min_size: u64) -> Result<usize, ParseError> {
        let n = self.u64()?;
        if n.saturating_mul(min_size) > self.remaining_in_file() {
            return Err(ParseError::Bad(format!(
                "{what} count {n} at byte {} cannot fit in the {} bytes left in the file",
                self.pos - 8,
                self.remaining_in_file()
            )));
        }
        Ok(n as usize)
    }
    fn string(&mut self, what: &str) -> Result<String, ParseError> {
        let n = self.count(what, 1)?;
        let bytes = self.take(n)?;
        Ok(value::lossy(bytes))
    }
    /// A string GGUF bounds to `max` bytes (`noun`: a key, a tensor name); a longer one is
    /// refused. `what` names its length, as for [`Cursor::string`].
    fn bounded_string(&mut self, what: &str, noun: &str, max: u64) -> Result<String, ParseError> {
        let at = self.pos;
        let n = u64::from_le_bytes(self.array()?);
        if n > max {
            return Err(
                format!("{noun} of {n} bytes at byte {at}: GGUF allows at most {max}").into(),
            );
        }
        self.pos = at;
        self.string(what)
    }
    fn array_value(&mut self) -> Result<Array, ParseError> {
        let elem_ty = self.u32()?;
        let min = min_value_size(elem_ty).ok_or_else(|| {
            format!(
                "unknown array element type {elem_ty} at byte {}",
                self.pos - 4
            )
        })?;
        if elem_ty == 9 {
            return Err(format!("nested arrays at byte {} are not supported", self.pos - 4).into());
        }
        let n = self.count("array element", min)?;
        // Every element is in the file (count checked above), and each in-memory element is
        // no larger than on disk: the vectors below never outgrow the bytes really there.
        macro_rules! prim {
            ($variant:ident, $t:ty) => {{
                let mut v: Vec<$t> = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(<$t>::from_le_bytes(self.array()?));
                }
                Array::$variant(v)
            }};
        }
        Ok(match elem_ty {
            0 => prim!(U8, u8),
            1 => prim!(I8, i8),
            2 => prim!(U16, u16),
            3 => prim!(I16, i16),
            4 => prim!(U32, u32),
            5 => prim!(I32, i32),
            6 => prim!(F32, f32),
            7 => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.array::<1>()?[0] != 0);
                }
                Array::Bool(v)
            }
            8 => {
                // Copied as they are and checked as UTF-8 at once (262 144 tokens one by one
                // cost more than the copy).
                let mut data = Vec::new();
                let mut ends = Vec::with_capacity(n);
                for _ in 0..n {
                    let len = self.count("string length", 1)?;
                    data.extend_from_slice(self.take(len)?);
                    ends.push(data.len());
                }
                Array::Str(Strings::from_utf8(data, ends))
            }
            10 => prim!(U64, u64),
            11 => prim!(I64, i64),
            _ => prim!(F64, f64),
        })
    }

    fn value(&mut self, ty: u32) -> Result<Value, ParseError> {
        Ok(match ty {
            0 => Value::U8(self.array::<1>()?[0]),
            1 => Value::I8(i8::from_le_bytes(self.array()?)),
            2 => Value::U16(u16::from_le_bytes(self.array()?)),
            3 => Value::I16(i16::from_le_bytes(self.array()?)),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(i32::from_le_bytes(self.array()?)),
            6 => Value::F32(f32::from_le_bytes(self.array()?)),
            7 => match self.array::<1>()?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => {
                    return Err(format!(
                        "bool value {b} at byte {} is neither 0 nor 1",
                        self.pos - 1
                    )
                    .into())
                }
            },
            8 => Value::String(self.string("string length")?),
            9 => Value::Array(self.array_value()?),
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.array()?)),
            12 => Value::F64(f64::from_le_bytes(self.array()?)),
            t => {
                return Err(
                    format!("unknown metadata value type {t} at byte {}", self.pos - 4).into(),
                )
            }
        })
    }
}

/// The fewest bytes a value of type `ty` takes in the file.
fn min_value_size(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,
        9 => 12,
        10..=12 => 8,
        _ => return None,
    })
}

/// A header that runs past the end of a file of `file_len` bytes.
fn truncated(file_len: u64) -> Error {
    Error::Gguf(format!(
        "the header runs past the end of the file ({file_len} bytes): the file is truncated"
    ))
}

/// `whole`: every tensor's data must lie inside the file (else only the header must).
fn parse_header(buf: &[u8], file_len: u64, whole: bool) -> Result<Gguf, ParseError> {
    let mut c = Cursor {
        buf,
        pos: 0,
        file_len,
    };
    let magic = c.take(4).map_err(|e| match e {
        ParseError::NeedMore => ParseError::Bad("file too short to be GGUF".into()),
        other => other,
    })?;
    if magic != MAGIC {
        return Err(format!(
            "the file does not start with the GGUF magic (found {:02x?}): it is not a GGUF model",
            magic
        )
        .into());
    }
    let version = c.u32()?;
    if !(2..=3).contains(&version) {
        return Err(format!("GGUF version {version} is not supported (2 and 3 are)").into());
    }
    // The smallest tensor entry: name length 8 + n_dims 4 + one dim 8 + type 4 + offset 8.
    let n_tensors = c.count("tensor", 32)?;
    let n_kv = c.count("metadata entry", 12)?;

    let mut metadata = BTreeMap::new();
    for _ in 0..n_kv {
        let key = c.bounded_string("key length", "a metadata key", MAX_KEY)?;
        let ty = c.u32()?;
        let v = c.value(ty)?;
        if metadata.insert(key.clone(), v).is_some() {
            let key = crate::error::excerpt(&key, 64);
            return Err(format!("metadata key {key} appears twice").into());
        }
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a.is_power_of_two() && a <= 1 << 20 => a,
            _ => {
                return Err(
                    format!("general.alignment {v:?} is not a power of two up to 1 MiB").into(),
                )
            }
        },
    };

    // `n_tensors` entries of at least 32 bytes each are in the file (checked by `count`), so
    // this reserves at most ~2.3× the bytes really there; `offset` is relative until the end
    // of the header is known.
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(n_tensors);
    for _ in 0..n_tensors {
        let name = c.bounded_string("tensor name length", "a tensor name", MAX_TENSOR_NAME)?;
        let n_dims = c.u32()? as usize;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(format!(
                "tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS} are valid)"
            )
            .into());
        }
        let mut dims = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            dims.push(c.u64()?);
        }
        let ty_id = c.u32()?;
        let rel_offset = c.u64()?;
        let ty = GgmlType::from_id(ty_id).ok_or_else(|| {
            format!("tensor {name} has ggml type id {ty_id}, which kerze does not know")
        })?;
        let n_bytes = tensor_bytes(&name, ty, &dims)?;
        if rel_offset % alignment != 0 {
            return Err(format!(
                "tensor {name} starts at offset {rel_offset}, not a multiple of the alignment {alignment}"
            )
            .into());
        }
        tensors.push(TensorInfo {
            name,
            ty,
            dims,
            offset: rel_offset,
            n_bytes,
        });
    }
    let mut names = std::collections::HashSet::with_capacity(tensors.len());
    if let Some(dup) = tensors.iter().find(|t| !names.insert(t.name.as_str())) {
        return Err(format!("tensor {} appears twice", dup.name).into());
    }
    drop(names);
    let header_end = c.pos as u64;
    let data_offset = header_end.div_ceil(alignment) * alignment;
    for t in &mut tensors {
        let offset = data_offset
            .checked_add(t.offset)
            .ok_or_else(|| format!("tensor {} offset overflows", t.name))?;
        let end = offset
            .checked_add(t.n_bytes)
            .ok_or_else(|| format!("tensor {} size overflows", t.name))?;
        if whole && end > file_len {
            return Err(format!(
                "tensor {} ends at byte {end}, past the end of the file ({file_len} bytes): the file is truncated",
                t.name
            )
            .into());
        }
        t.offset = offset;
    }
    Ok(Gguf {
        version,
        metadata,
        tensors,
        data_offset,
        file_len,
    })
}

fn tensor_bytes(name: &str, ty: GgmlType, dims: &[u64]) -> Result<u64, ParseError> {
    let mut n: u64 = 1;
    for &d in dims {
        if d == 0 {
            return Err(format!("tensor {name} has a zero dimension {dims:?}").into());
        }
        n = n
            .checked_mul(d)
            .filter(|&n| n <= 1 << 40)
            .ok_or_else(|| format!("tensor {name} dimensions {dims:?} are absurd"))?;
    }
    let (block, size) = ty.block();
    if !dims[0].is_multiple_of(block) {
        return Err(format!(
            "tensor {name} rows of {} elements are not whole {ty} blocks of {block}",
            dims[0]
        )
        .into());
    }
    Ok(n / block * size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::Writer;

    fn small() -> Vec<u8> {
        let mut w = Writer::new();
        w.kv("general.architecture", Value::String("gemma3".into()))
            .kv("a.list", Value::Array(Array::F32(vec![1.0, -2.5])))
            .tensor("t", GgmlType::F32, &[3, 2], vec![0u8; 24])
            .tensor("q", GgmlType::Q8_0, &[32], vec![1u8; 34]);
        w.to_bytes()
    }

    /// A string array is checked as UTF-8 at once, and each string is what reading it alone
    /// gives: valid ones as they are, invalid ones repaired, a character split between two
    /// strings (the whole valid, the halves not) repaired in both.
    #[test]
    fn string_arrays_are_each_strings_utf8() {
        let pieces: [&[u8]; 6] = [
            b"a",
            "\u{2581}b".as_bytes(),
            b"",
            b"\xE2\x96",
            b"\x81c",
            b"x\xFFy",
        ];
        for take in [&pieces[..3], &pieces[..5], &pieces[..]] {
            let mut data = Vec::new();
            let mut ends = Vec::new();
            for p in take {
                data.extend_from_slice(p);
                ends.push(data.len());
            }
            let s = Strings::from_utf8(data, ends);
            let want: Vec<String> = take
                .iter()
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .collect();
            assert_eq!(s.iter().collect::<Vec<_>>(), want);
        }
    }

    /// GGUF bounds a tensor name to 64 bytes and a key to 2¹⁶ − 1: a longer one (a hostile
    /// header's length) is refused with what and where it is, not read into memory.
    #[test]
    fn names_and_keys_longer_than_gguf_allows_are_refused() {
        let file = |name: &str, key: &str| {
            let mut w = Writer::new();
            w.kv(key, Value::U32(1))
                .tensor(name, GgmlType::F32, &[1], vec![0u8; 4]);
            w.to_bytes()
        };
        assert!(Gguf::read(file(&"n".repeat(64), "k").as_slice()).is_ok());
        let e = Gguf::read(file(&"n".repeat(65), "k").as_slice())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("a tensor name of 65 bytes at byte") && e.contains("at most 64"),
            "{e}"
        );
        assert!(Gguf::read(file("n", &"k".repeat(65_535)).as_slice()).is_ok());
        let e = Gguf::read(file("n", &"k".repeat(65_536)).as_slice())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("a metadata key of 65536 bytes at byte 24"),
            "{e}"
        );
    }

    /// A string with invalid UTF-8 reads as `String::from_utf8_lossy` gives it, in an
    /// allocation of exactly its size.
    #[test]
    fn a_repaired_string_is_its_lossy_text_at_its_size() {
        for bytes in [&b"ok"[..], b"\xFF\xFE", b"a\xE2\x96b\xFFc", b"\xE2\x96\x81"] {
            let s = value::lossy(bytes);
            assert_eq!(s, String::from_utf8_lossy(bytes));
            assert_eq!(s.capacity(), s.len());
        }
    }

    #[test]
    fn round_trip() {
        let bytes = small();
        let g = Gguf::read(bytes.as_slice()).unwrap();
        assert_eq!(g.architecture().unwrap(), "gemma3");
        assert_eq!(g.tensors.len(), 2);
        let q = g.tensor("q").unwrap();
        assert_eq!(q.n_bytes, 34);
        assert_eq!(q.offset % 32, 0);
        assert_eq!(g.tensor("t").unwrap().rows_cols(), (2, 3));
        assert_eq!(g.get("a.list").unwrap().as_array().unwrap().len(), 2);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = small();
        for cut in 0..bytes.len() {
            assert!(Gguf::read(&bytes[..cut]).is_err(), "cut at {cut} parsed");
        }
    }

    #[test]
    fn the_index_reads_from_the_header_alone() {
        let bytes = small();
        let whole = Gguf::read(bytes.as_slice()).unwrap();
        let end = whole.data_offset as usize;
        // Cut anywhere from the data's start on: the index is whole, the model is not.
        for cut in end..bytes.len() {
            let g = Gguf::read_index(&bytes[..cut]).unwrap();
            assert_eq!((&g.metadata, &g.tensors), (&whole.metadata, &whole.tensors));
            assert!(
                Gguf::read(&bytes[..cut]).is_err(),
                "cut at {cut} read as a model"
            );
        }
        // Inside the header (it ends at most 31 bytes of padding before the data) it is an
        // error as before.
        for cut in 0..end.saturating_sub(31) {
            assert!(
                Gguf::read_index(&bytes[..cut]).is_err(),
                "cut at {cut} parsed"
            );
        }
    }

    #[test]
    fn huge_counts_are_refused_before_allocation() {
        let mut b = small();
        // tensor count at byte 8
        b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = Gguf::read(b.as_slice()).unwrap_err().to_string();
        assert!(e.contains("cannot fit"), "{e}");
    }
}
