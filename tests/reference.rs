//! The real model, in process and through the `kerze` CLI, against references that are not us:
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

/// Our top-10 logits at every position of each case's sequence, against the reference's:
/// on the exact path (`--exact`) or on this CPU's default (natively the 8-bit path where the
/// CPU has it). The engine is loaded once for all the cases (the `kerze logits` command,
/// which the prompt and continuation tests run, loaded it for each: 18 loads took half of
/// this file's 45 s); each case starts from an empty cache.
fn teacher_forced(reference: &Reference, exact: bool) -> Agreement {
    let src = kerze::gguf::FileSource::open(&common::model_path()).unwrap();
    let opts = kerze::LoadOptions {
        no_gpu: None,
        device: kerze::Device::Cpu,
        n_ctx: None,
        exact,
    };
    let (mut engine, _) = pollster::block_on(kerze::Engine::load_async(
        Box::new(src),
        &opts,
        &mut |_, _| {},
    ))
    .unwrap();
    let mut stats = Agreement::default();
    for case in &reference.cases {
        let seq = case.sequence();
        engine.reset();
        let top = pollster::block_on(engine.logits_top_k(&seq, 10, 0)).unwrap();
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
    let stats = teacher_forced(&r, true);
    eprintln!("vs float64 reference: {}", stats.summary());
    stats.assert_exact();
}

/// The 8-bit path's gate: as close to the float64 reference as llama.cpp's own logits on the
/// same file (tests/fixtures/llamacpp_on_reference_gemma3_270m.json: llama.cpp teacher-forced
/// on the reference's sequences), and the engine issue's gate.
#[test]
fn eight_bit_path_is_as_close_to_float64_as_llama_cpp() {
    let r: Reference =
        serde_json::from_str(include_str!("fixtures/reference_gemma3_270m.json")).unwrap();
    let peer: Reference = serde_json::from_str(include_str!(
        "fixtures/llamacpp_on_reference_gemma3_270m.json"
    ))
    .unwrap();
    let mut llama = Agreement::default();
    for (case, theirs) in r.cases.iter().zip(&peer.cases) {
        assert_eq!(case.sequence(), theirs.sequence(), "the same sequences");
        let top: Vec<Vec<(u32, f32)>> = theirs
            .top10_per_step
            .iter()
            .map(|t| t.iter().map(|&(id, l)| (id, l as f32)).collect())
            .collect();
        llama.add_case(case, &top);
    }
    let ours = teacher_forced(&r, false);
    eprintln!("llama.cpp vs float64: {}", llama.summary());
    eprintln!("8-bit path vs float64: {}", ours.summary());
    ours.assert_gate();
    ours.assert_as_close_as(&llama);
}

#[test]
fn llama_cpp_gate() {
    let r: Reference =
        serde_json::from_str(include_str!("fixtures/llamacpp_gemma3_270m.json")).unwrap();
    let open: Vec<_> = r.cases.iter().filter(|c| !c.certain).collect();
    assert!(open.len() >= 5, "need ≥ 5 open prompts");
    for exact in [true, false] {
        let stats = teacher_forced(&r, exact);
        eprintln!("vs llama.cpp (exact: {exact}): {}", stats.summary());
        stats.assert_gate();
    }
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
