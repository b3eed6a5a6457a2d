//! The one error type of the crate. Every message names the cause and, where there is one,
//! the remedy. `kind()` is the stable name JS sees as `Error.name`.

/// At most `max` bytes of `s` for a message (a name read from a file, which a hostile one
/// can make megabytes long), cut at a character boundary and marked with `…`.
pub fn excerpt(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Everything that can go wrong, from bytes to tokens.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bytes are not a GGUF file, or the file is truncated or corrupt.
    #[error("invalid GGUF: {0}")]
    Gguf(String),
    /// The bytes are not an ONNX model kerze can read: truncated, corrupt, or past its limits.
    #[error("invalid ONNX: {0}")]
    Onnx(String),
    /// A well-formed file for an architecture this build does not run.
    #[error("unsupported architecture `{arch}`: kerze runs {supported}")]
    UnsupportedArch {
        arch: String,
        supported: &'static str,
    },
    /// A tensor stored in a type there is no kernel for.
    #[error(
        "tensor {tensor} has type {ty}, which kerze does not run: supported types are {supported}"
    )]
    UnsupportedTensorType {
        tensor: String,
        ty: String,
        supported: &'static str,
    },
    /// The model does not fit where it would run (wasm's 4 GiB memory), found before any
    /// weight is read.
    #[error("the model needs {need_mb} MB {what}, more than the {limit_mb} MB there are: pick a smaller or more strongly quantized file, or a smaller n_ctx")]
    ModelTooLarge {
        need_mb: u64,
        limit_mb: u64,
        what: &'static str,
    },
    /// Metadata or tensor shapes that contradict each other or are out of range.
    #[error("invalid model: {0}")]
    Config(String),
    /// Building or using the tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The sequence would pass the context window.
    #[error("context full: {needed} tokens needed, the context holds {n_ctx}; shorten the prompt, lower max tokens, or load with a larger n_ctx")]
    ContextFull { needed: usize, n_ctx: usize },
    /// Options out of range (temperature < 0, top_p outside (0, 1], ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A generation stopped because its abort signal fired.
    #[error("aborted")]
    Aborted,
    /// The model could not be found or fetched.
    #[error("model: {0}")]
    Model(String),
    /// The compute backend failed (candle, or later the GPU).
    #[error("backend: {0}")]
    Backend(String),
    /// The GPU device was lost or reported an error: what the engine ran there is void. The
    /// engine itself recovers onto the CPU; callers see this only when that is impossible.
    #[error("GPU device: {0}")]
    Device(String),
    /// File system or process I/O (native only).
    #[error("io: {0}")]
    Io(String),
    /// A saved prompt prefix (its keys and values) that is truncated, corrupt, or made by
    /// another model, engine version or backend: the caller drops it and computes the prefix.
    #[error("prefix snapshot: {0}")]
    Snapshot(String),
}

impl Error {
    /// Every name [`Error::kind`] gives, in the order of the variants. The package adds its
    /// own (downloads, the worker) after these in `pkg/protocol.js` `ERROR_NAMES`, and
    /// `pkg/index.d.ts` lists the same: `tests/error_names.rs` checks the three agree.
    pub const KINDS: &'static [&'static str] = &[
        "GgufError",
        "OnnxError",
        "UnsupportedArchError",
        "UnsupportedTensorTypeError",
        "ModelTooLargeError",
        "ModelConfigError",
        "TokenizerError",
        "ContextFullError",
        "InvalidArgumentError",
        "AbortError",
        "ModelError",
        "BackendError",
        "DeviceError",
        "IoError",
        "SnapshotError",
    ];

    /// The error's numbers and names beyond its message, camelCase, for JS to carry
    /// (`ContextFullError`: `{ needed, nCtx }`).
    pub fn fields(&self) -> Vec<(&'static str, serde_json::Value)> {
        use serde_json::json;
        match self {
            Error::ContextFull { needed, n_ctx } => {
                vec![("needed", json!(needed)), ("nCtx", json!(n_ctx))]
            }
            Error::ModelTooLarge {
                need_mb, limit_mb, ..
            } => vec![("needMb", json!(need_mb)), ("limitMb", json!(limit_mb))],
            Error::UnsupportedTensorType { tensor, ty, .. } => {
                vec![("tensor", json!(tensor)), ("tensorType", json!(ty))]
            }
            Error::UnsupportedArch { arch, .. } => vec![("arch", json!(arch))],
            _ => Vec::new(),
        }
    }

    /// A stable, short name of the kind, used as the JS `Error.name`.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Gguf(_) => "GgufError",
            Error::Onnx(_) => "OnnxError",
            Error::UnsupportedArch { .. } => "UnsupportedArchError",
            Error::UnsupportedTensorType { .. } => "UnsupportedTensorTypeError",
            Error::ModelTooLarge { .. } => "ModelTooLargeError",
            Error::Config(_) => "ModelConfigError",
            Error::Tokenizer(_) => "TokenizerError",
            Error::ContextFull { .. } => "ContextFullError",
            Error::InvalidArgument(_) => "InvalidArgumentError",
            Error::Aborted => "AbortError",
            Error::Model(_) => "ModelError",
            Error::Backend(_) => "BackendError",
            Error::Device(_) => "DeviceError",
            Error::Io(_) => "IoError",
            Error::Snapshot(_) => "SnapshotError",
        }
    }
}

impl From<candle_core::Error> for Error {
    fn from(e: candle_core::Error) -> Self {
        Error::Backend(e.to_string())
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e.to_string())
    }
}

/// `Result` with the crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_listed() {
        let all = [
            Error::Gguf(String::new()),
            Error::Onnx(String::new()),
            Error::UnsupportedArch {
                arch: String::new(),
                supported: "",
            },
            Error::UnsupportedTensorType {
                tensor: String::new(),
                ty: String::new(),
                supported: "",
            },
            Error::ModelTooLarge {
                need_mb: 0,
                limit_mb: 0,
                what: "",
            },
            Error::Config(String::new()),
            Error::Tokenizer(String::new()),
            Error::ContextFull {
                needed: 9,
                n_ctx: 8,
            },
            Error::InvalidArgument(String::new()),
            Error::Aborted,
            Error::Model(String::new()),
            Error::Backend(String::new()),
            Error::Device(String::new()),
            Error::Io(String::new()),
            Error::Snapshot(String::new()),
        ];
        let kinds: Vec<&str> = all.iter().map(Error::kind).collect();
        assert_eq!(kinds, Error::KINDS);
        let f = Error::ContextFull {
            needed: 9,
            n_ctx: 8,
        }
        .fields();
        assert_eq!(f, [("needed", 9.into()), ("nCtx", 8.into())]);
    }
}
