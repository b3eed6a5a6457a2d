//! The model file as JS holds it (wasm only): a `Uint8Array`, or a `Blob` in a worker. The
//! byte sources the wasm surface hands the engine.

use std::cell::RefCell;

use js_sys::{Function, Promise, Reflect, Uint8Array};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

use super::source::{read_end, ByteSource, ReadFuture};
use crate::error::{Error, Result};

/// A model file held by JS.
pub struct JsBytes(pub Uint8Array);

impl ByteSource for JsBytes {
    fn len(&self) -> u64 {
        u64::from(self.0.length())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let len = self.len();
        let end = read_end(offset, buf.len(), len)?;
        // `subarray` clamps silently; the bounds were checked above.
        self.0.subarray(offset as u32, end as u32).copy_to(buf);
        Ok(())
    }
}

/// A model file in a `Blob` (a Cache API entry: on disk, not in the JS heap), read with
/// `FileReaderSync`, which exists in workers only. Reads go through a read-ahead window:
/// every `FileReaderSync` call is a round trip to the browser's blob store.
///
/// With a `readAhead(offset)` function (the package's: a second worker reads the file
/// window by window ahead of the load, through one byte stream into buffers given back once
/// the load has passed them), the asynchronous reads ([`ByteSource::read_at_async`]) take
/// their windows from it: the reading then runs beside the unpacking instead of before it.
/// A window given back is detached here (length 0): it is never read again, as the load
/// asks for the next window only past the end of the one it holds.
pub struct JsBlob {
    blob: web_sys::Blob,
    /// The window: its offset in the file and its bytes.
    window: RefCell<(u64, Window)>,
    /// `readAhead(offset)`: a promise of `{ start, bytes }`, the window (a `Uint8Array`)
    /// that holds `offset`.
    ahead: Option<Function>,
}

/// The bytes of a window: read here with `FileReaderSync`, or handed over by `readAhead`.
enum Window {
    Own(Vec<u8>),
    Js(Uint8Array),
}

impl Window {
    fn len(&self) -> u64 {
        match self {
            Self::Own(v) => v.len() as u64,
            Self::Js(a) => u64::from(a.length()),
        }
    }

    /// Copy the window's bytes from `at` into `out` (the caller checked the range).
    fn copy(&self, at: usize, out: &mut [u8]) {
        match self {
            Self::Own(v) => out.copy_from_slice(&v[at..at + out.len()]),
            Self::Js(a) => a.subarray(at as u32, (at + out.len()) as u32).copy_to(out),
        }
    }
}

/// Bytes per `FileReaderSync` read. Each read's `ArrayBuffer` is garbage until the worker's
/// next collection: reading a cached Gemma 3 270M through 1, 4, 16 and 64 MiB windows
/// peaked 124, 179, 172 and 302 MiB above the worker's start, in 0.64, 0.46, 0.38 and
/// 0.36 s (Chromium 156).
const BLOB_WINDOW: u64 = 4 << 20;

impl JsBlob {
    pub fn new(blob: web_sys::Blob) -> Self {
        Self {
            blob,
            window: RefCell::new((0, Window::Own(Vec::new()))),
            ahead: None,
        }
    }

    /// A blob whose asynchronous reads take their windows from `read_ahead` (see [`JsBlob`]).
    pub fn reading_ahead(blob: web_sys::Blob, read_ahead: Function) -> Self {
        Self {
            ahead: Some(read_ahead),
            ..Self::new(blob)
        }
    }

