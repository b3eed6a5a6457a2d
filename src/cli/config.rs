//! `kerze serve --config FILE`: a TOML file that sets any of `serve`'s flags and declares the
//! gateway's `[[upstream]]` tables.
//!
//! A top-level key is a flag's long name with `_` for `-` (`response_cache_mb = 128`,
//! `cors_origin = ["https://a.example"]`, `prepare_constraints = true`). The file's flags go
//! before the command line's, so a flag given there wins. An unknown key, a value of the
//! wrong type, or a secret in the file (`api_key`: give `$KERZE_API_KEY`) stops the process
//! with the file, the line and the known keys. The upstream tables are read by serde
//! (`deny_unknown_fields`), whose errors name the line and the known keys too.

use crate::server::upstream::UpstreamConfig;
use clap::ArgAction;
use std::ffi::OsString;
use std::path::Path;

/// Keys that hold secrets: refused in the file.
const SECRETS: [&str; 1] = ["api_key"];

/// The line (from 1) of a byte offset.
fn line_of(src: &str, at: usize) -> usize {
    src[..at.min(src.len())].matches('\n').count() + 1
}

/// The `--config` value in `serve`'s arguments, if any.
fn config_path(args: &[OsString]) -> Option<OsString> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        if s == "--config" {
            return it.next().cloned();
        }
        if let Some(v) = s.strip_prefix("--config=") {
            return Some(v.into());
        }
        if s == "--" {
            break;
        }
    }
    None
}

/// The process's arguments with a `serve --config FILE`'s flags put in after `serve`; other
/// commands' arguments as they are. `serve` is the clap command that knows the flags.
pub(super) fn expand(args: Vec<OsString>, serve: &clap::Command) -> Result<Vec<OsString>, String> {
    if args.get(1).is_none_or(|a| a != "serve") {
        return Ok(args);
    }
    let Some(path) = config_path(&args[2..]) else {
        return Ok(args);
    };
    let flags = flags_of(Path::new(&path), serve)?;
    let mut out = args[..2].to_vec();
    out.extend(flags);
    out.extend_from_slice(&args[2..]);
    Ok(out)
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path)
        .map_err(|e| format!("the config file {} cannot be read: {e}", path.display()))
}

/// The flags a config file sets, as arguments.
fn flags_of(path: &Path, serve: &clap::Command) -> Result<Vec<OsString>, String> {
    let src = read(path)?;
    let file = path.display();
    let table = toml::de::DeTable::parse(&src)
        .map_err(|e| format!("the config file {file} is not valid TOML: {e}"))?;
    let args: Vec<&clap::Arg> = serve
        .get_arguments()
        .filter(|a| {
            a.get_long()
                .is_some_and(|l| !matches!(l, "help" | "config"))
        })
        .collect();
    let key_of = |a: &clap::Arg| a.get_long().unwrap_or("").replace('-', "_");
    let mut known: Vec<String> = args.iter().map(|a| key_of(a)).collect();
    known.retain(|k| !SECRETS.contains(&k.as_str()));
    known.push("upstream".into());
    known.sort();
    let mut out = Vec::new();
    for (key, value) in table.get_ref().iter() {
        let k = key.get_ref().as_ref();
        let line = line_of(&src, key.span().start);
        if k == "upstream" {
            continue;
        }
        if SECRETS.contains(&k) {
            return Err(format!(
                "{file}, line {line}: `{k}` is a secret and does not go in the file: set $KERZE_API_KEY"
            ));
        }
        let Some(arg) = args.iter().find(|a| key_of(a) == k) else {
            return Err(format!(
                "{file}, line {line}: unknown key `{k}`; the known keys are: {}",
                known.join(", ")
            ));
        };
        let long = format!("--{}", arg.get_long().unwrap_or(""));
        let bad = |want: &str| format!("{file}, line {line}: `{k}` wants {want}");
        use toml::de::DeValue;
        let scalar = |v: &DeValue| -> Option<String> {
            match v {
                DeValue::String(s) => Some(s.to_string()),
                DeValue::Integer(i) => Some(i.as_str().to_string()),
                DeValue::Float(f) => Some(f.as_str().to_string()),
                DeValue::Boolean(b) => Some(b.to_string()),
                _ => None,
            }
        };
        match arg.get_action() {
            ArgAction::SetTrue => match value.get_ref() {
                DeValue::Boolean(true) => out.push(long.into()),
                DeValue::Boolean(false) => {}
                _ => return Err(bad("true or false")),
            },
            ArgAction::Append => {
                let items: Vec<String> = match value.get_ref() {
                    DeValue::Array(a) => a
                        .iter()
                        .map(|v| scalar(v.get_ref()))
                        .collect::<Option<_>>()
                        .ok_or_else(|| bad("a list of strings"))?,
                    v => vec![scalar(v).ok_or_else(|| bad("a string or a list of strings"))?],
                };
                for i in items {
                    out.push(format!("{long}={i}").into());
                }
            }
            _ => {
                let v = scalar(value.get_ref()).ok_or_else(|| bad("a string or a number"))?;
                out.push(format!("{long}={v}").into());
            }
        }
    }
    Ok(out)
}

/// The `[[upstream]]` tables of a config file.
pub(super) fn upstreams(path: &Path) -> Result<Vec<UpstreamConfig>, String> {
    #[derive(serde::Deserialize)]
    struct File {
        #[serde(default)]
        upstream: Vec<UpstreamConfig>,
    }
    let src = read(path)?;
    toml::from_str::<File>(&src)
        .map(|f| f.upstream)
        .map_err(|e| format!("the config file {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_numbers() {
        assert_eq!(line_of("a\nb\nc", 0), 1);
        assert_eq!(line_of("a\nb\nc", 2), 2);
        assert_eq!(line_of("a\nb\nc", 4), 3);
    }

    #[test]
    fn config_flag() {
        let a = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            config_path(&a(&["--port", "1", "--config", "x.toml"])),
            Some("x.toml".into())
        );
        assert_eq!(config_path(&a(&["--config=y.toml"])), Some("y.toml".into()));
        assert_eq!(config_path(&a(&["--port", "1"])), None);
    }
}
