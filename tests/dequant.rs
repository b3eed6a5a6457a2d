//! Every weight type dequantizes exactly as the Python `gguf` package does: random blocks
//! (tests/fixtures/dequant.json, made by tests/fixtures/make_dequant.py) through the CPU
//! backend's embedding lookup (the int8 unpacking for the quantized types, candle for
//! F16/BF16), compared bit for bit by the sha256 of the f32 values.
#![cfg(not(target_arch = "wasm32"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use kerze::cpu::CpuBackend;
use kerze::{Backend, GgmlType, TensorInfo};
use serde::Deserialize;
use sha2::{Digest, Sha256};

#[derive(Deserialize)]
struct Fixture {
    types: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    #[serde(rename = "type")]
    ty: String,
    n_values: usize,
    blocks_hex: String,
    f32_sha256: String,
    first: Vec<f32>,
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn type_named(name: &str) -> GgmlType {
    (0..40)
        .filter_map(GgmlType::from_id)
        .find(|t| t.name() == name)
        .unwrap_or_else(|| panic!("no type {name}"))
}

/// One row of `n` values of `ty`, as the index lists it.
fn row_info(ty: GgmlType, n: usize, bytes: &[u8]) -> TensorInfo {
    TensorInfo {
        name: format!("random {ty}"),
        ty,
        dims: vec![n as u64, 1],
        offset: 0,
        n_bytes: bytes.len() as u64,
    }
}

fn sha(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn every_type_dequantizes_bit_for_bit_as_the_gguf_package() {
    let f: Fixture = serde_json::from_str(include_str!("fixtures/dequant.json")).unwrap();
    assert_eq!(
        f.types.len(),
        12,
        "Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K..Q6_K F16 BF16"
    );
    for c in f.types {
        let (ty, n, bytes) = (type_named(&c.ty), c.n_values, unhex(&c.blocks_hex));
        let (want, first) = (c.f32_sha256, c.first);
        let mut be = CpuBackend::new();
        let w = be.load_weight(&row_info(ty, n, &bytes), &bytes).unwrap();
        let got = be.embed(&w, &[0], 1.0).unwrap().data;
        assert_eq!(got.len(), n, "{ty}");
        assert_eq!(&got[..8], &first[..], "{ty}: first values");
        assert_eq!(sha(&got), want, "{ty}: the values differ from gguf's");
    }
}
