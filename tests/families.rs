//! Every Llama-block family (Llama with its own LM head and Llama 3 frequency factors,
//! Qwen2 with q/k/v biases, Qwen3 with QK-norm and a head size apart from n_embd / n_head),
//! as tiny synthetic files in several weight types: the engine's teacher-forced logits
//! against the float64 reference forward pass, and greedy decoding step by step against the
//! same run teacher-forced.
#![cfg(not(target_arch = "wasm32"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/reference_model.rs"]
mod reference_model;

use kerze::synth::{tiny_decoder, Quants};
use kerze::{Engine, Family, GenerateOptions, GgmlType, LoadOptions};

const PROMPT: &str = "the cat is in the garden and the dog is on the sofa; \
    then the rain falls on the hills and the river runs to the sea, is it not?";

fn engine(bytes: &[u8]) -> Engine {
    Engine::load(&bytes, &LoadOptions::default(), &mut |_, _| {})
        .unwrap()
        .0
}

fn nmse(a: &[f32], b: &[f64]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - y).powi(2))
        .sum();
    num / b.iter().map(|y| y * y).sum::<f64>()
}

/// The worst NMSE of the engine's full logits over every position of the prompt.
fn worst_nmse(family: Family, q: Quants) -> f64 {
    let bytes = tiny_decoder(family, q, 7).unwrap();
    let mut e = engine(&bytes);
    assert_eq!(e.config().family, family);
    let ids = e.tokenizer().encode_user(PROMPT, true).unwrap();
    assert!(ids.len() > 64, "the prompt must span prefill chunks");
    let n_vocab = e.config().n_vocab;
    let top = pollster::block_on(e.logits_top_k(&ids, n_vocab, 0)).unwrap();
    let reference = reference_model::RefModel::load(&bytes).logits(&ids);
    let mut worst: f64 = 0.0;
    for (mine, want) in top.iter().zip(&reference) {
        let mut full = vec![0f32; n_vocab];
        for &(id, l) in mine {
            full[id as usize] = l;
        }
        worst = worst.max(nmse(&full, want));
    }
    worst
}

const FAMILIES: [Family; 3] = [Family::Llama, Family::Qwen2, Family::Qwen3];

#[test]
fn every_family_in_f32_matches_the_f64_reference() {
    for f in FAMILIES {
        let e = worst_nmse(f, Quants::all(GgmlType::F32));
        eprintln!("{f:?} F32: worst NMSE {e:.2e}");
        // f32 arithmetic only: ~1e-12.
        assert!(e < 1e-9, "{f:?}: NMSE {e}");
    }
}

#[test]
fn every_family_quantized_matches_the_f64_reference() {
    let mixes = [
        Quants {
            embd: GgmlType::Q8_0,
            inner: GgmlType::Q4_K,
            outer: GgmlType::Q6_K,
        },
        Quants {
            embd: GgmlType::F16,
            inner: GgmlType::Q5_0,
            outer: GgmlType::Q8_0,
        },
        // SmolLM2's published file: Q4_1 throughout, the embedding Q8_0.
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
        Quants {
            embd: GgmlType::Q4_0,
            inner: GgmlType::Q2_K,
            outer: GgmlType::Q3_K,
        },
    ];
    for f in FAMILIES {
        for q in mixes {
            let e = worst_nmse(f, q);
            eprintln!("{f:?} {q:?}: worst NMSE {e:.2e}");
            // The weights are exact; activations are rounded to 16 bits per block: see
            // common::TINY_NMSE.
            assert!(e < common::TINY_NMSE, "{f:?} {q:?}: NMSE {e}");
        }
    }
}

#[test]
fn greedy_decode_equals_teacher_forced_in_every_family() {
    for f in FAMILIES {
        let bytes = tiny_decoder(f, Quants::all(GgmlType::Q8_0), 11).unwrap();
        let mut e = engine(&bytes);
        let ids = e
            .tokenizer()
            .encode_user("the rain in the hills", true)
            .unwrap();
        let opts = GenerateOptions::greedy_tokens(16);
        let g = pollster::block_on(e.generate(ids.clone(), &opts, &|| false, &mut |_| {})).unwrap();
        let new = &g.ids[g.prompt_len..];
        assert_eq!(new.len(), 16, "{f:?}");
        let top = pollster::block_on(e.logits_top_k(&g.ids, 1, 0)).unwrap();
        for (k, &id) in new.iter().enumerate() {
            assert_eq!(top[ids.len() - 1 + k][0].0, id, "{f:?} step {k}");
        }
    }
}
