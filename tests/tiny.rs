//! The tiny synthetic Gemma 3: the engine (chunked prefill, ring KV cache, decode loop)
//! against the slow f64 reference, and the golden file the browser test checks against.
#![cfg(not(target_arch = "wasm32"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/reference_model.rs"]
mod reference_model;

use common::TinyGolden;
use kerze::{Engine, GenerateOptions, LoadOptions, SamplerConfig};

const PROMPT: &str =
    "the cat is in the garden and the dog is on the sofa, <start_of_turn> is text here; \
    then the rain falls on the hills and the river runs to the sea, is it not? ünïcödé 🙂";

fn never() -> bool {
    false
}

/// The engine on the exact path, which the float64 golden logits hold (natively the default
/// is the 8-bit path: tests/families.rs holds it to llama.cpp).
fn engine(bytes: &[u8]) -> Engine {
    let opts = LoadOptions {
        exact: true,
        ..LoadOptions::default()
    };
    Engine::load(&bytes, &opts, &mut |_, _| {}).unwrap().0
}

fn nmse_f64(a: &[f32], b: &[f64]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| (f64::from(*x) - y).powi(2))
        .sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    num / den
}

#[test]
fn engine_matches_f64_reference_with_ring_and_chunks() {
    let bytes = kerze::synth::tiny_gemma3().unwrap();
    let mut e = engine(&bytes);
    let ids = e.tokenizer().encode_user(PROMPT, true).unwrap();
    assert!(
        ids.len() > 64 + kerze::synth::SLIDING_WINDOW,
        "prompt must span chunks and wrap the ring: {}",
        ids.len()
    );
    assert!(!ids.contains(&5), "user text became <start_of_turn>");
    let n_vocab = e.config().n_vocab;
    let top = pollster::block_on(e.logits_top_k(&ids, n_vocab, 0)).unwrap();
    let reference = reference_model::RefModel::load(&bytes).logits(&ids);
    let mut worst: f64 = 0.0;
    for (pos, (mine, want)) in top.iter().zip(&reference).enumerate() {
        let mut full = vec![0f32; n_vocab];
        for &(id, l) in mine {
            full[id as usize] = l;
        }
        let e = nmse_f64(&full, want);
        worst = worst.max(e);
        if std::env::var_os("KERZE_DEBUG").is_some() {
            eprintln!("pos {pos} nmse {e:.2e}");
        }
        // See common::TINY_NMSE: rounding only, flat over positions (the first included).
        assert!(e < common::TINY_NMSE, "position {pos}: NMSE {e}");
    }
    eprintln!(
        "tiny model vs f64 reference: worst NMSE {worst:.2e} over {} positions",
        ids.len()
    );
}

#[test]
fn decode_step_by_step_equals_teacher_forced() {
    let bytes = kerze::synth::tiny_gemma3().unwrap();
    let mut e = engine(&bytes);
    let ids = e
        .tokenizer()
        .encode_user("the rain in the hills", true)
        .unwrap();
    let opts = GenerateOptions::greedy_tokens(20);
    let g = pollster::block_on(e.generate(ids.clone(), &opts, &never, &mut |_| {})).unwrap();
    assert_eq!(g.generated().len(), 20);
    let seq = g.ids.clone();
    let top = pollster::block_on(e.logits_top_k(&seq, 2, ids.len() - 1)).unwrap();
    for (k, &id) in g.generated().iter().enumerate() {
        let t = &top[k];
        // Greedy choice equals the teacher-forced argmax unless the two are a near-tie.
        assert!(
            t[0].0 == id || (t[0].1 - t[1].1).abs() < 1e-3,
            "step {k}: generated {id}, teacher-forced {t:?}"
        );
    }
}

