//! BERT-family ONNX exports mapped onto the one encoder, against onnxruntime and the GGUF
//! path. The ONNX files and onnxruntime's outputs are made by `make onnx-models`
//! (tests/fixtures/make_onnx_models.py, in `make test`'s set-up): all-MiniLM-L6-v2 from its
//! safetensors as f32, f16 and int8 (onnxruntime's dynamic quantization, uint8 and per-column
//! int8), a synthetic BertForSequenceClassification, and a non-BERT graph.
//! - The f32 export converts to the same tensors, bit for bit, as the safetensors do; f32 and
//!   f16 embeddings equal onnxruntime's (cosine ≥ 0.9999) and the GGUF path's.
//! - int8: the weights dequantized exactly, as `DequantizeLinear` defines it; the embeddings
//!   equal onnxruntime's on those weights with float activations (cosine ≥ 0.9999), and are
//!   within 0.98 of onnxruntime's own int8 run, which also rounds the activations to 8 bits.
//! - The classification head's logits equal onnxruntime's; `classify` without labels gives
//!   the model's own.
//! - A graph that is not BERT, a truncated file: typed errors (bombs: tests/bad_input.rs).
#![cfg(not(target_arch = "wasm32"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use kerze::classify::{ClassifyOptions, Labels};
use kerze::embed::{cosine, EmbedOptions};
use kerze::{Engine, Error, Gguf, LoadOptions};
use serde_json::Value;
use std::path::PathBuf;

fn dir() -> PathBuf {
    let d = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/onnx");
    assert!(
        d.join("reference.json").is_file(),
        "{} is missing: run `make onnx-models` first",
        d.display()
    );
    d
}

fn reference() -> &'static Value {
    static R: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    R.get_or_init(|| {
        serde_json::from_slice(&std::fs::read(dir().join("reference.json")).unwrap()).unwrap()
    })
}

fn gguf_of(model: &str, file: &str) -> Vec<u8> {
    kerze::convert::convert_onnx_file(&dir().join(model).join(file), None).unwrap()
}

fn engine(bytes: &[u8]) -> Engine {
    Engine::load(&bytes, &LoadOptions::default(), &mut |_, _| {})
        .unwrap()
        .0
}

fn texts(model: &str) -> Vec<String> {
    reference()[model]["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect()
}

fn rows(v: &Value) -> Vec<Vec<f32>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect()
}

fn embed(e: &mut Engine, texts: &[String]) -> Vec<Vec<f32>> {
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    pollster::block_on(e.embed(&refs, &EmbedOptions::default()))
        .unwrap()
        .data
}

/// The worst cosine between two lists of vectors.
fn worst(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| cosine(x, y))
        .fold(1.0f64, f64::min)
}

#[test]
fn the_tokenizer_gives_onnxruntimes_ids() {
    let g = gguf_of("minilm", "model.onnx");
    let gg = Gguf::read(&g).unwrap();
    let tok = kerze::Tokenizer::from_gguf(&gg).unwrap();
    for (t, ids) in texts("minilm")
        .iter()
        .zip(reference()["minilm"]["ids"].as_array().unwrap())
    {
        let want: Vec<u32> = ids
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(tok.encode_user(t, true).unwrap(), want, "{t:?}");
    }
}

#[test]
fn the_f32_export_converts_to_the_safetensors_tensors_bit_for_bit() {
    let (folder, _, _) = common::minilm_sources();
    let from_st = kerze::convert::convert_dir(folder, kerze::convert::OutType::F32).unwrap();
    let from_onnx = gguf_of("minilm", "model.onnx");
    let (a, b) = (
        Gguf::read(&from_st).unwrap(),
        Gguf::read(&from_onnx).unwrap(),
    );
    assert_eq!(a.tensors.len(), b.tensors.len());
    for t in &a.tensors {
        let u = b
            .tensor(&t.name)
            .unwrap_or_else(|| panic!("ONNX path lacks {}", t.name));
        assert_eq!((t.ty, &t.dims), (u.ty, &u.dims), "{}", t.name);
        let bytes = |g: &[u8], info: &kerze::TensorInfo| {
            g[info.offset as usize..(info.offset + info.n_bytes) as usize].to_vec()
        };
        assert!(
            bytes(&from_st, t) == bytes(&from_onnx, u),
            "{}: the ONNX path's values differ from the safetensors'",
            t.name
        );
    }
}

