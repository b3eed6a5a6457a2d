//! The `kerze` command line as a script would use it: JSON shapes, stdin, typed failures,
//! and `fetch` trying each source in order (exercised with local `file://` sources).
#![cfg(not(target_arch = "wasm32"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

fn kerze() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kerze"))
}

/// Run `cmd`, which must succeed (else its stderr is the failure), and parse its stdout.
fn json_of(cmd: &mut Command) -> serde_json::Value {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn tokenize_reads_stdin_like_text() {
    let model = common::model_path();
    let text = "Grüße aus Köln 🙂\n<start_of_turn>user";
    let a = kerze()
        .args(["tokenize", "--json", "--text", text])
        .arg("--model")
        .arg(&model)
        .output()
        .unwrap();
    let mut child = kerze()
        .args(["tokenize", "--json", "--model"])
        .arg(&model)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let b = child.wait_with_output().unwrap();
    assert!(a.status.success() && b.status.success());
    assert_eq!(a.stdout, b.stdout);
    let v: serde_json::Value = serde_json::from_slice(&a.stdout).unwrap();
    let ids: Vec<u32> = serde_json::from_value(v["ids"].clone()).unwrap();
    assert_eq!(ids[0], 2, "<bos> first");
    assert!(
        ids.contains(&105),
        "raw tokenization parses <start_of_turn>: {ids:?}"
    );
}

/// <bos> exactly as the file's add_bos_token says: Gemma's says yes (above), SmolLM2's no —
/// its <|im_start|> (the bos id) comes only from the text; and a file kerze wrote that asks
/// for none gets none.
/// A reader that stops early (`kerze tokenize … | head -1`) ends the command quietly, by
/// SIGPIPE as `cat` would, not with a panic's message and exit code 101.
#[cfg(unix)]
#[test]
fn a_closed_stdout_ends_quietly() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::ExitStatusExt;
    let mut child = kerze()
        .args(["tokenize", "--model"])
        .arg(common::model_path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all("hello world ".repeat(20_000).as_bytes())
        .unwrap();
    drop(stdin);
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(!first.is_empty());
    // stdout is closed here: the rest of ~40 000 lines cannot be written.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.signal(), Some(13), "{:?} {stderr}", out.status);
}

#[test]
fn tokenize_adds_bos_as_the_file_says() {
    let tok = |model: &std::path::Path, text: &str| -> Vec<u32> {
        let v = json_of(
            kerze()
                .args(["tokenize", "--json", "--text", text, "--model"])
                .arg(model),
        );
        serde_json::from_value(v["ids"].clone()).unwrap()
    };
    let smol = common::smollm2_path();
    assert_eq!(
        tok(&smol, "<|im_start|>user\nHi")[0],
        1,
        "control tokens are parsed"
    );
    let ids = tok(&smol, "Hi there");
    assert!(!ids.contains(&1), "no <bos> added: {ids:?}");
    let dir = std::env::temp_dir().join(format!("kerze-cli-bos-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("tiny-qwen2.gguf");
    let out = kerze()
        .args(["synth", "--family", "qwen2", "--tokenizer", "gpt2", "--out"])
        .arg(&f)
        .output()
        .unwrap();
    assert!(out.status.success());
    let ids = tok(&f, "hello the world");
    let with_bos = tok(&f, "<|endoftext|>hello the world");
    assert_eq!(with_bos.len(), ids.len() + 1, "{ids:?} vs {with_bos:?}");
    assert_eq!(&with_bos[1..], &ids[..], "no <bos> added");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn inspect_and_generate_json_shapes() {
    let model = common::model_path();
    let v = json_of(kerze().args(["inspect", "--json", "--model"]).arg(&model));
    assert_eq!(v["config"]["n_layer"], 18);
    assert_eq!(v["config"]["n_vocab"], 262_144);
    assert_eq!(v["tensor_types"]["Q5_0"]["count"], 81);
    let v = json_of(
        kerze()
            .args([
                "generate",
                "--json",
                "--prompt",
                "Hello",
                "--max-tokens",
                "3",
                "--temperature",
                "0",
                "--model",
            ])
            .arg(&model),
    );
    for key in [
        "prompt_ids",
        "ids",
        "text",
        "prefill_tokens_per_s",
        "decode_tokens_per_s",
    ] {
        assert!(!v[key].is_null(), "generate --json lacks {key}: {v}");
    }
    assert_eq!(v["ids"].as_array().unwrap().len(), 3);
}

#[test]
fn bad_arguments_fail_with_a_clear_message() {
    let cases: &[(&[&str], i32, &str)] = &[
        (
            &[
                "generate",
                "--model",
                "/nonexistent/x.gguf",
                "--prompt",
                "hi",
            ],
            1,
            "no file at /nonexistent/x.gguf",
        ),
        (
            &["generate", "--model", "gemma-9000", "--prompt", "hi"],
            1,
            "known ids: gemma-3-270m",
        ),
        (
            &["logits", "--model", "gemma-3-270m", "--ids", "2,abc"],
            2,
            "`abc` is not a token id",
        ),
        (&["frobnicate"], 2, "unrecognized subcommand 'frobnicate'"),
        (
            &["generate", "--prompt"],
            2,
            "a value is required for '--prompt <PROMPT>'",
        ),
        // An unknown flag is an error, not silently ignored (a misspelt --temperature).
        (
            &[
                "generate",
                "--model",
                "m",
                "--prompt",
                "hi",
                "--temprature",
                "0",
            ],
            2,
            "unexpected argument '--temprature'",
        ),
        (
            &[
                "generate",
                "--model",
                "m",
                "--prompt",
                "hi",
                "--max-tokens",
                "many",
            ],
            2,
            "invalid value 'many' for '--max-tokens <MAX_TOKENS>'",
        ),
        (
            &[
                "generate", "--model", "m", "--prompt", "hi", "--device", "tpu",
            ],
            2,
            "invalid value 'tpu' for '--device <DEVICE>'",
        ),
        (&["tokenize"], 2, "--model <MODEL>"),
        (&["synth", "--out", "x.gguf"], 2, "--family <FAMILY>"),
        (
            &[
                "synth", "--family", "gemma3", "--seed", "3", "--out", "x.gguf",
            ],
            2,
            "--seed is for --shape-of",
        ),
        (
            &[
                "synth", "--family", "gemma3", "--vocab", "t.json", "--out", "x.gguf",
            ],
            2,
            "--vocab is for --like",
        ),
        (
            &[
                "synth",
                "--family",
                "gemma3",
                "--shape-of",
                "h.gguf",
                "--out",
                "x.gguf",
            ],
            2,
            "cannot be used with",
        ),
        (
            &["serve", "--model", "m", "--slots", "0"],
            2,
            "invalid value '0' for '--slots <SLOTS>'",
        ),
        (
            &["serve", "--model", "m", "--port", "70000"],
            2,
            "invalid value '70000' for '--port <PORT>'",
        ),
        (
            &["serve", "--model", "m", "--api_key", "k"],
            2,
            "unexpected argument '--api_key'",
        ),
    ];
    for (args, code, msg) in cases {
        let out = kerze().args(*args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(*code), "{args:?}: {err}");
        assert!(err.contains(msg), "{args:?}: {err}");
    }
    let model = common::model_path();
    let out = kerze()
        .args([
            "generate",
            "--prompt",
            "hi",
            "--temperature",
            "-1",
            "--model",
        ])
        .arg(&model)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("temperature -1 must be ≥ 0"));
}

/// Every command has --help (exit 0, its own flags listed); the device default is the
/// library's, `auto`.
#[test]
fn every_command_has_help() {
    for (cmd, flag) in [
        ("fetch", "MODEL"),
        ("generate", "--max-tokens"),
        ("chat", "--enable-thinking"),
        ("tokenize", "--text"),
        ("logits", "--ids"),
        ("bench", "--prompt-tokens"),
        ("inspect", "--json"),
        ("synth", "--family"),
        ("serve", "--cors-origin"),
    ] {
        let out = kerze().args([cmd, "--help"]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{cmd} --help");
        assert!(text.contains(flag), "{cmd} --help lacks {flag}: {text}");
    }
    let out = kerze().args(["generate", "--help"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("[default: auto]"));
    let out = kerze().arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in [
        "fetch", "generate", "chat", "tokenize", "logits", "bench", "inspect", "synth", "serve",
    ] {
        assert!(text.contains(cmd), "kerze --help lacks {cmd}");
    }
}

/// `kerze bench` decodes greedily by default and samples with --temperature (top-k 40 unless
/// --top-k says otherwise), always the asked number of tokens (end of sequence ignored).
#[test]
fn bench_decodes_greedily_or_samples() {
    let model = common::model_path();
    let run = |extra: &[&str]| -> serde_json::Value {
        json_of(
            kerze()
                .args(["bench", "--json", "--device", "cpu", "--prompt-tokens", "5"])
                .args(["--gen-tokens", "6"])
                .args(extra)
                .arg("--model")
                .arg(&model),
        )
    };
    let greedy = run(&[]);
    assert_eq!(greedy["gen_tokens"], 6);
    assert_eq!(greedy["sampler"]["temperature"], 0.0);
    assert_eq!(greedy["sampler"]["top_k"], 1);
    let sampled = run(&["--temperature", "0.8"]);
    assert_eq!(sampled["gen_tokens"], 6);
    assert_eq!(sampled["sampler"]["top_k"], 40);
    assert!((sampled["sampler"]["temperature"].as_f64().unwrap() - 0.8).abs() < 1e-6);
    let all = run(&["--temperature", "1", "--top-k", "0"]);
    assert_eq!(all["gen_tokens"], 6);
    assert_eq!(all["sampler"]["top_k"], 0);
    assert!(greedy["read_rate"].is_null());
    // --read-rate: the machine's read rate and the decode's weight reads against it.
    let rated = run(&["--read-rate"]);
    let r = &rated["read_rate"];
    let (gb, mb, share) = (
        r["gb_per_s"].as_f64().unwrap(),
        r["weights_mb_per_decode_step"].as_f64().unwrap(),
        r["decode_share"].as_f64().unwrap(),
    );
    assert!(gb > 0.1 && gb < 10_000.0, "{r}");
    // Gemma 3 270M: its tied head alone is 262 144 × 640 int8 values; all its 268 M
    // parameters in f32 would be ~1 GB.
    assert!(mb > 262_144.0 * 640.0 / 1e6 && mb < 1100.0, "{r}");
    let decode = rated["decode_tokens_per_s"].as_f64().unwrap();
    assert!(
        (share - decode * mb / 1e3 / gb).abs() < 1e-9 * share.max(1.0),
        "{r}"
    );
    // --top-k alone would silently do nothing: refused.
    let out = kerze()
        .args(["bench", "--top-k", "5", "--model"])
        .arg(&model)
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// `kerze chat` renders the model's own template: its prompt ids equal llama.cpp tokenizing
/// jinja2's rendering of the same conversation (the SmolLM2 fixture), and the greedy answer's
/// first token is llama.cpp's (a clear position); --messages takes an OpenAI messages file.
#[test]
fn chat_uses_the_models_template() {
    let f: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/llamacpp_smollm2_135m.json")).unwrap();
    let case = &f["cases"][2];
    let run = |args: &[&str]| -> serde_json::Value {
        json_of(
            kerze()
                .args([
                    "chat",
                    "--json",
                    "--max-tokens",
                    "4",
                    "--temperature",
                    "0",
                    "--model",
                ])
                .arg(common::smollm2_path())
                .args(args),
        )
    };
    let m = &case["messages"];
    let v = run(&[
        "--system",
        m[0]["content"].as_str().unwrap(),
        "--message",
        m[1]["content"].as_str().unwrap(),
    ]);
    assert_eq!(v["prompt_ids"], case["prompt_ids"]);
    assert_eq!(v["ids"][0], case["greedy_ids"][0]);
    assert!(
        v["reasoning_content"].is_null() && v["content"].is_string(),
        "{v}"
    );
    let dir = std::env::temp_dir().join(format!("kerze-cli-chat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("messages.json");
    std::fs::write(&file, serde_json::to_vec(m).unwrap()).unwrap();
    let w = run(&["--messages", file.to_str().unwrap()]);
    assert_eq!(w["prompt_ids"], case["prompt_ids"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fetch_tries_sources_in_order_verifies_and_is_then_a_no_op() {
    use kerze::catalog::{fetch, Entry, Source};
    let dir = std::env::temp_dir().join(format!("kerze-fetch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let right = dir.join("src/right.bin");
    let wrong = dir.join("src/wrong.bin");
    std::fs::write(&right, b"the model bytes").unwrap();
    std::fs::write(&wrong, b"not the model!!").unwrap();
    let entry = |sources: Vec<Source>| Entry {
        id: "t".into(),
        name: "t".into(),
        file: "t.gguf".into(),
        bytes: 15,
        sha256: kerze::catalog::sha256_file(&right).unwrap(),
        license: "test".into(),
        peak_bytes: 0,
        largest_tensor_bytes: 0,
        sources,
    };
    let url = |p: &std::path::Path| Source::Url {
        url: format!("file://{}", p.display()),
    };
    let out = dir.join("out");
    let mut log = Vec::new();
    let got = fetch(
        &entry(vec![url(&dir.join("missing")), url(&wrong), url(&right)]),
        &out,
        None,
        &mut |s| log.push(s.to_string()),
    )
    .unwrap();
    assert_eq!(std::fs::read(&got).unwrap(), b"the model bytes");
    assert_eq!(
        log.iter().filter(|l| l.contains("failed")).count(),
        2,
        "{log:?}"
    );
    assert!(
        log.iter().any(|l| l.contains("sha256")),
        "the wrong file must fail its checksum: {log:?}"
    );
    // Present: a no-op, even with no source that works.
    log.clear();
    fetch(
        &entry(vec![url(&dir.join("missing"))]),
        &out,
        None,
        &mut |s| log.push(s.to_string()),
    )
    .unwrap();
    assert!(log.is_empty(), "{log:?}");
    // Nothing works: one error naming every source, and no partial file left behind.
    let err = fetch(
        &entry(vec![url(&dir.join("missing")), url(&wrong)]),
        &dir.join("out2"),
        None,
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("could not fetch t") && err.contains("missing") && err.contains("wrong.bin"),
        "{err}"
    );
    assert!(
        std::fs::read_dir(dir.join("out2"))
            .unwrap()
            .next()
            .is_none(),
        "partial file left"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `kerze classify --json`: the issue's shape, one result list per text (--text or stdin
/// lines), labels comma-separated or --label, few-shot from --examples, bad labels a clear
/// error and a non-zero exit.
#[test]
fn classify_prints_results_per_text() {
    let model = common::catalog_model("all-minilm-l6-v2-q8_0.gguf");
    let v = json_of(
        kerze()
            .args([
                "classify",
                "--json",
                "--labels",
                "billing,delivery,technical problem",
            ])
            .args([
                "--text",
                "My parcel never arrived",
                "--text",
                "I was charged twice",
            ])
            .arg("--model")
            .arg(&model),
    );
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    let top: Vec<&str> = results
        .iter()
        .map(|r| r[0]["label"].as_str().unwrap())
        .collect();
    assert_eq!(top, ["delivery", "billing"]);
    let sum: f64 = results[0]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["score"].as_f64().unwrap())
        .sum();
    assert!((sum - 1.0).abs() < 1e-9);
    assert_eq!(v["usage"]["texts_encoded"], 2);

    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let ex = dir.join("classify-examples.json");
    std::fs::write(
        &ex,
        r#"{"happy": ["I love it", "Great product, thank you"], "angry": ["This is broken", "Worst purchase ever"]}"#,
    )
    .unwrap();
    let mut child = kerze()
        .args(["classify", "--json", "--method", "logistic", "--examples"])
        .arg(&ex)
        .arg("--model")
        .arg(&model)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"It stopped working after a day\nAbsolutely wonderful\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["results"][0][0]["label"], "angry");
    assert_eq!(v["results"][1][0]["label"], "happy");

    let out = kerze()
        .args(["classify", "--labels", "a,a", "--text", "x", "--model"])
        .arg(&model)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("\"a\" is given twice"), "{err}");
}

/// The catalog's sizes for the device check (`peak_bytes`, `largest_tensor_bytes`) are what
/// `kerze inspect` computes from each file (those `make fetch` put in models/).
#[test]
fn catalog_sizes_are_inspects() {
    let raw = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/models/catalog.json"))
        .unwrap();
    let cat: serde_json::Value = serde_json::from_str(&raw).unwrap();
    let mut checked = 0;
    for m in cat["models"].as_array().unwrap() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("models")
            .join(m["file"].as_str().unwrap());
        if !path.is_file() {
            continue;
        }
        let v = json_of(kerze().args(["inspect", "--json", "--model"]).arg(&path));
        for k in ["peak_bytes", "largest_tensor_bytes"] {
            assert_eq!(v["needs"][k], m[k], "{} {k}", m["id"]);
        }
        checked += 1;
    }
    assert!(
        checked >= 3,
        "only {checked} catalog files in models/: run make fetch"
    );
}

/// `kerze synth --shape-of` from a model's header alone (`inspect`'s `header_bytes`, the
/// bytes a machine the model file cannot reach is sent): the same metadata (its vocabulary:
/// the bench's prompt ids are the model's), tensors of the same names, types and sizes, one
/// seed one file, and the engine runs it.
#[test]
fn synth_takes_a_models_shape_from_its_header() {
    let model = common::model_path();
    let real = json_of(kerze().args(["inspect", "--json", "--model"]).arg(&model));
    let header_bytes = real["header_bytes"].as_u64().unwrap() as usize;
    let dir = std::env::temp_dir().join(format!("kerze-cli-shape-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let header = dir.join("header.gguf");
    let file_len = std::fs::metadata(&model).unwrap().len() as usize;
    assert!(header_bytes > 1 << 20 && header_bytes < file_len / 16);
    let mut bytes = vec![0u8; header_bytes];
    std::io::Read::read_exact(&mut std::fs::File::open(&model).unwrap(), &mut bytes).unwrap();
    std::fs::write(&header, &bytes).unwrap();
    // A header is no model.
    let out = kerze()
        .args(["inspect", "--model"])
        .arg(&header)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("truncated"));
    let synth = |seed: &str, out: &std::path::Path| {
        let o = kerze()
            .args(["synth", "--seed", seed, "--shape-of"])
            .arg(&header)
            .arg("--out")
            .arg(out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    let (a, b) = (dir.join("a.gguf"), dir.join("b.gguf"));
    synth("7", &a);
    let v = json_of(kerze().args(["inspect", "--json", "--model"]).arg(&a));
    for key in ["tensors", "tensor_types", "needs"] {
        assert_eq!(v[key], real[key], "{key}");
    }
    let (mut got, want) = (v["config"].clone(), real["config"].clone());
    got["name"] = want["name"].clone();
    assert_eq!(got, want);
    let name = v["metadata"]["general.name"].as_str().unwrap();
    assert!(name.starts_with("kerze synthetic"), "{name}");
    let (mut got, mut want) = (v["metadata"].clone(), real["metadata"].clone());
    for m in [&mut got, &mut want] {
        let m = m.as_object_mut().unwrap();
        m.remove("general.name");
        m.remove("general.alignment");
    }
    assert_eq!(got, want);
    let ids = |m: &std::path::Path| {
        let o = kerze()
            .args(["bench", "--prompt-ids", "--model"])
            .arg(m)
            .output()
            .unwrap();
        assert!(o.status.success());
        o.stdout
    };
    assert_eq!(ids(&a), ids(&model));
    let run = json_of(
        kerze()
            .args(["bench", "--json", "--device", "cpu", "--prompt-tokens", "8"])
            .args(["--gen-tokens", "4", "--model"])
            .arg(&a),
    );
    assert_eq!(run["gen_tokens"], 4);
    // One seed, one file.
    synth("7", &b);
    assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}