#[test]
fn reusing_the_cache_for_an_extended_prompt_gives_the_same_tokens() {
    let bytes = kerze::synth::tiny_gemma3().unwrap();
    let mut e = engine(&bytes);
    let opts = GenerateOptions::greedy_tokens(12);
    let ids = e
        .tokenizer()
        .encode_user("the sea and the river", true)
        .unwrap();
    let first = pollster::block_on(e.generate(ids, &opts, &never, &mut |_| {})).unwrap();
    // Continue from everything so far: only the new token is computed.
    let cont = first.ids.clone();
    let a = pollster::block_on(e.generate(cont.clone(), &opts, &never, &mut |_| {})).unwrap();
    assert_eq!(
        a.usage.prefill_tokens, 1,
        "the cache should hold all but the last token"
    );
    e.reset();
    let b = pollster::block_on(e.generate(cont, &opts, &never, &mut |_| {})).unwrap();
    assert_eq!(a.generated(), b.generated());
}

/// A prompt that shares only a beginning with what the cache holds keeps that beginning (the
/// rest is computed again) and generates what a fresh engine generates: on a model without a
/// sliding window at any length, on a sliding-window model while its ring has not wrapped
/// (after that, everything is computed again).
#[test]
fn a_prompt_sharing_a_prefix_reuses_it_and_equals_a_fresh_run() {
    use kerze::config::Family;
    use kerze::gguf::GgmlType;
    let llama =
        kerze::synth::tiny_decoder(Family::Llama, kerze::synth::Quants::all(GgmlType::Q8_0), 7)
            .unwrap();
    let gemma = kerze::synth::tiny_gemma3().unwrap();
    for (name, bytes, wraps_after) in [("llama", &llama, usize::MAX), ("gemma3", &gemma, 0)] {
        let mut e = engine(bytes);
        let window = e.config().sliding_window.unwrap_or(usize::MAX);
        let wraps_after = if wraps_after == 0 {
            window
        } else {
            wraps_after
        };
        let opts = GenerateOptions::greedy_tokens(6);
        let tok = e.tokenizer();
        let a = tok
            .encode_user("the sea and the river and the hills", true)
            .unwrap();
        let b = tok
            .encode_user("the sea and the river met a boat", true)
            .unwrap();
        let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        assert!(
            common > 2 && common < b.len(),
            "{name}: prompts share {common}"
        );
        let first = pollster::block_on(e.generate(a.clone(), &opts, &never, &mut |_| {})).unwrap();
        let held = first.ids.len() - 1; // the last sampled token is never fed
        let g = pollster::block_on(e.generate(b.clone(), &opts, &never, &mut |_| {})).unwrap();
        let expect = if held <= wraps_after {
            b.len() - common
        } else {
            b.len()
        };
        assert_eq!(
            g.usage.prefill_tokens, expect,
            "{name}: computed prompt tokens"
        );
        // The same prompt again: all but its last token from the cache.
        let again = pollster::block_on(e.generate(b.clone(), &opts, &never, &mut |_| {})).unwrap();
        assert_eq!(again.generated(), g.generated(), "{name}");
        let fresh =
            pollster::block_on(engine(bytes).generate(b.clone(), &opts, &never, &mut |_| {}))
                .unwrap();
        assert_eq!(g.generated(), fresh.generated(), "{name}: after going back");
        let held = g.ids.len() - 1;
        let expect = if held <= wraps_after { 1 } else { b.len() };
        assert_eq!(
            again.usage.prefill_tokens, expect,
            "{name}: the same prompt again"
        );
    }
}

fn golden_now(bytes: &[u8]) -> TinyGolden {
    let e = engine(bytes);
    let prompt = PROMPT.to_string();
    let prompt_ids = e.tokenizer().encode_user(&prompt, true).unwrap();
    let reference = reference_model::RefModel::load(bytes).logits(&prompt_ids);
    let positions: Vec<usize> = (0..prompt_ids.len())
        .step_by(9)
        .chain([prompt_ids.len() - 1])
        .collect();
    let logits = positions
        .iter()
        .map(|&p| reference[p].iter().map(|&x| x as f32).collect())
        .collect();
    TinyGolden {
        made_by: "the f64 reference forward pass (tests/common/reference_model.rs) on kerze::synth::tiny_gemma3(); regenerate with KERZE_BLESS=1 cargo test --release --test tiny".into(),
        prompt,
        prompt_ids,
        positions,
        logits,
    }
}

