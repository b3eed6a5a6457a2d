//! The `kerze` command line (native only): the same engine as the browser, for scripts,
//! tests and benchmarks. `src/bin/kerze.rs` calls [`main`].

use crate::gguf::{FileSource, Gguf, Value};
use crate::{catalog, Engine, Error, GenerateOptions, LoadOptions, Result, SamplerConfig};
use std::collections::HashMap;
use std::io::{Read, Write};

const USAGE: &str = "kerze — small language models from GGUF, on the CPU or a GPU

usage:
  kerze fetch [MODEL]                        fetch a catalog model into models/ (default gemma-3-270m)
  kerze generate --model M --prompt TEXT [--max-tokens N] [--temperature T] [--top-k K]
                 [--top-p P] [--min-p P] [--repeat-penalty R] [--seed S] [--stop STR]... [--json]
  kerze tokenize --model M [--text TEXT] [--json]   (reads stdin without --text; control tokens parsed)
  kerze logits   --model M --ids 2,818,5279 [--top K] [--json]   teacher-forced top-K per position
  kerze bench    --model M [--prompt-tokens 128] [--gen-tokens 64] [--json]
  kerze inspect  --model M [--json]
  kerze synth    --family llama|qwen2|qwen3|gemma3 --out FILE [--tokenizer spm|gpt2] [--quant Q8_0]
                 a tiny synthetic model (random weights) for tests and demos;
                 --like qwen2.5-0.5b-q4_k_m --vocab TOKENIZER.JSON: real dimensions, layout and vocabulary

MODEL is a catalog id (gemma-3-270m, smollm2-135m-instruct) or a path to a .gguf file. --n-ctx N sets the context;
--device cpu (default) | webgpu | auto runs on the CPU or a GPU (Vulkan; built with --features gpu).";

struct Args {
    flags: HashMap<String, Vec<String>>,
    switches: Vec<String>,
    positional: Vec<String>,
}

const SWITCHES: &[&str] = &["json", "help"];

impl Args {
    fn parse(raw: Vec<String>) -> Result<Self> {
        let mut a = Args {
            flags: HashMap::new(),
            switches: Vec::new(),
            positional: Vec::new(),
        };
        let mut it = raw.into_iter();
        while let Some(x) = it.next() {
            if let Some(name) = x.strip_prefix("--") {
                if SWITCHES.contains(&name) {
                    a.switches.push(name.to_string());
                } else {
                    let v = it
                        .next()
                        .ok_or_else(|| Error::InvalidArgument(format!("--{name} needs a value")))?;
                    a.flags.entry(name.to_string()).or_default().push(v);
                }
            } else {
                a.positional.push(x);
            }
        }
        Ok(a)
    }
    fn get(&self, k: &str) -> Option<&str> {
        self.flags.get(k).and_then(|v| v.last()).map(String::as_str)
    }
    fn all(&self, k: &str) -> Vec<String> {
        self.flags.get(k).cloned().unwrap_or_default()
    }
    fn has(&self, k: &str) -> bool {
        self.switches.iter().any(|s| s == k)
    }
    fn num<T: std::str::FromStr>(&self, k: &str, default: T) -> Result<T> {
        match self.get(k) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| Error::InvalidArgument(format!("--{k} {v} is not a valid number"))),
        }
    }
    fn need(&self, k: &str) -> Result<&str> {
        self.get(k)
            .ok_or_else(|| Error::InvalidArgument(format!("--{k} is required")))
    }
}

fn log(s: &str) {
    eprintln!("{s}");
}

