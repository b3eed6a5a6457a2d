//! Prompt-prefix snapshots on the CPU: a prefix saved where the prefill passed it and put into
//! a fresh engine gives the same teacher-forced logits, bit for bit, as the engine that computed
//! it, and the same text; only the rest of the prompt is computed. A damaged or foreign
//! snapshot is a typed error and leaves the engine as if none had been offered.
#![cfg(not(target_arch = "wasm32"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kerze::chat::{shared_prefix_len, ChatOptions, Message};
use kerze::synth::{tiny_decoder, tiny_decoder_with, Quants};
use kerze::{Engine, Family, GenerateOptions, GgmlType};

const SYSTEM: &str = "the cat is in the garden and the dog is on the sofa, then the rain falls \
    on the hills and the river runs to the sea; the boat and the wind and the hills";

fn never() -> bool {
    false
}

fn engine(bytes: &[u8]) -> Engine {
    Engine::load(&bytes, &Default::default(), &mut |_, _| {})
        .unwrap()
        .0
}

/// Run `ids` greedily for 8 tokens, saving the cache after `n` ids: the snapshot and the text.
fn generate_saving(e: &mut Engine, ids: &[u32], n: usize) -> (Vec<u8>, Vec<u32>, usize) {
    let opts = GenerateOptions {
        save_prefix_at: Some(n),
        ..GenerateOptions::greedy_tokens(8)
    };
    let mut g = e.begin(ids.to_vec(), &opts).unwrap();
    let mut snap = None;
    while let Some(event) = pollster::block_on(e.next(&mut g, &never)).unwrap() {
        if event == kerze::Event::PrefixSaved {
            snap = e.take_prefix(&mut g, "model-a");
        }
    }
    let snap = snap.expect("a snapshot at the prefix");
    (snap, g.generated().to_vec(), g.usage.prefill_tokens)
}

