//! The CPU backend's operations against candle and the dequantized weights.

use super::backend::{CpuBackend, ROPE_TABLES};
use super::dense;
use super::tensor::{Act, CpuWeight};
use crate::backend::{Backend, Rope, Then};
use crate::error::Error;
use crate::gguf::{GgmlType, TensorInfo};
use candle_core::quantized::QTensor;
use candle_core::{Device, Tensor};

/// The kept cos/sin tables never serve other positions or angles: two embeddings (as
/// Gemma 3's local and global) and positions that come back after others, more of them
/// than are kept, each turn exactly as on a fresh backend.
#[test]
fn kept_rope_tables_equal_fresh_ones() {
    let ropes = [
        Rope::new(8, 10_000.0, 1.0, None, true),
        Rope::new(8, 1_000_000.0, 1.0, None, true),
        Rope::new(8, 10_000.0, 1.0, None, false),
    ];
    let x = Act {
        data: (0..3 * 16).map(|i| (i as f32 * 0.37).sin()).collect(),
        width: 16,
    };
    let positions: [&[usize]; 4] = [&[0, 1, 2], &[5, 6, 7], &[3, 4, 5], &[0, 1, 2]];
    let mut kept = CpuBackend::new();
    for round in 0..3 {
        for pos in positions {
            for rope in &ropes {
                let got = kept.rope(&x, pos, rope).unwrap();
                let want = CpuBackend::new().rope(&x, pos, rope).unwrap();
                assert_eq!(got.data, want.data, "round {round}, positions {pos:?}");
            }
        }
    }
    assert!(kept.rope_tables.len() <= ROPE_TABLES);
}

/// F32, F16 and BF16 matrices (the dense kernel) and Q4_0 (the int8 kernel), quantized
/// by candle: the embedding rows and the product agree with the dequantized weights.
#[test]
fn matrices_embed_and_multiply() {
    let (rows, cols) = (5usize, 64usize);
    let mut rng = crate::rng::Rng::new(1);
    let w: Vec<f32> = (0..rows * cols).map(|_| rng.normal()).collect();
    let wt = Tensor::from_vec(w, (rows, cols), &Device::Cpu).unwrap();
    for (dt, ty) in [
        (candle_core::quantized::GgmlDType::F32, GgmlType::F32),
        (candle_core::quantized::GgmlDType::F16, GgmlType::F16),
        (candle_core::quantized::GgmlDType::BF16, GgmlType::BF16),
        (candle_core::quantized::GgmlDType::Q4_0, GgmlType::Q4_0),
    ] {
        let q = QTensor::quantize(&wt, dt).unwrap();
        let bytes = q.data().unwrap().into_owned();
        let want = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let info = TensorInfo {
            name: "w".into(),
            ty,
            dims: vec![cols as u64, rows as u64],
            offset: 0,
            n_bytes: bytes.len() as u64,
        };
        let mut be = CpuBackend::new();
        let wgt = be.load_weight(&info, &bytes).unwrap();
        let e = be.embed(&wgt, &[3, 0], 2.0).unwrap();
        for (i, r) in [3usize, 0].iter().enumerate() {
            for c in 0..cols {
                assert!(
                    (e.data[i * cols + c] - 2.0 * want[r * cols + c]).abs() < 1e-5,
                    "{ty}"
                );
            }
        }
        let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.1).sin()).collect();
        let y = be
            .matmul(
                &Act {
                    data: x.clone(),
                    width: cols,
                },
                &wgt,
            )
            .unwrap();
        for r in 0..rows {
            let exact: f32 = (0..cols).map(|c| x[c] * want[r * cols + c]).sum();
            assert!(
                (y.data[r] - exact).abs() < 0.05 * exact.abs().max(1.0),
                "{ty}: {} vs {exact}",
                y.data[r]
            );
        }
    }
}

/// The fused steps (`linears`, `linear_then` with GELU or a residual) give the same bits
/// as the separate ones, on every kind of matrix (float panels, int8 rows, candle's
/// blocks) and mixed, on shapes that run over the pool with row and panel tails; a
/// residual of the wrong shape is a typed error.
#[test]
fn fused_steps_equal_the_separate_ones() {
    let (m, n, k) = (130usize, 44usize, 64usize);
    let mut rng = crate::rng::Rng::new(7);
    let mut be = CpuBackend::new();
    let mut weights = Vec::new();
    for ty in [GgmlType::F32, GgmlType::Q4_0] {
        let w: Vec<f32> = (0..n * k).map(|_| rng.normal() * 0.2).collect();
        let wt = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
        let dt = match ty {
            GgmlType::F32 => candle_core::quantized::GgmlDType::F32,
            _ => candle_core::quantized::GgmlDType::Q4_0,
        };
        let bytes = QTensor::quantize(&wt, dt)
            .unwrap()
            .data()
            .unwrap()
            .into_owned();
        let info = TensorInfo {
            name: "w".into(),
            ty,
            dims: vec![k as u64, n as u64],
            offset: 0,
            n_bytes: bytes.len() as u64,
        };
        weights.push(be.load_weight(&info, &bytes).unwrap());
    }
    let v: Vec<i8> = (0..n * k).map(|i| (i * 53 % 256) as u8 as i8).collect();
    let scale = (0..n).map(|j| 0.002 + j as f32 * 1e-4).collect();
    let zero = (0..n).map(|j| (j % 3) as f32).collect();
    weights.push(CpuWeight::DenseI8(dense::I8Matrix::pack(
        &v, scale, zero, n, k,
    )));
    let bias = CpuWeight::Vector((0..n).map(|_| rng.normal()).collect());
    let x = Act {
        data: (0..m * k).map(|_| rng.normal()).collect(),
        width: k,
    };
    let r = Act {
        data: (0..m * n).map(|_| rng.normal()).collect(),
        width: n,
    };
    for w in &weights {
        let y = be.linear(&x, w, &bias).unwrap();
        let gelu = be.gelu(&y).unwrap();
        let add = be.add(&r, &y).unwrap();
        assert_eq!(be.linear_then(&x, w, &bias, Then::Gelu).unwrap(), gelu);
        assert_eq!(be.linear_then(&x, w, &bias, Then::Add(&r)).unwrap(), add);
        let short = Act {
            data: vec![0.0; n],
            width: n,
        };
        assert!(matches!(
            be.linear_then(&x, w, &bias, Then::Add(&short)),
            Err(Error::Backend(_))
        ));
    }
    let one: Vec<Act> = weights
        .iter()
        .map(|w| be.linear(&x, w, &bias).unwrap())
        .collect();
    for group in [vec![0, 0, 0], vec![2, 2, 2], vec![1, 1], vec![0, 2, 1]] {
        let layers: Vec<_> = group.iter().map(|&i| (&weights[i], &bias)).collect();
        let got = be.linears(&x, &layers).unwrap();
        let want: Vec<Act> = group.iter().map(|&i| one[i].clone()).collect();
        assert_eq!(got, want, "{group:?}");
    }
}
