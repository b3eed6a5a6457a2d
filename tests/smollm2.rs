//! The real SmolLM2-135M-Instruct Q4_1 file (Llama block, GPT-2 byte-level BPE, its own
//! ChatML template) against llama.cpp's greedy chat answers
//! (tests/fixtures/llamacpp_smollm2_135m.json, made by make_llamacpp_smollm2.py) and against
//! the float64 reference forward pass, teacher-forced along those answers.
#![cfg(not(target_arch = "wasm32"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/reference_model.rs"]
mod reference_model;

use common::{Agreement, RefCase};
use kerze::chat::Message;
use kerze::Engine;
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    model_sha256: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    messages: Vec<Message>,
    #[serde(flatten)]
    reference: RefCase,
}

fn fixture() -> Fixture {
    serde_json::from_str(include_str!("fixtures/llamacpp_smollm2_135m.json")).unwrap()
}

fn engine() -> Engine {
    common::file_engine(&common::smollm2_path())
}

#[test]
fn chat_prompts_equal_llama_cpp_tokenizing_the_rendered_template() {
    let f = fixture();
    assert_eq!(
        kerze::catalog::find("smollm2-135m-instruct")
            .unwrap()
            .unwrap()
            .sha256,
        f.model_sha256
    );
    let e = engine();
    for c in &f.cases {
        let ids = kerze::chat::prompt_ids(e.tokenizer(), &c.messages).unwrap();
        assert_eq!(ids, c.reference.prompt_ids, "{:?}", c.messages);
    }
}

#[test]
fn teacher_forced_along_llama_cpp_greedy_answers_meets_the_gate() {
    let f = fixture();
    assert!(f.cases.len() >= 8);
    let mut e = engine();
    let mut stats = Agreement::default();
    for c in &f.cases {
        let r = &c.reference;
        let seq = r.sequence();
        let top = pollster::block_on(e.logits_top_k(&seq, 10, r.prompt_ids.len() - 1)).unwrap();
        stats.add_case(r, &top);
    }
    eprintln!("SmolLM2 vs llama.cpp: {}", stats.summary());
    // llama.cpp rounds activations to 8 bits (Q8_1 against Q4_1 weights): the gate.
    assert_eq!(stats.strong_agree, stats.strong, "{}", stats.summary());
    assert!(stats.mean_diff() <= 0.3, "{}", stats.summary());
}

/// Against the float64 forward pass over the dequantized weights, two answers (the
/// reference is slow: every position recomputed, 135 M weights in f64).
#[test]
fn teacher_forced_along_llama_cpp_answers_equals_the_f64_reference() {
    let f = fixture();
    let bytes = std::fs::read(common::smollm2_path()).unwrap();
    let reference = reference_model::RefModel::load(&bytes);
    let mut e = engine();
    let mut stats = Agreement::default();
    for c in f.cases.iter().take(2) {
        let r = &c.reference;
        let seq = r.sequence();
        let want = reference.logits(&seq);
        let case = RefCase {
            prompt: r.prompt.clone(),
            prompt_ids: r.prompt_ids.clone(),
            greedy_ids: r.greedy_ids.clone(),
            certain: false,
            top10_per_step: want[r.prompt_ids.len() - 1..seq.len() - 1]
                .iter()
                .map(|row| {
                    let mut idx: Vec<usize> = (0..row.len()).collect();
                    idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
                    idx[..10].iter().map(|&i| (i as u32, row[i])).collect()
                })
                .collect(),
        };
        let top = pollster::block_on(e.logits_top_k(&seq, 10, r.prompt_ids.len() - 1)).unwrap();
        stats.add_case(&case, &top);
    }
    eprintln!("SmolLM2 vs the float64 reference: {}", stats.summary());
    stats.assert_exact();
}
