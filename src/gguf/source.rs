//! Where a model file's bytes come from: [`ByteSource`] (a slice in memory, a file natively;
//! the browser's in `js.rs`), reads that may wait, and running a load whose reads never do
//! ([`SyncReads`], [`now`]).

use crate::error::{Error, Result};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// Random access to the bytes of a model file: a slice in memory, a file natively, a JS
/// `Uint8Array` in the browser. Tensors are copied out of it once, into their final place.
pub trait ByteSource {
    /// Length of the whole file in bytes.
    fn len(&self) -> u64;
    /// Fill `buf` with the bytes at `offset..offset + buf.len()`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()>;
    /// True when the file is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Drop read-ahead buffers: the source is kept but idle (a GPU engine's fall-back).
    fn release(&self) {}
    /// [`ByteSource::read_at`] as a read that may wait: a browser's stored file is read ahead
    /// on another thread while the weights already read are unpacked. Only the asynchronous
    /// load ([`crate::model::load_weights`]) awaits it; by default it is the plain read.
    fn read_at_async<'a>(&'a self, offset: u64, buf: &'a mut [u8]) -> ReadFuture<'a> {
        Box::pin(std::future::ready(self.read_at(offset, buf)))
    }
}

/// What [`ByteSource::read_at_async`] returns.
pub type ReadFuture<'a> = Pin<Box<dyn Future<Output = Result<()>> + 'a>>;

/// A source whose reads never wait (its [`ByteSource::read_at_async`] is the plain read):
/// what the synchronous loads hand down, run by [`now`].
pub struct SyncReads<'a>(pub &'a dyn ByteSource);

impl ByteSource for SyncReads<'_> {
    fn len(&self) -> u64 {
        self.0.len()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.0.read_at(offset, buf)
    }
    fn release(&self) {
        self.0.release()
    }
}

/// The value of a load over [`SyncReads`], whose every read is done when asked, so the
/// future is ready at its first poll. One that waits anyway is an error, never a hang.
pub fn now<F: Future>(f: F) -> Result<F::Output> {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => Ok(v),
        Poll::Pending => Err(Error::Backend(
            "a synchronous load met a read that waits".into(),
        )),
    }
}

/// The end of a read of `n` bytes at `offset` in a file of `len` bytes, or the error that
/// names it when it passes the end.
pub fn read_end(offset: u64, n: usize, len: u64) -> Result<u64> {
    offset
        .checked_add(n as u64)
        .filter(|&e| e <= len)
        .ok_or_else(|| {
            Error::Gguf(format!(
                "read of {n} bytes at {offset} passes the end of the file ({len} bytes)"
            ))
        })
}

impl ByteSource for [u8] {
    fn len(&self) -> u64 {
        <[u8]>::len(self) as u64
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let start =
            usize::try_from(offset).map_err(|_| Error::Gguf("offset out of range".into()))?;
        let src = start
            .checked_add(buf.len())
            .and_then(|end| self.get(start..end))
            .ok_or_else(|| {
                Error::Gguf(format!(
                    "read of {} bytes at {offset} passes the end of the file ({} bytes)",
                    buf.len(),
                    <[u8]>::len(self)
                ))
            })?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

impl ByteSource for &[u8] {
    fn len(&self) -> u64 {
        <[u8]>::len(self) as u64
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        (**self).read_at(offset, buf)
    }
}

impl ByteSource for Vec<u8> {
    fn len(&self) -> u64 {
        self.as_slice().len() as u64
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.as_slice().read_at(offset, buf)
    }
}

/// A model file on disk, read tensor by tensor (native only).
#[cfg(not(target_arch = "wasm32"))]
pub struct FileSource {
    file: std::fs::File,
    len: u64,
}

#[cfg(not(target_arch = "wasm32"))]
impl FileSource {
    /// Open `path`.
    pub fn open(path: &std::path::Path) -> Result<Self> {
        let file = std::fs::File::open(path)
            .map_err(|e| Error::Model(format!("cannot open {}: {e}", path.display())))?;
        let len = file.metadata()?.len();
        Ok(Self { file, len })
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl ByteSource for FileSource {
    fn len(&self) -> u64 {
        self.len
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileExt;
            self.file.read_exact_at(buf, offset)?;
        }
        #[cfg(not(unix))]
        {
            use std::io::{Read, Seek, SeekFrom};
            let mut f = &self.file;
            f.seek(SeekFrom::Start(offset))?;
            f.read_exact(buf)?;
        }
        Ok(())
    }
}
