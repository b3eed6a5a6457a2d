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