#[test]
fn golden_file_is_current_and_the_engine_meets_it() {
    let bytes = kerze::synth::tiny_gemma3().unwrap();
    let now = golden_now(&bytes);
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/tiny_golden.json"
    );
    if std::env::var_os("KERZE_BLESS").is_some() {
        std::fs::write(path, serde_json::to_string(&now).unwrap()).unwrap();
    }
    let golden: TinyGolden = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(golden.prompt_ids, now.prompt_ids);
    assert_eq!(golden.positions, now.positions);
    for (a, b) in golden.logits.iter().zip(&now.logits) {
        assert!(
            common::nmse(a, b) < 1e-10,
            "the synthetic model or the reference changed: bless again"
        );
    }
    let mut e = engine(&bytes);
    let n_vocab = e.config().n_vocab;
    let rows = pollster::block_on(e.logits_top_k(&golden.prompt_ids, n_vocab, 0)).unwrap();
    common::check_tiny_logits(&golden, &rows);
}

#[test]
fn sampling_is_seeded_and_stop_strings_cut() {
    let bytes = kerze::synth::tiny_gemma3().unwrap();
    let mut e = engine(&bytes);
    let ids = e.tokenizer().encode_user("the", true).unwrap();
    let opts = |seed| GenerateOptions {
        max_tokens: 16,
        sampler: SamplerConfig {
            temperature: 1.0,
            seed,
            ..SamplerConfig::default()
        },
        stop: vec![],
        stop_tokens: Some(vec![]),
        ..Default::default()
    };
    let run = |e: &mut Engine, o: &GenerateOptions| {
        let mut text = String::new();
        let g =
            pollster::block_on(e.generate(ids.clone(), o, &never, &mut |c| text.push_str(&c.text)))
                .unwrap();
        (g.generated().to_vec(), text)
    };
    let (a, text_a) = run(&mut e, &opts(1));
    let (b, _) = run(&mut e, &opts(1));
    let (c, _) = run(&mut e, &opts(2));
    assert_eq!(a, b);
    assert_ne!(a, c);
    // Streamed pieces concatenate to the decoded text. (Random weights also emit invalid
    // byte sequences; their U+FFFD placement depends on how far one looks ahead.)
    let decoded = e.tokenizer().decode(&a, false).unwrap();
    if !decoded.contains('\u{FFFD}') {
        assert_eq!(text_a, decoded);
    }
    // A stop string taken from the middle of that text ends the generation before it.
    let chars: Vec<char> = text_a.chars().collect();
    if chars.len() > 6 {
        let stop: String = chars[3..6].iter().collect();
        let o = GenerateOptions {
            stop: vec![stop.clone()],
            ..opts(1)
        };
        let (_, t) = run(&mut e, &o);
        assert!(
            !t.contains(&stop) && text_a.starts_with(&t),
            "stop {stop:?}: {t:?} vs {text_a:?}"
        );
    }
}

#[test]
fn abort_stops_between_steps_and_the_engine_stays_usable() {
    let bytes = kerze::synth::tiny_gemma3().unwrap();
    let mut e = engine(&bytes);
    let ids = e.tokenizer().encode_user("the cat", true).unwrap();
    let opts = GenerateOptions::greedy_tokens(50);
    let steps = std::cell::Cell::new(0);
    let abort = || steps.get() >= 3;
    let mut g = pollster::block_on(e.start(ids.clone(), &opts, &abort)).unwrap();
    let mut err = None;
    loop {
        match pollster::block_on(e.step(&mut g, &abort)) {
            Ok(Some(_)) => steps.set(steps.get() + 1),
            Ok(None) => break,
            Err(x) => {
                err = Some(x);
                break;
            }
        }
    }
    assert!(matches!(err, Some(kerze::Error::Aborted)), "{err:?}");
    assert_eq!(steps.get(), 3);
    let g = pollster::block_on(e.generate(
        ids,
        &GenerateOptions {
            max_tokens: 5,
            ..opts
        },
        &never,
        &mut |_| {},
    ))
    .unwrap();
    assert_eq!(g.generated().len(), 5);
}

