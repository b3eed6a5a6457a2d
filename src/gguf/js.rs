//! The model file as JS holds it (wasm only): a `Uint8Array`, or a `Blob` in a worker. The
//! byte sources the wasm surface hands the engine.

use std::cell::RefCell;

use js_sys::Uint8Array;
use wasm_bindgen::JsValue;

use super::{read_end, ByteSource};
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
pub struct JsBlob {
    blob: web_sys::Blob,
    /// The window: its offset in the file and its bytes.
    window: RefCell<(u64, Vec<u8>)>,
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
            window: RefCell::new((0, Vec::new())),
        }
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
        let (w_start, w_bytes) = &mut *w;
        if offset < *w_start || end > *w_start + w_bytes.len() as u64 {
            w_bytes.resize(((offset + BLOB_WINDOW).min(len) - offset) as usize, 0);
            self.fetch_into(offset, w_bytes)?;
            *w_start = offset;
        }
        let at = (offset - *w_start) as usize;
        buf.copy_from_slice(&w_bytes[at..at + buf.len()]);
        Ok(())
    }

    fn release(&self) {
        *self.window.borrow_mut() = (0, Vec::new());
    }
}
