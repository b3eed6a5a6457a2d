//! The real model, through the `kerze` CLI, against references that are not us:
//! the float64 forward pass of shared/reference (copied to tests/fixtures), and llama.cpp
//! itself (tests/fixtures/llamacpp_gemma3_270m.json), teacher-forced position by position;
//! plus free-running greedy text where the continuation is nearly certain.
#![cfg(not(target_arch = "wasm32"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Agreement, Reference};
use std::process::Command;

fn kerze(args: &[&str]) -> serde_json::Value {
    let model = common::model_path();
    let out = Command::new(env!("CARGO_BIN_EXE_kerze"))
        .args(args)
        .arg("--model")
        .arg(&model)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kerze {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn teacher_forced(reference: &Reference) -> Agreement {
    let mut stats = Agreement::default();
    for case in &reference.cases {
        let seq: Vec<String> = case.sequence().iter().map(u32::to_string).collect();
        let v = kerze(&["logits", "--ids", &seq.join(","), "--top", "10"]);
        let top: Vec<Vec<(u32, f32)>> = serde_json::from_value(v["top"].clone()).unwrap();
        assert_eq!(top.len(), seq.len());
        stats.add_case(case, &top[case.prompt_ids.len() - 1..]);
    }
    stats
}

#[test]
fn float64_reference_gate() {
    let r: Reference =
        serde_json::from_str(include_str!("fixtures/reference_gemma3_270m.json")).unwrap();
    assert!(
        r.cases.iter().any(|c| c.prompt_ids.len() > 512),
        "the sliding window must be exercised"
    );
    let stats = teacher_forced(&r);
    eprintln!("vs float64 reference: {}", stats.summary());
    stats.assert_exact();
}

#[test]
fn llama_cpp_gate() {
    let r: Reference =
        serde_json::from_str(include_str!("fixtures/llamacpp_gemma3_270m.json")).unwrap();
    let open: Vec<_> = r.cases.iter().filter(|c| !c.certain).collect();
    assert!(open.len() >= 5, "need ≥ 5 open prompts");
    let stats = teacher_forced(&r);
    eprintln!("vs llama.cpp: {}", stats.summary());
    stats.assert_gate();
}

#[test]
fn prompt_ids_equal_the_references() {
    for file in [
        include_str!("fixtures/reference_gemma3_270m.json"),
        include_str!("fixtures/llamacpp_gemma3_270m.json"),
    ] {
        let r: Reference = serde_json::from_str(file).unwrap();
        for case in &r.cases {
            let out = Command::new(env!("CARGO_BIN_EXE_kerze"))
                .args(["tokenize", "--json", "--model"])
                .arg(common::model_path())
                .args(["--text", &case.prompt])
                .output()
                .unwrap();
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let ids: Vec<u32> = serde_json::from_value(v["ids"].clone()).unwrap();
            assert_eq!(ids, case.prompt_ids, "{:?}", case.prompt);
        }
    }
}

#[test]
fn certain_continuations_are_identical_for_16_tokens() {
    let r: Reference =
        serde_json::from_str(include_str!("fixtures/llamacpp_gemma3_270m.json")).unwrap();
    let certain: Vec<_> = r.cases.iter().filter(|c| c.certain).collect();
    assert!(certain.len() >= 2, "need the counting and alphabet prompts");
    for case in certain {
        let v = kerze(&[
            "generate",
            "--prompt",
            &case.prompt,
            "--max-tokens",
            "16",
            "--temperature",
            "0",
        ]);
        let ids: Vec<u32> = serde_json::from_value(v["ids"].clone()).unwrap();
        let prompt_ids: Vec<u32> = serde_json::from_value(v["prompt_ids"].clone()).unwrap();
        assert_eq!(prompt_ids, case.prompt_ids);
        assert_eq!(
            ids,
            case.greedy_ids[..16],
            "{:?} → {:?}",
            case.prompt,
            v["text"]
        );
    }
}
