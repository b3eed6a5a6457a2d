//! The error names are written three times — `Error::KINDS` (Rust), `ERROR_NAMES`
//! (pkg/protocol.js) and `KerzeErrorName` (pkg/index.d.ts) — and must agree: the Rust kinds
//! first, in order, then the package's own, the same in the JS and the types.
#![cfg(not(target_arch = "wasm32"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

fn quoted(s: &str) -> Vec<String> {
    s.split('\'')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, n)| n.to_string())
        .collect()
}

fn between<'a>(text: &'a str, start: &str, end: &str) -> &'a str {
    let a = text.find(start).unwrap_or_else(|| panic!("no {start}")) + start.len();
    let b = a + text[a..].find(end).unwrap();
    &text[a..b]
}

#[test]
fn rust_js_and_types_list_the_same_error_names() {
    let root = env!("CARGO_MANIFEST_DIR");
    let js = std::fs::read_to_string(format!("{root}/pkg/protocol.js")).unwrap();
    let dts = std::fs::read_to_string(format!("{root}/pkg/index.d.ts")).unwrap();
    let js_names = quoted(between(
        &js,
        "export const ERROR_NAMES = Object.freeze([",
        "]);",
    ));
    let ts_names = quoted(between(&dts, "export type KerzeErrorName =", ";"));
    assert_eq!(js_names, ts_names, "protocol.js and index.d.ts");
    let kinds: Vec<String> = kerze::Error::KINDS.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        js_names[..kinds.len()],
        kinds[..],
        "the Rust kinds come first, in order"
    );
    let mut seen = std::collections::HashSet::new();
    assert!(js_names.iter().all(|n| seen.insert(n)), "a name twice");
    assert!(js_names.iter().all(|n| n.ends_with("Error")));
}
