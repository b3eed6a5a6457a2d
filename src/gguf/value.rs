//! Metadata values. Arrays are stored by element type, so no array takes more memory than
//! its bytes in the file.

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub(super) fn type_id(&self) -> u32 {
        match self {
            Value::U8(_) => 0,
            Value::I8(_) => 1,
            Value::U16(_) => 2,
            Value::I16(_) => 3,
            Value::U32(_) => 4,
            Value::I32(_) => 5,
            Value::F32(_) => 6,
            Value::Bool(_) => 7,
            Value::String(_) => 8,
            Value::Array(_) => 9,
            Value::U64(_) => 10,
            Value::I64(_) => 11,
            Value::F64(_) => 12,
        }
    }

    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            Value::Bool(v) => Some(v.into()),
            _ => None,
        }
    }

    /// The value as a float, if it is any number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    /// The value as a string slice.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// A metadata array, stored by element type: a file's bytes never grow by more than the
/// element's in-memory size over its on-disk size (strings share one buffer).
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    Str(Strings),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

/// An array of strings in one buffer (262 144 tokens would otherwise be 262 144 allocations).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Strings {
    data: String,
    ends: Vec<usize>,
}

impl Strings {
    /// Empty, with room for `n` strings.
    pub(super) fn with_capacity(n: usize) -> Self {
        Self {
            data: String::new(),
            ends: Vec::with_capacity(n),
        }
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.data.get(start..end)
    }
    pub fn iter(&self) -> impl Iterator<Item = &str> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }
    pub fn push(&mut self, s: &str) {
        self.data.push_str(s);
        self.ends.push(self.data.len());
    }

    /// The strings of `data` ending at `ends` (offsets into `data`, ascending), checked as UTF-8
    /// in one pass over the whole: when it is valid and every string starts on a character
    /// boundary, so is every string. Otherwise each is checked alone, and one that is not
    /// valid is repaired (U+FFFD), as a single string read is.
    pub(super) fn from_utf8(data: Vec<u8>, ends: Vec<usize>) -> Self {
        // A byte that is not a continuation byte (0x80..=0xBF) starts a character.
        let starts_ok = |d: &[u8]| {
            ends.iter()
                .all(|&e| d.get(e).is_none_or(|&b| (b as i8) >= -0x40))
        };
        let data = match String::from_utf8(data) {
            Ok(text) if starts_ok(text.as_bytes()) => return Self { data: text, ends },
            Ok(text) => text.into_bytes(),
            Err(e) => e.into_bytes(),
        };
        let data: &[u8] = &data;
        let pieces = || {
            let mut start = 0;
            ends.iter().map(move |&end| {
                let piece = data.get(start..end).unwrap_or_default();
                start = end;
                piece
            })
        };
        // The repaired text's exact size first: pushed piece by piece, it would grow by
        // doubling to up to twice its size (up to 3 bytes of U+FFFD for each bad byte of a
        // hostile file's array).
        let mut s = Self::with_capacity(ends.len());
        s.data.reserve_exact(pieces().map(lossy_len).sum());
        for piece in pieces() {
            push_lossy(&mut s.data, piece);
            s.ends.push(s.data.len());
        }
        s
    }
}

/// The size of `bytes` as text with each invalid sequence replaced by U+FFFD (as
/// `String::from_utf8_lossy` replaces them).
fn lossy_len(bytes: &[u8]) -> usize {
    bytes
        .utf8_chunks()
        .map(|c| c.valid().len() + if c.invalid().is_empty() { 0 } else { 3 })
        .sum()
}

/// `bytes` appended to `out` as text, each invalid sequence as U+FFFD.
fn push_lossy(out: &mut String, bytes: &[u8]) {
    for c in bytes.utf8_chunks() {
        out.push_str(c.valid());
        if !c.invalid().is_empty() {
            out.push(char::REPLACEMENT_CHARACTER);
        }
    }
}

/// `bytes` as text, each invalid sequence as U+FFFD (`String::from_utf8_lossy`'s text), in one
/// allocation of exactly its size (a string read from a file is bounded only by the file).
pub(super) fn lossy(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(lossy_len(bytes));
    push_lossy(&mut s, bytes);
    s
}

impl<'a> FromIterator<&'a str> for Strings {
    fn from_iter<I: IntoIterator<Item = &'a str>>(it: I) -> Self {
        let mut s = Strings::default();
        it.into_iter().for_each(|x| s.push(x));
        s
    }
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::Str(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every element as f64, if the array holds numbers.
    pub fn to_f64s(&self) -> Option<Vec<f64>> {
        fn conv<T: Copy + Into<f64>>(v: &[T]) -> Vec<f64> {
            v.iter().map(|&x| x.into()).collect()
        }
        Some(match self {
            Array::U8(v) => conv(v),
            Array::I8(v) => conv(v),
            Array::U16(v) => conv(v),
            Array::I16(v) => conv(v),
            Array::U32(v) => conv(v),
            Array::I32(v) => conv(v),
            Array::F32(v) => conv(v),
            Array::F64(v) => v.clone(),
            Array::U64(v) => v.iter().map(|&x| x as f64).collect(),
            Array::I64(v) => v.iter().map(|&x| x as f64).collect(),
            Array::Bool(v) => v.iter().map(|&x| f64::from(u8::from(x))).collect(),
            Array::Str(_) => return None,
        })
    }

    /// The strings, if it is an array of strings.
    pub fn strings(&self) -> Option<&Strings> {
        match self {
            Array::Str(s) => Some(s),
            _ => None,
        }
    }

    pub(super) fn elem_type_id(&self) -> u32 {
        match self {
            Array::U8(_) => 0,
            Array::I8(_) => 1,
            Array::U16(_) => 2,
            Array::I16(_) => 3,
            Array::U32(_) => 4,
            Array::I32(_) => 5,
            Array::F32(_) => 6,
            Array::Bool(_) => 7,
            Array::Str(_) => 8,
            Array::U64(_) => 10,
            Array::I64(_) => 11,
            Array::F64(_) => 12,
        }
    }
}
