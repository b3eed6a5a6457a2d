//! Building a [`Tokenizer`] from a GGUF's own vocabulary: SentencePiece-style (`llama`:
//! merges derived from the scores, byte fallback), GPT-2 byte-level BPE (`gpt2`: merges in
//! the file, the pre-tokenizer chosen by `tokenizer.ggml.pre`) and WordPiece (`bert`).

use super::bpe::{score_order, GgufBpe, Vocab};
use super::encoding::Tokenizer;
use super::pipeline::{tk_err, Bits, Impl, SPACE};
use super::wordpiece;
use crate::error::{Error, Result};
use crate::gguf::{Gguf, Value};
use std::sync::Mutex;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::normalizers::prepend::Prepend;
use tokenizers::normalizers::replace::Replace;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::normalizers::utils::Sequence as NormalizerSequence;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, DecoderWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

/// The BPE pipelines built from GGUF vocabularies.
type Pipeline = Impl<GgufBpe>;

/// SentencePiece token types as GGUF stores them.
const TYPE_NORMAL: i64 = 1;
const TYPE_UNKNOWN: i64 = 2;
const TYPE_CONTROL: i64 = 3;
const TYPE_USER_DEFINED: i64 = 4;

/// User-defined pieces that are markers, not text: Hugging Face's Gemma 3 file makes them
/// special, so user text must not produce them either.
const MARKERS: &[&str] = &["<start_of_image>", "<end_of_image>"];

/// Control tokens that end a turn in some family's chat format, also where the file names no
/// `eot_token_id` (Gemma's GGUFs name only bos and eos): generation stops at them, as it does
/// in llama.cpp.
const END_OF_TURN: &[&str] = &[
    "<end_of_turn>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|endoftext|>",
];

/// The header's vocabulary arrays: copied into the tokenizer by [`Tokenizer::from_gguf`], so
/// a loader may drop them from the header once it is built ([`Tokenizer::drop_vocabulary`]).
const VOCABULARY_KEYS: &[&str] = &[
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
];