#[test]
fn f32_and_f16_exports_equal_onnxruntime_and_the_gguf_path() {
    let (_, f32_gguf, f16_gguf) = common::minilm_sources();
    let t = texts("minilm");
    let ids = reference()["minilm"]["ids"].as_array().unwrap();
    // The GGUF conversion keeps sentence-transformers' 256-token limit, the ONNX export the
    // model's 512 positions: compare the GGUF path on the texts both take whole.
    let short: Vec<usize> = (0..t.len())
        .filter(|&i| ids[i].as_array().unwrap().len() <= 256)
        .collect();
    assert!(
        short.len() < t.len(),
        "a text past 256 tokens is in the set"
    );
    for (file, gguf) in [("model.onnx", f32_gguf), ("model_fp16.onnx", f16_gguf)] {
        let got = embed(&mut engine(&gguf_of("minilm", file)), &t);
        let ort = rows(&reference()["minilm"][file]);
        let w = worst(&got, &ort);
        eprintln!(
            "{file}: worst cosine to onnxruntime {w:.7} over {} texts",
            t.len()
        );
        assert!(w >= 0.9999, "{file}: cosine {w} to onnxruntime");
        let g = common::file_engine(gguf);
        let mut g = g;
        let pick = |v: &[Vec<f32>]| short.iter().map(|&i| v[i].clone()).collect::<Vec<_>>();
        let st = embed(
            &mut g,
            &short.iter().map(|&i| t[i].clone()).collect::<Vec<_>>(),
        );
        let w = worst(&pick(&got), &st);
        eprintln!("{file}: worst cosine to the GGUF path {w:.7}");
        assert!(w >= 0.9999, "{file}: cosine {w} to the GGUF path");
    }
}

#[test]
fn int8_exports_equal_onnxruntime_on_the_dequantized_weights() {
    let t = texts("minilm");
    for file in ["model_quantized.onnx", "model_int8.onnx"] {
        // By default the matrices stay int8 (I8 with a scale and zero per row), on the int8
        // kernel with 16-bit activations.
        let g = gguf_of("minilm", file);
        let parsed = Gguf::read(&g).unwrap();
        let q = parsed.tensor("blk.0.attn_q.weight").unwrap();
        assert_eq!(q.ty, kerze::GgmlType::I8, "{file}");
        assert!(parsed.tensor("blk.0.attn_q.weight.scale").is_some());
        let got = embed(&mut engine(&g), &t);
        let same_weights = rows(&reference()["minilm"][format!("{file}:dequantized")]);
        let own = rows(&reference()["minilm"][file]);
        let (w, w_own) = (worst(&got, &same_weights), worst(&got, &own));
        eprintln!(
            "{file}: worst cosine {w:.7} to onnxruntime on the same weights (float activations), \
             {w_own:.5} to onnxruntime's own int8 run (8-bit activations)"
        );
        assert!(w >= 0.9999, "{file}: cosine {w}");
        assert!(
            w_own >= 0.98,
            "{file}: cosine {w_own} to onnxruntime's int8 run"
        );
        // Dequantized to f32 instead (`--type f32`): onnxruntime's float run on the same
        // weights, to float rounding.
        let f = kerze::convert::convert_onnx_file(
            &dir().join("minilm").join(file),
            Some(kerze::convert::OutType::F32),
        )
        .unwrap();
        let w = worst(&embed(&mut engine(&f), &t), &same_weights);
        eprintln!("{file} as f32: worst cosine {w:.7} to onnxruntime on the same weights");
        assert!(w >= 0.99999, "{file} as f32: cosine {w}");
    }
}

#[test]
fn the_classification_head_gives_onnxruntimes_logits_and_its_labels() {
    let t = texts("classifier");
    // Tolerances relative to the largest logit (15 here: random weights, a classifier of
    // std 1). f32 agrees to float rounding (~2e-6 of it); int8 runs its matrices with 16-bit
    // activations, one scale per row, whose rounding (~3e-5 per product) adds up over six
    // layers and the head to ~3e-4 of it (onnxruntime on the same weights in f32 as the
    // reference; its own 8-bit-activation run is further off, see the print).
    for (file, key, tol) in [
        ("model.onnx", "model.onnx", 1e-4),
        (
            "model_quantized.onnx",
            "model_quantized.onnx:dequantized",
            1e-3,
        ),
    ] {
        let g = gguf_of("classifier", file);
        let mut e = engine(&g);
        let refs: Vec<&str> = t.iter().map(String::as_str).collect();
        let (logits, _) = pollster::block_on(e.head_logits(&refs)).unwrap();
        let want = rows(&reference()["classifier"][key]);
        let largest = |v: &[Vec<f32>]| {
            v.iter()
                .flatten()
                .fold(0f64, |m, &x| m.max(f64::from(x).abs()))
        };
        let differ = |want: &[Vec<f32>]| {
            let mut worst = 0f64;
            for (g, w) in logits.iter().zip(want) {
                for (a, b) in g.iter().zip(w) {
                    worst = worst.max((a - f64::from(*b)).abs());
                }
            }
            worst / largest(want)
        };
        let worst = differ(&want);
        let own = differ(&rows(&reference()["classifier"][file]));
        eprintln!(
            "{file}: largest logit difference to onnxruntime ({key}) {worst:.2e} of the largest \
             logit ({:.1}); to onnxruntime's own run of the file {own:.2e}",
            largest(&want)
        );
        assert!(
            worst < tol,
            "{file}: logits differ by {worst} of the largest"
        );
        // classify without labels: the model's own, best first, as the logits rank them.
        let c = pollster::block_on(e.classify(&refs, &Labels::Head, &ClassifyOptions::default()))
            .unwrap();
        let cfg: Value =
            serde_json::from_slice(&std::fs::read(dir().join("classifier/config.json")).unwrap())
                .unwrap();
        for (r, w) in c.results.iter().zip(&want) {
            let best = (0..w.len()).max_by(|&a, &b| w[a].total_cmp(&w[b])).unwrap();
            assert_eq!(
                r[0].label,
                cfg["id2label"][best.to_string()].as_str().unwrap()
            );
            let sum: f64 = r.iter().map(|s| s.score).sum();
            assert!((sum - 1.0).abs() < 1e-9);
        }
    }
}