    /// The window `readAhead` holds for `pos`: its start and bytes, checked against the file.
    async fn window_at(&self, ahead: &Function, pos: u64) -> Result<(u64, Uint8Array)> {
        let io = |e: JsValue| Error::Io(format!("reading the stored model ahead: {e:?}"));
        let promise: Promise = ahead
            .call1(&JsValue::NULL, &JsValue::from_f64(pos as f64))
            .map_err(io)?
            .dyn_into()
            .map_err(io)?;
        let got = JsFuture::from(promise).await.map_err(io)?;
        let start = Reflect::get(&got, &"start".into())
            .map_err(io)?
            .as_f64()
            .unwrap_or(f64::NAN);
        let bytes: Uint8Array = Reflect::get(&got, &"bytes".into())
            .map_err(io)?
            .dyn_into()
            .map_err(io)?;
        let end = start + f64::from(bytes.length());
        let whole = start.fract() == 0.0;
        if !(whole
            && start >= 0.0
            && start <= pos as f64
            && end > pos as f64
            && end <= self.len() as f64)
        {
            return Err(Error::Io(format!(
                "reading the stored model ahead: a window of {} bytes at {start} for offset {pos}",
                bytes.length()
            )));
        }
        Ok((start as u64, bytes))
    }

    /// Read `out.len()` bytes from `start` (at most a window) into `out`, through one
    /// `ArrayBuffer`. (Detaching it with `transfer(0)` right after left more resident in
    /// Chromium 156, measured, than leaving it to the collector.)
    fn fetch_into(&self, start: u64, out: &mut [u8]) -> Result<()> {
        let end = start + out.len() as u64;
        let io = |e: JsValue| Error::Io(format!("reading the stored model: {e:?}"));
        let part = self
            .blob
            .slice_with_f64_and_f64(start as f64, end as f64)
            .map_err(io)?;
        let ab = web_sys::FileReaderSync::new()
            .map_err(io)?
            .read_as_array_buffer(&part)
            .map_err(io)?;
        let got = Uint8Array::new(&ab);
        if u64::from(got.length()) != end - start {
            return Err(Error::Io(format!(
                "reading the stored model: {} bytes instead of {}",
                got.length(),
                end - start
            )));
        }
        got.copy_to(out);
        Ok(())
    }
}

impl ByteSource for JsBlob {
    fn len(&self) -> u64 {
        self.blob.size() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let len = self.len();
        let end = read_end(offset, buf.len(), len)?;
        if end - offset > BLOB_WINDOW {
            // A large tensor (Gemma's 178 MB head) goes window by window straight into its
            // place: a staging buffer its size would raise wasm memory's high-water mark,
            // which never comes down.
            for (i, piece) in buf.chunks_mut(BLOB_WINDOW as usize).enumerate() {
                self.fetch_into(offset + i as u64 * BLOB_WINDOW, piece)?;
            }
            return Ok(());
        }
        let mut w = self.window.borrow_mut();
        if offset < w.0 || end > w.0 + w.1.len() {
            // The window's buffer is reused when it is this side's.
            let mut bytes = match std::mem::replace(&mut w.1, Window::Own(Vec::new())) {
                Window::Own(v) => v,
                Window::Js(_) => Vec::new(),
            };
            bytes.resize(((offset + BLOB_WINDOW).min(len) - offset) as usize, 0);
            self.fetch_into(offset, &mut bytes)?;
            *w = (offset, Window::Own(bytes));
        }
        w.1.copy((offset - w.0) as usize, buf);
        Ok(())
    }

    fn release(&self) {
        *self.window.borrow_mut() = (0, Window::Own(Vec::new()));
    }

    fn read_at_async<'a>(&'a self, offset: u64, buf: &'a mut [u8]) -> ReadFuture<'a> {
        Box::pin(async move {
            let Some(ahead) = &self.ahead else {
                return self.read_at(offset, buf);
            };
            read_end(offset, buf.len(), self.len())?;
            // Piece by piece through the windows that hold them; no borrow across an await.
            let mut done = 0;
            while done < buf.len() {
                let pos = offset + done as u64;
                let held = {
                    let w = self.window.borrow();
                    (pos >= w.0 && pos < w.0 + w.1.len()).then(|| {
                        let at = (pos - w.0) as usize;
                        let n = (buf.len() - done).min((w.1.len() - (pos - w.0)) as usize);
                        w.1.copy(at, &mut buf[done..done + n]);
                        n
                    })
                };
                match held {
                    Some(n) => done += n,
                    None => {
                        let (start, bytes) = self.window_at(ahead, pos).await?;
                        *self.window.borrow_mut() = (start, Window::Js(bytes));
                    }
                }
            }
            Ok(())
        })
    }
}