impl Tokenizer {
    /// Build from the vocabulary in the GGUF metadata.
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let model = g
            .get("tokenizer.ggml.model")
            .and_then(Value::as_str)
            .unwrap_or("");
        let byte_level = match model {
            "llama" => false,
            "gpt2" => true,
            "bert" => return Self::from_gguf_wordpiece(g),
            other => {
                return Err(Error::Tokenizer(format!(
                    "tokenizer.ggml.model `{other}` is not supported: kerze builds SentencePiece-style (`llama`), GPT-2 byte-level BPE (`gpt2`) and WordPiece (`bert`) vocabularies"
                )))
            }
        };
        let tokens = gguf_tokens(g)?;
        let n = tokens.len();
        let scores: Vec<f32> = match gguf_numbers(g, "tokenizer.ggml.scores")? {
            Some(v) => v.into_iter().map(|x| x as f32).collect(),
            None => (0..n).map(|i| -(i as f32)).collect(),
        };
        let types = gguf_types(g, n)?;
        if scores.len() != n {
            return Err(tk_err(format!("{n} tokens but {} scores", scores.len())));
        }
        // llama.cpp's converter writes the spaces of user-defined tokens ("▁▁" → "  ");
        // Hugging Face keeps the SentencePiece marker. Put it back so both agree.
        let vocab = Vocab::new(tokens.iter().zip(&types).map(|(t, &ty)| {
            if !byte_level && ty == TYPE_USER_DEFINED && t.contains(' ') {
                std::borrow::Cow::Owned(t.replace(' ', SPACE))
            } else {
                std::borrow::Cow::Borrowed(t)
            }
        }));
        let special = |key: &str| gguf_special(g, key, n);
        let bos = special("bos_token_id")?;
        let eos = special("eos_token_id")?;
        let eot = special("eot_token_id")?;
        let eom = special("eom_token_id")?;
        // Absent: SentencePiece files want <bos> (Llama 2, Gemma), byte-level ones do not
        // (GPT-2, Qwen), as llama.cpp assumes.
        let add_bos = g
            .get("tokenizer.ggml.add_bos_token")
            .and_then(Value::as_u64)
            .map_or(!byte_level, |v| v != 0);
        let byte_tokens = Bits::from_fn(n, |i| {
            vocab.piece(i as u32).and_then(parse_byte_token).is_some()
        });
        let control: Vec<bool> = (0..n)
            .map(|i| {
                let t = vocab.piece(i as u32).unwrap_or("");
                types[i] == TYPE_CONTROL || types[i] == TYPE_UNKNOWN || MARKERS.contains(&t)
            })
            .collect();
        let mut end_of_generation: Vec<u32> = [eos, eot, eom].into_iter().flatten().collect();
        for t in END_OF_TURN {
            if let Some(id) = vocab
                .id(t)
                .filter(|&id| control.get(id as usize) == Some(&true))
            {
                end_of_generation.push(id);
            }
        }
        end_of_generation.sort_unstable();
        end_of_generation.dedup();
        let bos_added = bos.filter(|_| add_bos);
        let mut space_prefix = false;
        let pipeline = if byte_level {
            let pre = g
                .get("tokenizer.ggml.pre")
                .and_then(Value::as_str)
                .unwrap_or("default");
            let merges = g
                .get("tokenizer.ggml.merges")
                .and_then(Value::as_array)
                .and_then(|a| a.strings())
                .ok_or_else(|| {
                    tk_err("metadata tokenizer.ggml.merges is missing or not an array of strings")
                })?;
            build_byte_level(vocab, merges, &types, &control, bos_added, pre)?
        } else {
            // SentencePiece's dummy prefix (Llama 2: yes; Gemma's files say no). Absent:
            // yes, as llama.cpp assumes.
            space_prefix = g
                .get("tokenizer.ggml.add_space_prefix")
                .and_then(Value::as_u64)
                .is_none_or(|v| v != 0);
            build(vocab, &scores, &types, &control, bos_added, space_prefix)?
        };
        let chat_template = g
            .get("tokenizer.chat_template")
            .and_then(Value::as_str)
            .filter(|t| !t.trim().is_empty())
            .map(str::to_string);
        Ok(Self {
            inner: Mutex::new(Box::new(pipeline)),
            bos,
            eos,
            end_of_generation,
            n_vocab: n,
            byte_tokens,
            byte_level,
            space_prefix,
            add_bos,
            control: Bits::from_fn(n, |i| control[i]),
            chat_template,
        })
    }

    /// Drop the vocabulary arrays from `g`'s metadata (about 8 MB for Gemma 3's 262 144
    /// tokens), once a tokenizer has been built from them: the weights loaded next then reuse
    /// that room, where wasm memory, which never shrinks, would otherwise grow past it.
    pub fn drop_vocabulary(g: &mut Gguf) {
        for k in VOCABULARY_KEYS {
            g.metadata.remove(*k);
        }
    }

    /// WordPiece from the GGUF (`tokenizer.ggml.model = bert`): the vocabulary in llama.cpp's
    /// spelling, `[CLS]`/`[SEP]` from `cls_token_id`/`seperator_token_id` (llama.cpp's key
    /// names; else bos/eos, else the pieces by name), lower-casing from
    /// `tokenizer.ggml.normalizer.lowercase` (or kerze's older `kerze.tokenizer.lowercase`;
    /// absent: on, as llama.cpp assumed before it wrote the key).
    fn from_gguf_wordpiece(g: &Gguf) -> Result<Self> {
        let tokens = gguf_tokens(g)?;
        let n = tokens.len();
        let types = gguf_types(g, n)?;
        let control: Vec<bool> = types
            .iter()
            .map(|&t| t == TYPE_CONTROL || t == TYPE_UNKNOWN)
            .collect();
        let pieces: Vec<String> = tokens
            .iter()
            .zip(&control)
            .map(|(t, &c)| wordpiece::from_phantom(t, c))
            .collect();
        let by_name = |name: &str| pieces.iter().position(|p| p == name).map(|i| i as u32);
        let pick = |keys: &[&str], name: &str| -> Result<u32> {
            for k in keys {
                if let Some(id) = gguf_special(g, k, n)? {
                    return Ok(id);
                }
            }
            by_name(name).ok_or_else(|| {
                tk_err(format!(
                    "this WordPiece vocabulary names no {name} token ({})",
                    keys.join(", ")
                ))
            })
        };
        let unk = pick(&["unknown_token_id"], "[UNK]")?;
        let cls = pick(&["cls_token_id", "bos_token_id"], "[CLS]")?;
        let sep = pick(&["seperator_token_id", "eos_token_id"], "[SEP]")?;
        // llama.cpp's key, or the one kerze wrote before llama.cpp had one.
        let lowercase = g
            .get("tokenizer.ggml.normalizer.lowercase")
            .or_else(|| g.get("kerze.tokenizer.lowercase"))
            .and_then(Value::as_u64)
            .is_none_or(|v| v != 0);
        let special: Vec<u32> = (0..n as u32).filter(|&i| control[i as usize]).collect();
        let pipe = wordpiece::build(&wordpiece::Spec {
            pieces: &pieces,
            special: &special,
            unk,
            cls,
            sep,
            lowercase,
        })?;
        Ok(Self::assemble(
            Box::new(pipe),
            control,
            Some(cls),
            Some(sep),
        ))
    }
}

