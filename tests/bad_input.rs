//! Bad input gets a typed error, never a panic or an allocation beyond the file's size:
//! non-GGUF bytes, the real file truncated at 100 cut points, mutated headers (a sample here;
//! 100 000+ cases with `KERZE_FUZZ_CASES=100000`, run by `make fuzz`), absurd dimensions,
//! unknown architecture, unsupported tensor type.
#![cfg(not(target_arch = "wasm32"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use kerze::gguf::{ByteSource, FileSource, GgmlType, Gguf, Value, Writer};
use kerze::{Engine, Error, LoadOptions};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Records the largest single allocation of this thread (tests run in parallel threads), to
/// prove no count in a file is trusted.
struct Counting;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // try_with: the allocator may be called while this thread's locals are torn down.
    let _ = LARGEST.try_with(|c| c.set(c.get().max(size)));
}

fn reset_largest() {
    LARGEST.with(|c| c.set(0));
}

fn largest() -> usize {
    LARGEST.with(Cell::get)
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size());
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        note(new);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The file cut to its first `len` bytes, without copying it.
struct Prefix<'a, S: ByteSource>(&'a S, u64);

impl<S: ByteSource> ByteSource for Prefix<'_, S> {
    fn len(&self) -> u64 {
        self.1
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> kerze::Result<()> {
        if offset + buf.len() as u64 > self.1 {
            return Err(Error::Gguf("read past the end".into()));
        }
        self.0.read_at(offset, buf)
    }
}

fn load(src: &dyn ByteSource) -> kerze::Result<()> {
    Engine::load(src, &LoadOptions::default(), &mut |_, _| {}).map(|_| ())
}