#[test]
fn labels_on_a_model_without_a_head_and_no_labels_are_typed_errors() {
    let mut e = engine(&gguf_of("minilm", "model_quantized.onnx"));
    let err = pollster::block_on(e.classify(&["x"], &Labels::Head, &ClassifyOptions::default()))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(err.to_string().contains("no classification head"), "{err}");
}

#[test]
fn a_graph_that_is_not_bert_names_what_it_found() {
    let d = dir();
    let onnx = std::fs::read(d.join("nonbert/model.onnx")).unwrap();
    let tok = std::fs::read(d.join("minilm/tokenizer.json")).unwrap();
    let cfg = std::fs::read(d.join("minilm/config.json")).unwrap();
    let err = kerze::convert::convert_onnx(&onnx, &tok, &cfg, None).unwrap_err();
    eprintln!("{err}");
    assert!(matches!(err, Error::UnsupportedArch { .. }), "{err}");
    assert!(err.to_string().contains("Conv"), "{err}");
    // A GGUF given as ONNX, and ONNX bytes with a config of another architecture.
    let g = gguf_of("classifier", "model.onnx");
    assert!(matches!(
        kerze::convert::convert_onnx(&g, &tok, &cfg, None).unwrap_err(),
        Error::Onnx(_)
    ));
    let gpt = br#"{"model_type": "gpt2", "n_layer": 2}"#;
    assert!(matches!(
        kerze::convert::convert_onnx(&onnx, &tok, gpt, None).unwrap_err(),
        Error::UnsupportedArch { .. }
    ));
    // config.json that disagrees with the graph: 7 layers for a 6-layer export.
    let mut c: Value = serde_json::from_slice(&cfg).unwrap();
    c["num_hidden_layers"] = 7.into();
    let m = std::fs::read(d.join("minilm/model_quantized.onnx")).unwrap();
    let err = kerze::convert::convert_onnx(&m, &tok, c.to_string().as_bytes(), None).unwrap_err();
    assert!(err.to_string().contains("6 attention blocks"), "{err}");
    // Heads that do not divide the width, and an epsilon no LayerNorm takes: refused before a
    // file is written (the loader would refuse the file).
    for (k, v, says) in [
        (
            "num_attention_heads",
            0.into(),
            "hidden_size 384 is not a multiple of num_attention_heads 0",
        ),
        (
            "num_attention_heads",
            7.into(),
            "is not a multiple of num_attention_heads 7",
        ),
        (
            "layer_norm_eps",
            (-1.0).into(),
            "layer_norm_eps -1 is not between 0 and 1",
        ),
    ] {
        let mut c: Value = serde_json::from_slice(&cfg).unwrap();
        c[k] = v;
        let err =
            kerze::convert::convert_onnx(&m, &tok, c.to_string().as_bytes(), None).unwrap_err();
        assert!(matches!(err, Error::Model(_)), "{err:?}");
        assert!(err.to_string().contains(says), "{err}");
    }
}

#[test]
fn a_truncated_export_is_a_typed_error_at_every_cut() {
    let d = dir();
    let onnx = std::fs::read(d.join("classifier/model_quantized.onnx")).unwrap();
    let tok = std::fs::read(d.join("classifier/tokenizer.json")).unwrap();
    let cfg = std::fs::read(d.join("classifier/config.json")).unwrap();
    let cuts: Vec<usize> = (0..100)
        .map(|i| i * onnx.len() / 100)
        .chain([1, 2, 7, onnx.len() - 1])
        .collect();
    for cut in cuts {
        match kerze::convert::convert_onnx(&onnx[..cut], &tok, &cfg, None) {
            Err(Error::Onnx(_) | Error::UnsupportedArch { .. }) => {}
            other => panic!("cut at {cut}: {:?}", other.map(|b| b.len())),
        }
    }
}
