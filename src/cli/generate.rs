//! `kerze generate` (a prompt continued) and `kerze chat` (a conversation through the
//! model's chat template), with the sampling and constraint flags they share.

use super::load::{load, never, ModelArgs};
use crate::{Error, GenerateOptions, Result, SamplerConfig};
use std::io::Write;

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
pub(super) struct GenerateArgs {
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
pub(super) struct ChatArgs {
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
        // Sampled without --seed: a fresh one, which the output reports (`seed`).
        seed: a.seed.unwrap_or_else(|| {
            if a.temperature.unwrap_or(d.temperature) > 0.0 {
                crate::rng::fresh_seed()
            } else {
                d.seed
            }
        }),
    }
}

/// The seed to report: a sampled generation's (greedy needs none).
fn reported_seed(s: &SamplerConfig) -> Option<u64> {
    (s.temperature > 0.0).then_some(s.seed)
}

pub(super) fn cmd_generate(a: &GenerateArgs) -> Result<()> {
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
        if let Some(seed) = reported_seed(&opts.sampler) {
            v["seed"] = seed.into();
        }
        println!("{v}");
    } else {
        println!();
        for c in g.usage.choices.iter().flatten() {
            eprintln!("{:>6.1}%  {}", 100.0 * c.prob, c.choice);
        }
        let seed = reported_seed(&opts.sampler).map_or(String::new(), |s| format!("; seed {s}"));
        eprintln!(
            "[{} prompt tokens, {:.1} tok/s prefill; {} tokens, {:.1} tok/s decode{seed}]",
            g.usage.prompt_tokens,
            g.usage.prefill_tokens_per_s,
            g.usage.completion_tokens,
            g.usage.decode_tokens_per_s
        );
    }
    Ok(())
}

pub(super) fn cmd_chat(a: &ChatArgs) -> Result<()> {
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
        let mut v = serde_json::json!({
            "prompt_ids": prompt_ids,
            "ids": g.generated(),
            "content": content,
            "reasoning_content": reasoning,
            "finish_reason": g.finish(),
            "usage": g.usage,
        });
        if let Some(seed) = reported_seed(&gen.sampler) {
            v["seed"] = seed.into();
        }
        println!("{v}");
    } else {
        println!();
        if let Some(seed) = reported_seed(&gen.sampler) {
            eprintln!("[seed {seed}]");
        }
    }
    Ok(())
}