/// The mutations' seed: `fixed`, or `fixed` plus `KERZE_FUZZ_SEED` (`make fuzz
/// KERZE_FUZZ_SEED=n` draws other cases than the default run).
fn seed(fixed: u64) -> u64 {
    let extra: u64 = std::env::var("KERZE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    fixed.wrapping_add(extra)
}

/// Parse and load mutated copies of `base`; every outcome must be Ok or a typed error,
/// never a panic, and no allocation may exceed `limit` bytes.
fn fuzz(base: &[u8], cases: usize, seed: u64, limit: usize) -> (usize, usize) {
    let mut rng = kerze::rng::Rng::new(seed);
    let header_len = Gguf::read(base).unwrap().data_offset as usize;
    let (mut ok, mut err) = (0, 0);
    for i in 0..cases {
        let mut b = base.to_vec();
        let n_mut = 1 + (rng.next_u64() % 8) as usize;
        for _ in 0..n_mut {
            let at = (rng.next_u64() as usize) % header_len;
            match rng.next_u64() % 4 {
                0 => b[at] = rng.next_u64() as u8,
                1 => b[at] ^= 1 << (rng.next_u64() % 8),
                2 => b[at] = [0x00, 0xFF, 0x7F, 0x80][(rng.next_u64() % 4) as usize],
                _ => {
                    // an 8-byte little-endian count or length set to something extreme
                    let v: u64 = [u64::MAX, 1 << 40, 1 << 31, 0, 7][(rng.next_u64() % 5) as usize];
                    let at = at.min(b.len() - 8);
                    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        if i % 3 == 0 {
            let cut = (rng.next_u64() as usize) % b.len();
            b.truncate(cut);
        }
        reset_largest();
        let r = std::panic::catch_unwind(|| {
            // Parsing alone is cheap: always. Loading builds a tokenizer: a sample.
            let parsed = Gguf::read(b.as_slice());
            if parsed.is_ok() && i % 16 == 0 {
                load(&b)
            } else {
                parsed.map(|_| ())
            }
        });
        let largest = largest();
        match r {
            Ok(Ok(())) => ok += 1,
            Ok(Err(_)) => err += 1,
            Err(_) => panic!("case {i} (seed {seed}) panicked"),
        }
        if largest > limit {
            let cfg = Gguf::read(b.as_slice())
                .ok()
                .and_then(|g| kerze::ModelConfig::from_gguf(&g, None).ok());
            panic!(
                "case {i} (seed {seed}): allocated {largest} bytes at once (limit {limit}); config {cfg:?}"
            );
        }
    }
    (ok, err)
}

#[test]
fn mutated_headers_give_typed_errors() {
    let base = kerze::synth::tiny_gemma3().unwrap();
    let cases: usize = std::env::var("KERZE_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    // Allocation bound: no single allocation beyond 3× the bytes in the file (+1 MiB for
    // fixed-size buffers): a count in a header reserves memory only for entries the file can
    // hold, and an entry in memory (a tensor's name, type, dims, offset) is at most ~2.3× its
    // smallest encoding.
    let (ok, err) = fuzz(&base, cases, seed(11), 3 * base.len() + (1 << 20));
    eprintln!("{cases} mutated files: {ok} loaded, {err} typed errors");
    assert!(
        err > cases / 2,
        "mutations should mostly be caught: {ok} ok / {err} errors"
    );
}

/// Found by `make fuzz` (case 92576 of seed 11): a tensor name's length mutated to span the
/// rest of the file read megabytes into the name, and the error message repeated them (9.0 MB
/// at once for a 2.5 MB file). GGUF allows 64 bytes; a longer name is refused where it is.
/// And a header's strings with invalid UTF-8 (a string value, a string array's pieces) are
/// repaired into one allocation of their size (3 bytes per bad byte), not grown to up to
/// twice that as they are repaired.
#[test]
fn long_names_and_bad_text_cost_no_more_than_their_bytes() {
    let base = kerze::synth::tiny_gemma3().unwrap();
    let g = Gguf::read(base.as_slice()).unwrap();
    // The first tensor name's length field: the name spans the rest of the file.
    let first = g.tensors[0].name.as_bytes();
    let at = (0..g.data_offset as usize)
        .find(|&i| {
            base[i + 8..].starts_with(first) && base[i..i + 8] == (first.len() as u64).to_le_bytes()
        })
        .unwrap();
    let mut long = base.clone();
    let rest = (long.len() - at - 8) as u64;
    long[at..at + 8].copy_from_slice(&rest.to_le_bytes());
    reset_largest();
    let e = Gguf::read(long.as_slice()).unwrap_err().to_string();
    assert!(
        e.contains("a tensor name of") && e.contains("at most 64"),
        "{e}"
    );
    // The header is read into one buffer of up to the file's size; nothing beside it.
    assert!(largest() <= long.len(), "{} bytes at once", largest());

    // A 4 MiB string value and a 4 MiB string array of bytes that are no UTF-8: each
    // repaired text (12 MiB) is larger than the file, so the largest allocation is one.
    let n = 4 << 20;
    let mut bad = rewrite(|kv, _| {
        kv.push(("bad.text".into(), Value::String("\u{1}".repeat(n))));
        let pieces: Vec<String> = (0..1024).map(|_| "\u{2}".repeat(n / 1024)).collect();
        kv.push((
            "bad.list".into(),
            Value::Array(kerze::gguf::Array::Str(
                pieces.iter().map(String::as_str).collect(),
            )),
        ));
    });
    // Every run of the placeholders (the strings' bytes; no other field has 512 of them in
    // a row) made 0xFF.
    let mut i = 0;
    while i < bad.len() {
        let run = bad[i..].iter().take_while(|&&b| b == bad[i]).count();
        if run >= 512 && (bad[i] == 1 || bad[i] == 2) {
            bad[i..i + run].fill(0xFF);
        }
        i += run;
    }
    reset_largest();
    let g = Gguf::read(bad.as_slice()).unwrap();
    let largest = largest();
    assert_eq!(g.metadata["bad.text"], Value::String("\u{FFFD}".repeat(n)));
    let Value::Array(kerze::gguf::Array::Str(list)) = &g.metadata["bad.list"] else {
        panic!("bad.list is not a string array")
    };
    assert!(list.iter().all(|s| s == "\u{FFFD}".repeat(n / 1024)));
    // Each repaired text is 12 MiB; grown as it was repaired, one reached 16 MiB.
    assert!(largest <= 3 * n, "{largest} bytes at once");
}

/// The same for a Qwen2 file with a byte-level BPE vocabulary, merges and a chat template:
/// the new tokenizer and family paths see mutated headers too.
#[test]
fn mutated_byte_level_qwen_headers_give_typed_errors() {
    let q = kerze::synth::Quants::all(GgmlType::Q4_1);
    let base = kerze::synth::tiny_decoder_with(kerze::Family::Qwen2, q, 7, true).unwrap();
    let cases: usize = std::env::var("KERZE_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(1500, |n: usize| n / 2);
    let (ok, err) = fuzz(&base, cases, seed(23), 3 * base.len() + (1 << 20));
    eprintln!("{cases} mutated byte-level files: {ok} loaded, {err} typed errors");
    assert!(err > cases / 2, "{ok} ok / {err} errors");
}

#[test]
fn non_gguf_bytes_are_refused() {
    for bytes in [
        &b""[..],
        b"GGU",
        b"PK\x03\x04 this is a zip",
        b"<!DOCTYPE html><html>404</html>",
        &[0u8; 64],
    ] {
        match Gguf::read(bytes) {
            Err(Error::Gguf(m)) => assert!(m.contains("GGUF") || m.contains("truncated"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn the_real_file_truncated_at_100_points_is_an_error() {
    let src = FileSource::open(&common::model_path()).unwrap();
    let len = src.len();
    let header = Gguf::read(&src).unwrap().data_offset;
    for i in 0..100u64 {
        // 50 cuts inside the header, 50 inside the tensor data, and the last byte.
        let cut = if i < 50 {
            header * i / 50
        } else if i < 99 {
            header + (len - header) * (i - 50) / 49
        } else {
            len - 1
        };
        let p = Prefix(&src, cut);
        reset_largest();
        let r = Gguf::read(&p);
        assert!(r.is_err(), "cut at {cut} parsed");
        assert!(
            largest() as u64 <= cut.max(1 << 20) + (8 << 20),
            "cut at {cut}"
        );
        if i > 50 {
            let m = r.unwrap_err().to_string();
            assert!(m.contains("truncated"), "cut at {cut}: {m}");
        }
    }
}

type Tensors = Vec<(String, GgmlType, Vec<u64>, Vec<u8>)>;

fn rewrite(f: impl Fn(&mut Vec<(String, Value)>, &mut Tensors)) -> Vec<u8> {
    rewrite_from(kerze::synth::tiny_gemma3().unwrap(), f)
}

/// Re-emit `base` with edited metadata/tensors.
fn rewrite_from(base: Vec<u8>, f: impl Fn(&mut Vec<(String, Value)>, &mut Tensors)) -> Vec<u8> {
    let g = Gguf::read(base.as_slice()).unwrap();
    let mut kv: Vec<(String, Value)> = g.metadata.clone().into_iter().collect();
    let mut ts: Tensors = g
        .tensors
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                t.ty,
                t.dims.clone(),
                base[t.offset as usize..(t.offset + t.n_bytes) as usize].to_vec(),
            )
        })
        .collect();
    f(&mut kv, &mut ts);
    let mut w = Writer::new();
    for (k, v) in kv {
        w.kv(&k, v);
    }
    for (n, ty, d, data) in ts {
        w.tensor(&n, ty, &d, data);
    }
    w.to_bytes()
}

#[test]
fn unknown_architecture_names_what_is_supported() {
    let b = rewrite(|kv, _| {
        for (k, v) in kv.iter_mut() {
            if k == "general.architecture" {
                *v = Value::String("mamba".into());
            }
        }
    });
    let e = load(&b).unwrap_err();
    assert!(
        matches!(&e, Error::UnsupportedArch { arch, .. } if arch == "mamba"),
        "{e}"
    );
    assert!(e.to_string().contains("gemma3"));
}

#[test]
fn a_special_token_id_outside_the_vocabulary_is_a_tokenizer_error() {
    let b = rewrite(|kv, _| {
        for (k, v) in kv.iter_mut() {
            if k == "tokenizer.ggml.eos_token_id" {
                *v = Value::U32(4_000_000);
            }
        }
    });
    let e = load(&b).unwrap_err();
    assert!(
        matches!(&e, Error::Tokenizer(m) if m.contains("tokenizer.ggml.eos_token_id")),
        "{e}"
    );
}

#[test]
fn a_file_that_names_no_special_tokens_loads_and_generates() {
    let b = rewrite(|kv, _| {
        kv.retain(|(k, _)| k != "tokenizer.ggml.bos_token_id" && k != "tokenizer.ggml.eos_token_id")
    });
    let (mut e, _) = Engine::load(&b, &LoadOptions::default(), &mut |_, _| {}).unwrap();
    let tok = e.tokenizer();
    assert_eq!((tok.bos(), tok.eos()), (None, None));
    // <end_of_turn> is a control token of the vocabulary: it still ends a generation.
    let eot = tok.token_id("<end_of_turn>").unwrap();
    assert_eq!(tok.end_of_generation(), &[eot]);
    let ids = tok.encode_user("the rain in the hills", true).unwrap();
    assert!(
        !ids.is_empty() && !ids.contains(&2),
        "no <bos> added: {ids:?}"
    );
    let opts = kerze::GenerateOptions::greedy_tokens(4);
    let g = pollster::block_on(e.generate(ids, &opts, &|| false, &mut |_| {})).unwrap();
    assert_eq!(g.generated().len(), 4);
}

#[test]
fn unsupported_tensor_type_names_the_tensor_and_the_supported_types() {
    let b = rewrite(|_, ts| {
        for t in ts.iter_mut() {
            if t.0 == "blk.2.attn_output.weight" {
                // Q8_K is a ggml type (the K-quants' activation type), never a weight's:
                // re-size the tensor for its 292-byte blocks.
                t.1 = GgmlType::Q8_K;
                let rows: u64 = t.2[1];
                t.3 = vec![0u8; (rows * 292) as usize];
            }
        }
    });
    let e = load(&b).unwrap_err();
    let m = e.to_string();
    assert!(matches!(e, Error::UnsupportedTensorType { .. }), "{m}");
    assert!(
        m.contains("blk.2.attn_output.weight") && m.contains("Q8_K") && m.contains("Q4_K"),
        "{m}"
    );
}

#[test]
fn absurd_dimensions_are_refused() {
    for (key, v) in [
        ("gemma3.embedding_length", Value::U64(1 << 40)),
        ("gemma3.attention.head_count", Value::U32(0)),
        ("gemma3.attention.head_count_kv", Value::U32(3)),
        ("gemma3.block_count", Value::U32(100_000)),
        ("gemma3.context_length", Value::U64(u64::MAX)),
        (
            "gemma3.attention.layer_norm_rms_epsilon",
            Value::F32(f32::NAN),
        ),
    ] {
        let b = rewrite(|kv, _| {
            for (k, val) in kv.iter_mut() {
                if k == key {
                    *val = v.clone();
                }
            }
        });
        let e = load(&b).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{key}: {e}");
    }
    // Heads that fit a small file but whose KV cache would not: refused before allocating.
    let b = rewrite(|kv, ts| {
        for (k, v) in kv.iter_mut() {
            match k.as_str() {
                "gemma3.attention.head_count_kv" => *v = Value::U32(4),
                "gemma3.context_length" => *v = Value::U32(1 << 20),
                _ => {}
            }
        }
        // attn_k / attn_v as [n_embd, 4 * head_dim] so the shapes stay consistent.
        for t in ts
            .iter_mut()
            .filter(|t| t.0.ends_with("attn_k.weight") || t.0.ends_with("attn_v.weight"))
        {
            let (ty, data) = (t.1, t.3.clone());
            t.2 = vec![t.2[0], t.2[1] * 4];
            t.3 = [data.clone(), data.clone(), data.clone(), data].concat();
            assert!(matches!(ty, GgmlType::Q5_0 | GgmlType::Q8_0));
        }
    });
    let opts = LoadOptions {
        no_gpu: None,
        n_ctx: Some(1 << 20),
        ..Default::default()
    };
    let e = Engine::load(&b, &opts, &mut |_, _| {})
        .err()
        .expect("a 1M-token context must be refused");
    assert!(
        matches!(e, Error::Config(_)) && e.to_string().contains("smaller n_ctx"),
        "{e}"
    );
    // A tensor whose dims multiply past any file.
    let b = rewrite(|_, ts| ts[0].2 = vec![256, 1 << 40]);
    assert!(matches!(Gguf::read(b.as_slice()), Err(Error::Gguf(_))));
    // A tensor shape that disagrees with the config.
    let b = rewrite(|_, ts| {
        let t = ts
            .iter_mut()
            .find(|t| t.0 == "blk.0.attn_q_norm.weight")
            .unwrap();
        t.2 = vec![32];
        t.3.truncate(128);
    });
    let e = load(&b).unwrap_err();
    assert!(e.to_string().contains("blk.0.attn_q_norm.weight"), "{e}");
}

/// A file whose weights (as the CPU holds them) and KV cache pass the memory there is is a
/// typed error before any weight is read (wasm's budget is 4 GiB less 384 MiB).
#[test]
fn a_model_too_large_for_the_memory_is_a_typed_error_up_front() {
    use kerze::{Gguf, ModelConfig};
    let bytes = kerze::synth::tiny_gemma3().unwrap();
    let g = Gguf::read(&bytes).unwrap();
    let cfg = ModelConfig::from_gguf(&g, None).unwrap();
    kerze::engine::check_fits(&g, &cfg, Some(64 << 20)).unwrap();
    let e = kerze::engine::check_fits(&g, &cfg, Some(1 << 20)).unwrap_err();
    assert_eq!(e.kind(), "ModelTooLargeError");
    assert!(e.to_string().contains("MB"), "{e}");
}

/// The new families' and tokenizers' bad files: typed errors, each naming what was wrong.
#[test]
fn bad_family_and_tokenizer_metadata_are_typed_errors() {
    use kerze::synth::{tiny_decoder, tiny_decoder_with, Quants};
    use kerze::Family;
    let q = Quants::all(GgmlType::Q8_0);
    let qwen_bpe = || tiny_decoder_with(Family::Qwen2, q, 7, true).unwrap();
    let llama = || tiny_decoder(Family::Llama, q, 7).unwrap();
    let set = |key: &'static str, v: Value| {
        move |kv: &mut Vec<(String, Value)>, _: &mut Tensors| {
            kv.retain(|(k, _)| k != key);
            kv.push((key.to_string(), v.clone()));
        }
    };
    let cases: Vec<(&str, Vec<u8>, &str, &str)> = vec![
        (
            "an unknown byte-level pre-tokenizer",
            rewrite_from(
                qwen_bpe(),
                set("tokenizer.ggml.pre", Value::String("tekken".into())),
            ),
            "TokenizerError",
            "llama-bpe, qwen2, smollm, gpt2",
        ),
        (
            "byte-level without merges",
            rewrite_from(qwen_bpe(), |kv, _| {
                kv.retain(|(k, _)| k != "tokenizer.ggml.merges")
            }),
            "TokenizerError",
            "merges",
        ),
        (
            "an unknown tokenizer model",
            rewrite_from(
                qwen_bpe(),
                set("tokenizer.ggml.model", Value::String("rwkv".into())),
            ),
            "TokenizerError",
            "rwkv",
        ),
        (
            "YaRN rope scaling",
            rewrite_from(
                llama(),
                set("llama.rope.scaling.type", Value::String("yarn".into())),
            ),
            "ModelConfigError",
            "yarn",
        ),
        (
            "frequency factors of the wrong length",
            rewrite_from(llama(), |_, ts| {
                for t in ts.iter_mut().filter(|t| t.0 == "rope_freqs.weight") {
                    t.2 = vec![8];
                    t.3.truncate(32);
                }
            }),
            "ModelConfigError",
            "rope_freqs.weight",
        ),
        (
            "biases in some layers only",
            rewrite_from(qwen_bpe(), |_, ts| {
                ts.retain(|t| t.0 != "blk.1.attn_k.bias")
            }),
            "ModelConfigError",
            "blk.1.attn_k.bias",
        ),
    ];
    for (what, bytes, kind, needle) in cases {
        let e = match Engine::load(&bytes, &LoadOptions::default(), &mut |_, _| {}) {
            Ok(_) => panic!("{what}: loaded"),
            Err(e) => e,
        };
        assert_eq!(e.kind(), kind, "{what}: {e}");
        assert!(e.to_string().contains(needle), "{what}: {e}");
    }
    // A template that does not parse, or raises, is a typed error of the chat call, and the
    // engine stays usable.
    for template in [
        "{% for m in messages %}",
        "{{ raise_exception('no chats here') }}",
    ] {
        let b = rewrite_from(
            qwen_bpe(),
            set("tokenizer.chat_template", Value::String(template.into())),
        );
        let (e, _) = Engine::load(&b, &LoadOptions::default(), &mut |_, _| {}).unwrap();
        let m: Vec<kerze::chat::Message> =
            serde_json::from_str(r#"[{"role":"user","content":"hi"}]"#).unwrap();
        let err = kerze::chat::prompt_ids(e.tokenizer(), &m).unwrap_err();
        assert_eq!(err.kind(), "InvalidArgumentError", "{err}");
        assert!(e.tokenizer().encode_user("hi", false).is_ok());
    }
}

// ---- ONNX: hand-written protobuf that is hostile, and mutated real exports ----

/// A protobuf varint.
fn varint(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// Field `n` with length-delimited `body`.
fn field(n: u64, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    varint(n << 3 | 2, &mut out);
    varint(body.len() as u64, &mut out);
    out.extend_from_slice(body);
    out
}

/// A ModelProto: ir_version 8 and `graph`.
fn onnx_model(graph: &[u8]) -> Vec<u8> {
    let mut m = vec![0x08, 8];
    m.extend(field(7, graph));
    m
}

const MINI_CONFIG: &[u8] = br#"{"model_type": "bert", "hidden_size": 8, "num_hidden_layers": 1,
  "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 16,
  "vocab_size": 8, "type_vocab_size": 2}"#;

fn wordpiece_json() -> Vec<u8> {
    let vocab: Vec<String> = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "b", "c", "d"]
        .iter()
        .enumerate()
        .map(|(i, t)| format!("\"{t}\": {i}"))
        .collect();
    format!(
        r#"{{"model": {{"type": "WordPiece", "unk_token": "[UNK]", "vocab": {{{}}}}}, "normalizer": {{"lowercase": true}}, "added_tokens": []}}"#,
        vocab.join(", ")
    )
    .into_bytes()
}

/// Convert `onnx` with a tiny config: the outcome and the largest single allocation.
fn convert_onnx(onnx: &[u8]) -> (kerze::Result<Vec<u8>>, usize) {
    let tok = wordpiece_json();
    reset_largest();
    let r =
        std::panic::catch_unwind(|| kerze::convert::convert_onnx(onnx, &tok, MINI_CONFIG, None))
            .unwrap_or_else(|_| panic!("convert_onnx panicked"));
    (r, largest())
}

#[test]
fn onnx_bombs_are_typed_errors_without_giant_allocations() {
    // 150 000 empty nodes (2 bytes each in the file, ~120 bytes each parsed).
    let nodes: Vec<u8> = std::iter::repeat_n([0x0a, 0x00], 150_000)
        .flatten()
        .collect();
    // A million one-byte dims in one tensor.
    let mut dims = Vec::new();
    dims.extend(field(1, &vec![1u8; 1_000_000]));
    let dims_graph = field(5, &dims);
    // A sub-graph attribute nested 20 000 deep (never descended into).
    let mut deep = Vec::new();
    for _ in 0..20_000 {
        deep = field(6, &deep);
    }
    let deep_graph = field(1, &field(5, &deep));
    // A 2^31 × 2^31 weight with 8 bytes of data, used by a MatMul.
    let mut w = Vec::new();
    varint(1 << 3, &mut w);
    varint(1 << 31, &mut w);
    varint(1 << 3, &mut w);
    varint(1 << 31, &mut w);
    w.extend([0x10, 0x01]); // data_type FLOAT
    w.extend(field(8, b"W"));
    w.extend(field(9, &[0u8; 8]));
    let mut mm = field(1, b"x");
    mm.extend(field(1, b"W"));
    mm.extend(field(2, b"y"));
    mm.extend(field(4, b"MatMul"));
    let mut huge = field(1, &mm);
    huge.extend(field(5, &w));
    // A length prefix that claims 2^60 bytes.
    let mut lie = vec![0x08, 8, 0x3a];
    varint(1 << 60, &mut lie);
    lie.extend([0u8; 16]);
    // A node without an output (found by `make fuzz` at seed 1: a Cast whose output was
    // mutated away panicked where the walk read it).
    let mut cast = field(1, b"y");
    cast.extend(field(3, b"c"));
    cast.extend(field(4, b"Cast"));
    let (r, _) = convert_onnx(&onnx_model(&field(1, &cast)));
    let e = r.unwrap_err().to_string();
    assert!(e.contains("node 'c' (Cast) has no output"), "{e}");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("150 000 empty nodes", onnx_model(&nodes)),
        ("a million dims", onnx_model(&dims_graph)),
        ("a sub-graph 20 000 deep", onnx_model(&deep_graph)),
        ("a 2^31 × 2^31 weight", onnx_model(&huge)),
        ("a length of 2^60", lie),
        ("no graph", vec![0x08, 8]),
        ("empty", Vec::new()),
        (
            "garbage",
            (0..4096u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
                .collect(),
        ),
    ];
    for (what, bytes) in cases {
        let (r, big) = convert_onnx(&bytes);
        let err = r.err().unwrap_or_else(|| panic!("{what}: converted"));
        eprintln!(
            "{what} ({} bytes): {err} [largest allocation {big} bytes]",
            bytes.len()
        );
        assert!(
            matches!(err, Error::Onnx(_) | Error::UnsupportedArch { .. }),
            "{what}: {err:?}"
        );
        assert!(big <= 32 << 20, "{what}: allocated {big} bytes at once");
    }
}

#[test]
fn mutated_onnx_exports_give_typed_errors() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models/onnx/classifier/model_quantized.onnx");
    assert!(
        path.is_file(),
        "{} is missing: run `make onnx-models`",
        path.display()
    );
    let base = std::fs::read(&path).unwrap();
    let dir = path.parent().unwrap();
    let tok = std::fs::read(dir.join("tokenizer.json")).unwrap();
    let cfg = std::fs::read(dir.join("config.json")).unwrap();
    let cases: usize = std::env::var("KERZE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(300, |n: usize| n / 100);
    let seed = seed(17);
    let mut rng = kerze::rng::Rng::new(seed);
    // The graph's structure (nodes, names, attributes) lies outside the big weights: mutate
    // anywhere, but mostly in the first and last 64 KiB where the nodes are.
    let limit = base.len() * 10 + (64 << 20);
    let (mut ok, mut err) = (0, 0);
    for i in 0..cases {
        let mut b = base.clone();
        for _ in 0..1 + rng.next_u64() % 8 {
            let r = rng.next_u64() as usize;
            let at = match r % 3 {
                0 => r / 3 % b.len(),
                1 => r / 3 % (64 << 10).min(b.len()),
                _ => b.len() - 1 - r / 3 % (64 << 10).min(b.len()),
            };
            match rng.next_u64() % 3 {
                0 => b[at] = rng.next_u64() as u8,
                1 => b[at] ^= 1 << (rng.next_u64() % 8),
                _ => b[at] = [0x00, 0xFF, 0x7F, 0x80][(rng.next_u64() % 4) as usize],
            }
        }
        if i % 4 == 0 {
            let cut = (rng.next_u64() as usize) % b.len();
            b.truncate(cut);
        }
        reset_largest();
        let r = std::panic::catch_unwind(|| kerze::convert::convert_onnx(&b, &tok, &cfg, None))
            .unwrap_or_else(|_| panic!("case {i} (seed {seed}) panicked"));
        let big = largest();
        assert!(
            big <= limit,
            "case {i} (seed {seed}): allocated {big} bytes at once"
        );
        match r {
            Ok(_) => ok += 1,
            Err(
                Error::Onnx(_)
                | Error::UnsupportedArch { .. }
                | Error::UnsupportedTensorType { .. }
                | Error::Model(_),
            ) => err += 1,
            Err(e) => panic!("case {i} (seed {seed}): {e:?}"),
        }
    }
    eprintln!("{cases} mutated ONNX exports: {ok} converted, {err} typed errors");
}