/// The tiny Gemma 3 (sliding window 8: its rings wrap inside the prefix) and a tiny Llama
/// (global layers only).
#[test]
fn a_restored_prefix_gives_the_computed_logits_bit_for_bit() {
    let models = [
        kerze::synth::tiny_gemma3().unwrap(),
        tiny_decoder(Family::Llama, Quants::all(GgmlType::Q8_0), 3).unwrap(),
    ];
    for bytes in models {
        let mut a = engine(&bytes);
        let tok = a.tokenizer();
        let prefix = tok.encode_user(SYSTEM, true).unwrap();
        let mut ids = prefix.clone();
        ids.extend(
            tok.encode_user(" and a question about the sea", false)
                .unwrap(),
        );
        let p = prefix.len();
        assert!(p > 2 * kerze::synth::SLIDING_WINDOW, "{p}");
        let (snap, text_a, prefilled_a) = generate_saving(&mut a, &ids, p);
        assert_eq!(prefilled_a, ids.len());
        // The next question after the prefix: the engine's own cache can go back to it only
        // while no sliding-window ring has wrapped (the Gemma's has: a snapshot is needed).
        let mut next = prefix.clone();
        next.extend(a.tokenizer().encode_user(" and the boat", false).unwrap());
        let ring = (0..a.config().n_layer)
            .map(|il| a.config().kv_slots(il))
            .min()
            .unwrap();
        let kept = if ids.len() + text_a.len() > ring {
            0
        } else {
            p
        };
        assert!(a.cached_common(&next) >= kept);
        assert!(kept > 0 || a.cached_common(&next) == 0);

        // Teacher-forced past the prefix: the engine that computed it (its cache holds the
        // prompt; it goes back to the prefix where it can, else it computes it again in the
        // same chunks) and a fresh one with the snapshot.
        let mut forced = ids.clone();
        forced.extend(&text_a);
        let mut b = engine(&bytes);
        assert_eq!(b.restore_prefix(&snap, "model-a", &forced).unwrap(), p);
        assert_eq!(b.cached_common(&forced), p);
        let n_vocab = b.config().n_vocab;
        let got = pollster::block_on(b.logits_from(&forced, n_vocab, p)).unwrap();
        let mut c = engine(&bytes);
        pollster::block_on(c.logits_from(&prefix, 1, p - 1)).unwrap();
        let want = pollster::block_on(c.logits_from(&forced, n_vocab, p)).unwrap();
        assert_eq!(got.len(), forced.len() - p);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let bits = |v: &[(u32, f32)]| {
                v.iter()
                    .map(|&(id, l)| (id, l.to_bits()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(bits(g), bits(w), "position {}", p + i);
        }

        // Generation after the snapshot: the same text, only the question computed.
        let mut d = engine(&bytes);
        assert_eq!(d.restore_prefix(&snap, "model-a", &ids).unwrap(), p);
        let opts = GenerateOptions::greedy_tokens(8);
        let g = pollster::block_on(d.generate(ids.clone(), &opts, &never, &mut |_| {})).unwrap();
        assert_eq!(g.generated(), &text_a[..]);
        assert_eq!(g.usage.prefill_tokens, ids.len() - p);
        assert_eq!(g.usage.prompt_tokens, ids.len());
    }
}

#[test]
fn damaged_or_foreign_snapshots_are_typed_errors_and_leave_the_cache_empty() {
    let bytes = tiny_decoder(Family::Llama, Quants::all(GgmlType::Q8_0), 3).unwrap();
    let mut a = engine(&bytes);
    let ids = a.tokenizer().encode_user(SYSTEM, true).unwrap();
    let p = ids.len() - 4;
    let (snap, ..) = generate_saving(&mut a, &ids, p);
    let kind = |r: kerze::Result<usize>| r.map_err(|e| e.kind());
    let mut b = engine(&bytes);
    for n in [0, 10, snap.len() / 3, snap.len() - 1] {
        assert_eq!(
            kind(b.restore_prefix(&snap[..n], "model-a", &ids)),
            Err("SnapshotError")
        );
    }
    let mut flipped = snap.clone();
    let at = flipped.len() / 2;
    flipped[at] ^= 0x40;
    assert_eq!(
        kind(b.restore_prefix(&flipped, "model-a", &ids)),
        Err("SnapshotError")
    );
    assert_eq!(
        kind(b.restore_prefix(&snap, "model-b", &ids)),
        Err("SnapshotError")
    );
    // A prompt it is not the start of, or that it is all of.
    let mut other = ids.clone();
    other[1] = other[1].wrapping_add(1) % 32;
    assert_eq!(
        kind(b.restore_prefix(&snap, "model-a", &other)),
        Err("SnapshotError")
    );
    assert_eq!(
        kind(b.restore_prefix(&snap, "model-a", &ids[..p])),
        Err("SnapshotError")
    );
    // Another model under the same name: its layers do not fit.
    let mut g = engine(&kerze::synth::tiny_gemma3().unwrap());
    assert_eq!(
        kind(g.restore_prefix(&snap, "model-a", &ids)),
        Err("SnapshotError")
    );
    assert_eq!(g.cached_common(&ids), 0);
    assert_eq!(b.cached_common(&ids), 0);
    // Still a working engine.
    let opts = GenerateOptions::greedy_tokens(3);
    let out = pollster::block_on(b.generate(ids.clone(), &opts, &never, &mut |_| {})).unwrap();
    assert_eq!(out.usage.prefill_tokens, ids.len());
}

fn chat(system: &str, question: &str) -> Vec<Message> {
    serde_json::from_value(serde_json::json!([
        { "role": "system", "content": system },
        { "role": "user", "content": "what is the sea" },
        { "role": "assistant", "content": "the sea is the river" },
        { "role": "user", "content": question },
    ]))
    .unwrap()
}

/// The shared prefix is what two chats differing in their last question have in common, on a
/// Jinja template (ChatML) and on Gemma's built-in format (which folds the system prompt into
/// the first turn).
#[test]
fn the_shared_prefix_of_a_chat_is_everything_before_its_last_question() {
    let models = [
        tiny_decoder_with(Family::Qwen2, Quants::all(GgmlType::Q8_0), 5, true).unwrap(),
        kerze::synth::tiny_gemma3().unwrap(),
    ];
    for bytes in models {
        let e = engine(&bytes);
        let tok = e.tokenizer();
        let opts = ChatOptions::default();
        let a = chat(SYSTEM, "and the boat");
        let b = chat(SYSTEM, "where is the dog");
        let ids_a = kerze::chat::prompt_ids_with(tok, &a, &opts).unwrap();
        let ids_b = kerze::chat::prompt_ids_with(tok, &b, &opts).unwrap();
        let common = ids_a.iter().zip(&ids_b).take_while(|(x, y)| x == y).count();
        let n = shared_prefix_len(tok, &a, &opts, &ids_a).unwrap();
        assert_eq!(n, shared_prefix_len(tok, &b, &opts, &ids_b).unwrap());
        assert!(n <= common && n + 2 >= common, "{n} vs {common}");
        let system_ids = tok.encode_user(SYSTEM, false).unwrap().len();
        assert!(n > system_ids, "{n} ≤ {system_ids}");
        // No user message: nothing shared.
        let only: Vec<Message> =
            serde_json::from_value(serde_json::json!([{ "role": "system", "content": SYSTEM }]))
                .unwrap();
        let ids = kerze::chat::prompt_ids_with(tok, &only, &opts).unwrap_or_default();
        assert_eq!(shared_prefix_len(tok, &only, &opts, &ids).unwrap(), 0);
    }
}