/// `tokenizer.ggml.tokens`.
fn gguf_tokens(g: &Gguf) -> Result<&crate::gguf::Strings> {
    g.get("tokenizer.ggml.tokens")
        .and_then(Value::as_array)
        .and_then(|a| a.strings())
        .ok_or_else(|| {
            tk_err("metadata tokenizer.ggml.tokens is missing or not an array of strings")
        })
}

/// An optional array of numbers.
fn gguf_numbers(g: &Gguf, k: &str) -> Result<Option<Vec<f64>>> {
    match g.get(k) {
        None => Ok(None),
        Some(v) => v
            .as_array()
            .and_then(|a| a.to_f64s())
            .map(Some)
            .ok_or_else(|| tk_err(format!("metadata {k} is not an array of numbers"))),
    }
}

/// `tokenizer.ggml.token_type` (absent: all normal), one per token.
fn gguf_types(g: &Gguf, n: usize) -> Result<Vec<i64>> {
    let types: Vec<i64> = match gguf_numbers(g, "tokenizer.ggml.token_type")? {
        Some(v) => v.into_iter().map(|x| x as i64).collect(),
        None => vec![TYPE_NORMAL; n],
    };
    if types.len() != n {
        return Err(tk_err(format!(
            "{n} tokens but {} token types",
            types.len()
        )));
    }
    Ok(types)
}

/// A special id the file names (`tokenizer.ggml.{key}`; absent: `None`); an id outside the
/// vocabulary is a broken file.
fn gguf_special(g: &Gguf, key: &str, n: usize) -> Result<Option<u32>> {
    let full = format!("tokenizer.ggml.{key}");
    match g.get(&full) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|&id| id < n as u64)
            .map(|id| Some(id as u32))
            .ok_or_else(|| {
                tk_err(format!(
                    "metadata {full} is not a token id of this {n}-token vocabulary"
                ))
            }),
    }
}

