//! The wasm-bindgen boundary: conversions only, no logic. The model file stays in a JS
//! `Uint8Array` outside wasm memory; each tensor is copied once from it into its final place.

use crate::error::{Error, Result};
use crate::gguf::ByteSource;

/// A model file held by JS.
pub struct JsBytes(pub js_sys::Uint8Array);

impl ByteSource for JsBytes {
    fn len(&self) -> u64 {
        u64::from(self.0.length())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let len = self.len();
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= len)
            .ok_or_else(|| {
                Error::Gguf(format!(
                    "read of {} bytes at {offset} passes the end of the file ({len} bytes)",
                    buf.len()
                ))
            })?;
        // `subarray` clamps silently; the bounds were checked above.
        self.0.subarray(offset as u32, end as u32).copy_to(buf);
        Ok(())
    }
}