fn load(a: &Args) -> Result<(Engine, crate::EngineInfo)> {
    let path = catalog::resolve(a.need("model")?, &mut |s| log(s))?;
    let src = FileSource::open(&path)?;
    let n_ctx = match a.get("n-ctx") {
        Some(_) => Some(a.num("n-ctx", 0usize)?),
        None => None,
    };
    let device = match a.get("device").unwrap_or("cpu") {
        "auto" => crate::engine::Device::Auto,
        "cpu" => crate::engine::Device::Cpu,
        "webgpu" | "gpu" => crate::engine::Device::Webgpu,
        other => {
            return Err(Error::InvalidArgument(format!(
                "--device {other}: use auto, cpu or webgpu"
            )))
        }
    };
    pollster::block_on(Engine::load_async(
        Box::new(src),
        &LoadOptions { device, n_ctx },
        &mut |_, _| {},
    ))
}

fn sampler(a: &Args) -> Result<SamplerConfig> {
    let d = SamplerConfig::default();
    Ok(SamplerConfig {
        temperature: a.num("temperature", d.temperature)?,
        top_k: a.num("top-k", d.top_k)?,
        top_p: a.num("top-p", d.top_p)?,
        min_p: a.num("min-p", d.min_p)?,
        repetition_penalty: a.num("repeat-penalty", d.repetition_penalty)?,
        presence_penalty: a.num("presence-penalty", d.presence_penalty)?,
        penalty_last_n: a.num("penalty-last-n", d.penalty_last_n)?,
        seed: a.num("seed", d.seed)?,
    })
}

fn never() -> bool {
    false
}

fn cmd_generate(a: &Args) -> Result<()> {
    let (mut engine, _) = load(a)?;
    let prompt = a.need("prompt")?;
    let opts = GenerateOptions {
        max_tokens: a.num("max-tokens", 64)?,
        sampler: sampler(a)?,
        stop: a.all("stop"),
        stop_tokens: None,
    };
    let prompt_ids = engine.tokenizer().encode_user(prompt, true)?;
    let json = a.has("json");
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
        let v = serde_json::json!({
            "prompt_ids": prompt_ids,
            "ids": g.generated(),
            "text": text,
            "finish_reason": g.finish,
            "prefill_tokens_per_s": g.usage.prefill_tokens_per_s,
            "decode_tokens_per_s": g.usage.decode_tokens_per_s,
            "usage": g.usage,
        });
        println!("{v}");
    } else {
        println!();
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

fn read_text(a: &Args) -> Result<String> {
    match a.get("text") {
        Some(t) => Ok(t.to_string()),
        None => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s)?;
            Ok(s)
        }
    }
}

fn cmd_tokenize(a: &Args) -> Result<()> {
    let path = catalog::resolve(a.need("model")?, &mut |s| log(s))?;
    let g = Gguf::read(&FileSource::open(&path)?)?;
    let tok = crate::Tokenizer::from_gguf(&g)?;
    let ids = tok.encode_raw(&read_text(a)?, true)?;
    if a.has("json") {
        println!("{}", serde_json::json!({ "ids": ids }));
    } else {
        for id in ids {
            println!("{id}\t{:?}", tok.token(id).unwrap_or_default());
        }
    }
    Ok(())
}

