//! Loading a family's weights: the tensors it wants (presence and shape checked before any
//! read), the load itself, and small tensors read to the host.

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::gguf::{ByteSource, GgmlType, Gguf, TensorInfo};

/// Load progress: bytes copied so far, of all tensor bytes.
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64);

/// A tensor a family reads: its name, its dims as ggml lists them (fastest first) and
/// whether the file must have it.
pub struct Want {
    pub name: String,
    pub dims: Vec<u64>,
    pub required: bool,
    /// It serves as the LM head ([`Backend::load_head`]).
    pub head: bool,
}

impl Want {
    /// A tensor the file must have, `dims` in ggml order (`[cols, rows]` for a matrix).
    pub fn new(name: &str, dims: &[usize]) -> Self {
        Self {
            name: name.to_string(),
            dims: dims.iter().map(|&d| d as u64).collect(),
            required: true,
            head: false,
        }
    }

    /// This tensor serves as the LM head.
    pub fn head(self) -> Self {
        Self { head: true, ..self }
    }

    /// A tensor the file may leave out (then the family does without it).
    pub fn optional(name: &str, dims: &[usize]) -> Self {
        Self {
            required: false,
            ..Self::new(name, dims)
        }
    }
}

/// The weights of [`load_weights`], in the order they were wanted.
pub struct Weights<W>(std::vec::IntoIter<(String, Option<W>)>);

impl<W> Weights<W> {
    /// The next wanted tensor, which the file may have left out.
    pub fn next_optional(&mut self) -> Result<Option<W>> {
        self.0
            .next()
            .map(|(_, w)| w)
            .ok_or_else(|| Error::Config("tensor list exhausted".into()))
    }

    /// The next wanted tensor, which the file has.
    pub fn next_required(&mut self) -> Result<W> {
        match self.0.next() {
            Some((_, Some(w))) => Ok(w),
            Some((name, None)) => Err(Error::Config(format!("tensor {name} is missing"))),
            None => Err(Error::Config("tensor list exhausted".into())),
        }
    }
}

/// Check every wanted tensor's presence and shape first (a wrong file fails before any
/// weight is copied), then copy them one by one in the file's order (so a source reading
/// ahead reads on, never back), reporting progress in bytes.
pub async fn load_weights<B: Backend>(
    be: &mut B,
    g: &Gguf,
    src: &dyn ByteSource,
    wanted: &[Want],
    progress: Progress<'_>,
) -> Result<Weights<B::Weight>> {
    let mut infos: Vec<Option<&TensorInfo>> = Vec::with_capacity(wanted.len());
    for w in wanted {
        let info = match g.tensor(&w.name) {
            Some(info) => info,
            None if !w.required => {
                infos.push(None);
                continue;
            }
            None => return Err(Error::Config(format!("tensor {} is missing", w.name))),
        };
        if info.dims != w.dims {
            return Err(Error::Config(format!(
                "tensor {} has shape {:?}, expected {:?}",
                w.name, info.dims, w.dims
            )));
        }
        infos.push(Some(info));
    }
    let total: u64 = infos.iter().flatten().map(|t| t.n_bytes).sum();
    let mut done = 0u64;
    let mut order: Vec<usize> = (0..wanted.len()).collect();
    order.sort_by_key(|&i| infos[i].map_or(0, |t| t.offset));
    let mut loaded: Vec<Option<B::Weight>> =
        std::iter::repeat_with(|| None).take(wanted.len()).collect();
    for i in order {
        let (w, info) = (&wanted[i], infos[i]);
        loaded[i] = match info {
            Some(info) if info.ty == GgmlType::I8 && info.dims.len() == 2 => {
                // An int8 matrix with its scale and zero per row (convert/writer.rs, OutType::I8).
                let rows = info.dims[1] as usize;
                let scale = host_f32(g, src, &format!("{}.scale", info.name), &[rows])?;
                let zero = host_f32(g, src, &format!("{}.zero", info.name), &[rows])?;
                let weight = be.load_int8_weight(info, &scale, &zero, src)?;
                done += info.n_bytes;
                progress(done, total);
                Some(weight)
            }
            Some(info) => {
                let weight = be.load_weight_async(info, src, w.head).await?;
                done += info.n_bytes;
                progress(done, total);
                Some(weight)
            }
            None => None,
        };
    }
    let out: Vec<_> = wanted.iter().map(|w| w.name.clone()).zip(loaded).collect();
    Ok(Weights(out.into_iter()))
}

/// An F32 tensor of `dims` (ggml order) read on the host, every value finite.
pub fn host_f32(g: &Gguf, src: &dyn ByteSource, name: &str, dims: &[usize]) -> Result<Vec<f32>> {
    let info = g
        .tensor(name)
        .ok_or_else(|| Error::Config(format!("tensor {name} is missing")))?;
    let want: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
    if info.ty != GgmlType::F32 || info.dims != want {
        return Err(Error::Config(format!(
            "tensor {name} is {} {:?}, expected F32 {want:?}",
            info.ty, info.dims
        )));
    }
    let n: usize = dims.iter().product();
    let mut buf = vec![0u8; n * 4];
    src.read_at(info.offset, &mut buf)?;
    let v: Vec<f32> = buf
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    if v.iter().any(|x| !x.is_finite()) {
        return Err(Error::Config(format!(
            "tensor {name} holds a value that is not finite"
        )));
    }
    Ok(v)
}

/// A small F32 vector read on the host (Llama 3's `rope_freqs.weight`), if the file has it
/// with `len` values.
pub fn host_vector(
    g: &Gguf,
    src: &dyn ByteSource,
    name: &str,
    len: usize,
) -> Result<Option<Vec<f32>>> {
    if g.tensor(name).is_none() {
        return Ok(None);
    }
    let v = host_f32(g, src, name, &[len])?;
    if v.iter().any(|x| !x.is_finite() || *x <= 0.0) {
        return Err(Error::Config(format!(
            "tensor {name} holds a value that is not a positive number"
        )));
    }
    Ok(Some(v))
}