fn parse_byte_token(t: &str) -> Option<u8> {
    let hex = t.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// What both constructions add around their BPE model: the control tokens (special: never
/// from user text), the user-defined ones (matched whole, not normalized) and the <bos>
/// post-processor when the file wants <bos>.
struct Added {
    bos: Option<(String, u32)>,
    special: Vec<AddedToken>,
    user_defined: Vec<AddedToken>,
}

impl Added {
    fn new(vocab: &Vocab, types: &[i64], control: &[bool], bos: Option<u32>) -> Self {
        let piece = |id: u32| vocab.piece(id).unwrap_or("").to_string();
        Self {
            bos: bos.map(|id| (piece(id), id)),
            special: (0..types.len())
                .filter(|&i| control[i])
                .map(|i| AddedToken::from(piece(i as u32), true))
                .collect(),
            user_defined: (0..types.len())
                .filter(|&i| types[i] == TYPE_USER_DEFINED && !control[i])
                .map(|i| AddedToken::from(piece(i as u32), false).normalized(false))
                .collect(),
        }
    }

    fn install<M: tokenizers::Model>(self, tk: &mut Impl<M>) -> Result<()> {
        if let Some((bos_str, bos)) = self.bos {
            let post = TemplateProcessing::builder()
                .try_single(format!("{bos_str} $A"))
                .map_err(tk_err)?
                .try_pair(format!("{bos_str} $A {bos_str} $B"))
                .map_err(tk_err)?
                .special_tokens(vec![(bos_str, bos)])
                .build()
                .map_err(tk_err)?;
            tk.with_post_processor(Some(post));
        }
        // Each call rebuilds the matcher over every added token so far: the few user-defined
        // ones first, so that it is built once over the thousands of special ones (Gemma 3:
        // ~6 000), not twice. Matching is leftmost-longest, so the order changes nothing.
        tk.add_tokens(self.user_defined).map_err(tk_err)?;
        tk.add_special_tokens(self.special).map_err(tk_err)?;
        Ok(())
    }
}

/// The Hugging Face construction of a SentencePiece BPE, with merges derived from the scores.
/// `control[i]`: token i is special (never produced from user text).
fn build(
    vocab: Vocab,
    scores: &[f32],
    types: &[i64],
    control: &[bool],
    bos: Option<u32>,
    space_prefix: bool,
) -> Result<Pipeline> {
    let dbg = std::env::var_os("KERZE_DEBUG_TOKENIZER").is_some();
    let t0 = crate::clock::now_ms();
    let lap = |what: &str| {
        if dbg {
            eprintln!("{what}: {:.0} ms", crate::clock::now_ms() - t0)
        }
    };
    // Merges as Hugging Face's converter derives them from the scores (bpe.rs): every normal
    // or user-defined token merges (user-defined runs of spaces, tabs and newlines too: "▁▁"
    // is reachable from two spaces). SentencePiece gives user-defined pieces score 0, above
    // every normal piece (scores are -rank); GGUF files carry -1000 for them.
    let orders: Vec<Option<u32>> = types
        .iter()
        .zip(scores)
        .map(|(&ty, &score)| match ty {
            TYPE_USER_DEFINED => Some(score_order(0.0)),
            TYPE_NORMAL => Some(score_order(score)),
            _ => None,
        })
        .collect();
    let unk = vocab.id("<unk>");
    let added = Added::new(&vocab, types, control, bos);
    let model = GgufBpe::scored(vocab, orders, unk);
    lap("bpe built");

    let mut tk = Pipeline::new(model);
    let replace = Replace::new(" ", SPACE).map_err(tk_err)?;
    if space_prefix {
        tk.with_normalizer(Some(NormalizerSequence::new(vec![
            Prepend::new(SPACE.to_string()).into(),
            replace.into(),
        ])))
        .map_err(tk_err)?;
    } else {
        tk.with_normalizer(Some(replace)).map_err(tk_err)?;
    }
    tk.with_pre_tokenizer(Some(
        Split::new(
            SplitPattern::String(" ".into()),
            SplitDelimiterBehavior::MergedWithPrevious,
            false,
        )
        .map_err(tk_err)?,
    ));
    let mut decoders: Vec<DecoderWrapper> = vec![
        Replace::new(SPACE, " ").map_err(tk_err)?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tk.with_decoder(Some(DecoderSequence::new(decoders)));
    added.install(&mut tk)?;
    lap("added tokens");
    Ok(tk)
}

/// The pre-tokenizer regex of a byte-level file's `tokenizer.ggml.pre`, as its Hugging Face
/// `tokenizer.json` writes it (None: GPT-2's own, inside the ByteLevel step).
fn byte_level_split(pre: &str) -> Result<(Option<&'static str>, bool, bool)> {
    // (regex split before ByteLevel, digits one by one first, normalize to NFC)
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    Ok(match pre {
        "llama-bpe" | "llama3" | "llama-v3" => (Some(LLAMA3), false, false),
        "qwen2" | "qwen3" | "deepseek-r1-qwen" => (Some(QWEN2), false, true),
        "smollm" | "starcoder" | "refact" => (None, true, false),
        "gpt2" | "gpt-2" | "default" => (None, false, false),
        other => {
            return Err(Error::Tokenizer(format!(
                "tokenizer.ggml.pre `{other}` is not supported for byte-level BPE (llama-bpe, qwen2, smollm, gpt2)"
            )))
        }
    })
}

/// The Hugging Face construction of a GPT-2 byte-level BPE: the file's merges (`"a b"`, best
/// first), the pre-tokenizer of `pre`, the byte-level decoder.
fn build_byte_level(
    vocab: Vocab,
    merges: &crate::gguf::Strings,
    types: &[i64],
    control: &[bool],
    bos: Option<u32>,
    pre: &str,
) -> Result<Pipeline> {
    let (split, digits, nfc) = byte_level_split(pre)?;
    let mut triples: Vec<(u32, u32, u32)> = Vec::with_capacity(merges.len());
    let mut joined = String::new();
    for (i, m) in merges.iter().enumerate() {
        let m: &str = m;
        let (l, r) = m
            .split_once(' ')
            .ok_or_else(|| tk_err(format!("merge {i} `{m}` is not two pieces")))?;
        joined.clear();
        joined.push_str(l);
        joined.push_str(r);
        // A merge whose parts or result are not tokens can never apply (Hugging Face refuses
        // the file; llama.cpp ignores it).
        if let (Some(a), Some(b), Some(c)) = (vocab.id(l), vocab.id(r), vocab.id(&joined)) {
            triples.push((a, b, c));
        }
    }
    let added = Added::new(&vocab, types, control, bos);
    // Llama 3's tokenizer takes a word that is a token as it is, merges or not.
    let ignore_merges = split.is_some() && !nfc;
    let model = GgufBpe::new(vocab, &triples, None).ignore_merges(ignore_merges);
    drop(triples);
    let mut tk = Pipeline::new(model);
    if nfc {
        tk.with_normalizer(Some(NFC)).map_err(tk_err)?;
    }
    let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
    if digits {
        steps.push(Digits::new(true).into());
    }
    if let Some(re) = split {
        steps.push(
            Split::new(
                SplitPattern::Regex(re.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(tk_err)?
            .into(),
        );
    }
    steps.push(ByteLevel::new(false, true, split.is_none()).into());
    tk.with_pre_tokenizer(Some(PreSequence::new(steps)));
    tk.with_decoder(Some(ByteLevel::new(false, true, true)));
    added.install(&mut tk)?;
    Ok(tk)
}