fn cmd_logits(a: &Args) -> Result<()> {
    let ids: Vec<u32> = a
        .need("ids")?
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .map_err(|_| Error::InvalidArgument(format!("--ids: `{s}` is not a token id")))
        })
        .collect::<Result<_>>()?;
    let k = a.num("top", 10usize)?;
    let (mut engine, _) = load(a)?;
    let top = pollster::block_on(engine.logits_top_k(&ids, k, 0))?;
    if a.has("json") {
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

fn cmd_bench(a: &Args) -> Result<()> {
    let n_prompt = a.num("prompt-tokens", 128usize)?;
    let n_gen = a.num("gen-tokens", 64usize)?;
    let t0 = std::time::Instant::now();
    let (mut engine, info) = load(a)?;
    let load_s = t0.elapsed().as_secs_f64();
    let ids = engine.tokenizer().bench_prompt(n_prompt)?;
    let opts = GenerateOptions::greedy_tokens(n_gen);
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
        }),
        _ => serde_json::Value::Null,
    };
    let rss = peak_rss_mb();
    let v = serde_json::json!({
        "gpu_per_decode_step": per_step,
        "backend": info.backend,
        "threads": std::env::var("CANDLE_NUM_THREADS").unwrap_or_else(|_| "default".into()),
        "prompt_tokens": g.usage.prompt_tokens,
        "gen_tokens": g.usage.completion_tokens,
        "prefill_tokens_per_s": g.usage.prefill_tokens_per_s,
        "decode_tokens_per_s": g.usage.decode_tokens_per_s,
        "load_s": load_s,
        "tokenizer_ms": info.tokenizer_ms,
        "peak_rss_mb": rss,
    });
    if a.has("json") {
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

fn cmd_synth(a: &Args) -> Result<()> {
    if let Some(like) = a.get("like") {
        if like != "qwen2.5-0.5b-q4_k_m" {
            return Err(Error::InvalidArgument(format!(
                "--like {like}: qwen2.5-0.5b-q4_k_m"
            )));
        }
        let json = std::fs::read(a.need("vocab")?)?;
        let bytes = crate::synth::qwen25_05b_like(&json)?;
        let out = a.need("out")?;
        std::fs::write(out, &bytes)?;
        println!("{out}");
        return Ok(());
    }
    let family = crate::config::Family::from_arch(a.need("family")?)?;
    let byte_level = match a.get("tokenizer").unwrap_or("spm") {
        "spm" => false,
        "gpt2" => true,
        other => {
            return Err(Error::InvalidArgument(format!(
                "--tokenizer {other}: spm or gpt2"
            )))
        }
    };
    let quant = a.get("quant").unwrap_or("Q8_0");
    let ty = (0..40)
        .filter_map(crate::GgmlType::from_id)
        .find(|t| t.name() == quant)
        .ok_or_else(|| Error::InvalidArgument(format!("--quant {quant} is not a ggml type")))?;
    let bytes =
        crate::synth::tiny_decoder_with(family, crate::synth::Quants::all(ty), 7, byte_level)?;
    let out = a.need("out")?;
    std::fs::write(out, &bytes)?;
    println!("{out}");
    Ok(())
}

fn cmd_inspect(a: &Args) -> Result<()> {
    let path = catalog::resolve(a.need("model")?, &mut |s| log(s))?;
    let g = Gguf::read(&FileSource::open(&path)?)?;
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
        "file": path.display().to_string(),
        "bytes": g.file_len,
        "version": g.version,
        "tensors": g.tensors.len(),
        "tensor_types": types.iter().map(|(k, (n, b))| (k.clone(), serde_json::json!({"count": n, "bytes": b}))).collect::<serde_json::Map<_, _>>(),
        "config": cfg,
        "metadata": meta,
    });
    if a.has("json") {
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

fn cmd_fetch(a: &Args) -> Result<()> {
    let id = a
        .positional
        .get(1)
        .map(String::as_str)
        .unwrap_or("gemma-3-270m");
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

/// Run the CLI with the process's arguments; exits non-zero on error.
pub fn main() {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let result = Args::parse(raw).and_then(|a| {
        let cmd = a.positional.first().cloned().unwrap_or_default();
        match cmd.as_str() {
            "fetch" => cmd_fetch(&a),
            "generate" => cmd_generate(&a),
            "tokenize" => cmd_tokenize(&a),
            "logits" => cmd_logits(&a),
            "bench" => cmd_bench(&a),
            "inspect" => cmd_inspect(&a),
            "synth" => cmd_synth(&a),
            _ if a.has("help") || cmd.is_empty() || cmd == "help" => {
                println!("{USAGE}");
                Ok(())
            }
            other => Err(Error::InvalidArgument(format!(
                "unknown command `{other}`\n\n{USAGE}"
            ))),
        }
    });
    if let Err(e) = result {
        eprintln!("kerze: {} ({})", e, e.kind());
        std::process::exit(match e {
            Error::InvalidArgument(_) => 2,
            _ => 1,
        });
    }
}
