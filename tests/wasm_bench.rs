//! Benchmark in headless Chromium, 1 thread (`make bench-wasm`): a 128-token prompt and 64
//! greedy tokens, as `kerze bench` does natively. Prints JSON; asserts nothing about speed
//! (shared machines are noisy). Runs only when built with KERZE_BENCH set.
#![cfg(target_arch = "wasm32")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kerze::{Engine, GenerateOptions, LoadOptions};
use wasm_bindgen::JsCast;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

mod common;

fn never() -> bool {
    false
}

#[wasm_bindgen_test]
async fn bench_prefill_128_decode_64() {
    let (Some(_), Some(url)) = (
        option_env!("KERZE_BENCH"),
        option_env!("KERZE_TEST_MODEL_URL"),
    ) else {
        return;
    };
    let bytes = kerze::wasm::JsBytes(common::fetch_bytes(url).await);
    let t0 = kerze::clock::now_ms();
    let (mut engine, info) = Engine::load(&bytes, &LoadOptions::default(), &mut |_, _| {}).unwrap();
    let load_ms = kerze::clock::now_ms() - t0;
    let ids = engine.tokenizer().bench_prompt(128).unwrap();
    let opts = GenerateOptions::greedy_tokens(64);
    let g = engine
        .generate(ids, &opts, &never, &mut |_| {})
        .await
        .unwrap();
    let wasm_mb = wasm_bindgen::memory()
        .unchecked_into::<js_sys::WebAssembly::Memory>()
        .buffer()
        .unchecked_into::<js_sys::ArrayBuffer>()
        .byte_length() as f64
        / 1048576.0;
    let line = serde_json::json!({
        "backend": info.backend,
        "threads": 1,
        "prompt_tokens": g.usage.prompt_tokens,
        "gen_tokens": g.usage.completion_tokens,
        "prefill_tokens_per_s": g.usage.prefill_tokens_per_s,
        "decode_tokens_per_s": g.usage.decode_tokens_per_s,
        "load_from_bytes_ms": load_ms,
        "tokenizer_ms": info.tokenizer_ms,
        "wasm_memory_mb": wasm_mb,
    });
    web_sys::console::log_1(&format!("KERZE_BENCH {line}").into());
}