#[test]
fn abort_during_a_long_prefill_leaves_the_cache_consistent() {
    let bytes = kerze::synth::tiny_gemma3().unwrap();
    let mut e = engine(&bytes);
    let ids = e
        .tokenizer()
        .encode_user(&"the cat and the dog ".repeat(40), true)
        .unwrap();
    assert!(
        ids.len() > 2 * kerze::backend::PREFILL_CHUNK,
        "needs several prefill chunks"
    );
    // Abort after the first chunk has run.
    let calls = std::cell::Cell::new(0);
    let abort = || {
        calls.set(calls.get() + 1);
        calls.get() > 1
    };
    let r = pollster::block_on(e.start(ids.clone(), &GenerateOptions::greedy_tokens(4), &abort));
    assert!(matches!(r, Err(kerze::Error::Aborted)), "{:?}", r.err());
    // The cache holds the first chunk only; a new run continues from it and equals a fresh one.
    let a = pollster::block_on(e.generate(
        ids.clone(),
        &GenerateOptions::greedy_tokens(4),
        &never,
        &mut |_| {},
    ))
    .unwrap();
    assert_eq!(
        a.usage.prefill_tokens,
        ids.len() - kerze::backend::PREFILL_CHUNK
    );
    e.reset();
    let b = pollster::block_on(e.generate(
        ids,
        &GenerateOptions::greedy_tokens(4),
        &never,
        &mut |_| {},
    ))
    .unwrap();
    assert_eq!(a.generated(), b.generated());
}

#[test]
fn context_overflow_is_a_typed_error() {
    let bytes = kerze::synth::tiny_gemma3().unwrap();
    let (mut e, _) = Engine::load(
        &bytes,
        &LoadOptions {
            no_gpu: None,
            n_ctx: Some(16),
            ..Default::default()
        },
        &mut |_, _| {},
    )
    .unwrap();
    let ids = e
        .tokenizer()
        .encode_user(&"the cat ".repeat(20), true)
        .unwrap();
    let r = pollster::block_on(e.start(ids, &GenerateOptions::default(), &never));
    assert!(matches!(r, Err(kerze::Error::ContextFull { .. })));
    // A prompt that fits, with max_tokens past the context: ends with ContextFull, no error.
    let ids = e.tokenizer().encode_user("the cat", true).unwrap();
    let opts = GenerateOptions::greedy_tokens(100);
    let g = pollster::block_on(e.generate(ids, &opts, &never, &mut |_| {})).unwrap();
    assert_eq!(g.finish(), Some(kerze::FinishReason::ContextFull));
    assert_eq!(g.ids.len(), 16);
}

/// A model file whose reads of the weights wait once each, as the browser's read-ahead does
/// (`ByteSource::read_at_async`), and whose plain reads stop short of the weights.
struct Waiting {
    bytes: Vec<u8>,
    data_offset: u64,
    /// Each asynchronous read's offset, and how many of them waited.
    reads: std::sync::Arc<std::sync::Mutex<(Vec<u64>, usize)>>,
}

/// Pending once (its waker woken), then ready.
struct YieldOnce(bool);

impl std::future::Future for YieldOnce {
    type Output = ();
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

impl kerze::ByteSource for Waiting {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> kerze::Result<()> {
        if offset >= self.data_offset {
            return Err(kerze::Error::Io(format!(
                "a plain read of the weights at {offset}"
            )));
        }
        self.bytes.as_slice().read_at(offset, buf)
    }

