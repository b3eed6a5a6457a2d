//! `kerze bench`: prefill and decode tokens/s of a decoder, sentences/s of an encoder, with
//! the GPU's counters per decode step, peak memory and, asked for, the memory read rate.

use super::load::{load, log, never, ModelArgs};
use crate::gguf::Gguf;
use crate::{catalog, Engine, Error, GenerateOptions, Result, SamplerConfig};

#[derive(clap::Args, Debug)]
pub(super) struct BenchArgs {
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

pub(super) fn cmd_bench(a: &BenchArgs) -> Result<()> {
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
        let step_mb =
            crate::engine::cpu_step_bytes(&gguf, engine.config(), info.activations == "8-bit")
                as f64
                / 1e6;
        let file_mb = crate::engine::file_step_bytes(&gguf, engine.config()) as f64 / 1e6;
        let gb_per_s = crate::cpu::read_rate_gb_per_s(512);
        serde_json::json!({
            "gb_per_s": gb_per_s,
            "weights_mb_per_decode_step": step_mb,
            // The same tensors as the file holds them: the step reads step_mb / file_mb of it.
            "file_mb_per_decode_step": file_mb,
            "activations": info.activations,
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
