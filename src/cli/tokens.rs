//! `kerze tokenize` (a text's token ids) and `kerze logits` (the teacher-forced top
//! candidates per position of given ids).

use super::load::{load, log, ModelArgs};
use crate::gguf::Gguf;
use crate::{catalog, Result};
use std::io::Read;

#[derive(clap::Args, Debug)]
pub(super) struct TokenizeArgs {
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
pub(super) struct LogitsArgs {
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

pub(super) fn cmd_tokenize(a: &TokenizeArgs) -> Result<()> {
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

pub(super) fn cmd_logits(a: &LogitsArgs) -> Result<()> {
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