    fn read_at_async<'a>(&'a self, offset: u64, buf: &'a mut [u8]) -> kerze::gguf::ReadFuture<'a> {
        Box::pin(async move {
            self.reads.lock().unwrap().0.push(offset);
            YieldOnce(false).await;
            self.reads.lock().unwrap().1 += 1;
            self.bytes.as_slice().read_at(offset, buf)
        })
    }
}

/// The asynchronous load takes every weight through reads that wait, in the file's order
/// (a reader ahead of it never goes back), and loads the model the plain load does: the same
/// logits, bit for bit. The plain load of the same file never awaits a read.
#[test]
fn a_load_whose_reads_wait_equals_the_plain_load() {
    let bytes = kerze::synth::tiny_gemma3().unwrap();
    let g = kerze::Gguf::read(&bytes).unwrap();
    let reads = std::sync::Arc::new(std::sync::Mutex::new((Vec::new(), 0)));
    let src = Waiting {
        bytes: bytes.clone(),
        data_offset: g.data_offset,
        reads: reads.clone(),
    };
    // On the exact path, as `engine` loads the plain one.
    let opts = LoadOptions {
        no_gpu: None,
        device: kerze::Device::Cpu,
        exact: true,
        ..LoadOptions::default()
    };
    // The plain load over this source fails at its first weight: it does not await.
    assert!(Engine::load(&src, &opts, &mut |_, _| {}).is_err());
    assert_eq!(reads.lock().unwrap().0.len(), 0);
    let mut waited = pollster::block_on(Engine::load_async(Box::new(src), &opts, &mut |_, _| {}))
        .unwrap()
        .0;
    let (offsets, n_waited) = reads.lock().unwrap().clone();
    assert!(offsets.len() >= g.tensors.len(), "{} reads", offsets.len());
    assert_eq!(n_waited, offsets.len());
    assert!(
        offsets.windows(2).all(|w| w[0] <= w[1]),
        "reads went back: {offsets:?}"
    );
    let mut plain = engine(&bytes);
    let ids = plain.tokenizer().encode_user(PROMPT, true).unwrap();
    let n_vocab = plain.config().n_vocab;
    let want = pollster::block_on(plain.logits_top_k(&ids, n_vocab, 0)).unwrap();
    let got = pollster::block_on(waited.logits_top_k(&ids, n_vocab, 0)).unwrap();
    assert_eq!(got, want);
}

/// What `probe` states before a download: the engine's memory plan from the file's first
/// bytes is the whole file's; a prefix short of the header asks for more (`None`), not an
/// error; a file that is no GGUF is a typed error; and the plan counts what the load holds.
#[test]
fn memory_plan_from_the_header_alone() {
    let bytes = kerze::synth::tiny_gemma3().unwrap();
    let len = bytes.len() as u64;
    let whole = kerze::engine::plan_prefix(&bytes, len, Some(256))
        .unwrap()
        .unwrap();
    let header = whole.header_bytes as usize;
    let from_header = kerze::engine::plan_prefix(&bytes[..header], len, Some(256))
        .unwrap()
        .unwrap();
    assert_eq!(
        serde_json::to_value(&from_header).unwrap(),
        serde_json::to_value(&whole).unwrap()
    );
    assert!(
        kerze::engine::plan_prefix(&bytes[..header / 2], len, Some(256))
            .unwrap()
            .is_none()
    );
    let e = kerze::engine::plan_prefix(b"not a model at all, just text", 1 << 20, None);
    assert!(e.is_err(), "{e:?}");
    // The KV cache follows the context; the weights are the load's own accounting.
    let longer = kerze::engine::plan_prefix(&bytes[..header], len, Some(512))
        .unwrap()
        .unwrap();
    assert!(longer.kv_bytes > whole.kv_bytes);
    assert_eq!(longer.weight_bytes, whole.weight_bytes);
    assert!(whole.vocabulary_bytes > 0 && whole.peak_bytes > whole.weight_bytes + whole.kv_bytes);
}
