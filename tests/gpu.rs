//! The GPU backend's shaders and kernels, natively on Vulkan (lavapipe in CI: `make test`
//! installs mesa-vulkan-drivers). Kernels are checked against the CPU backend's exact
//! dequantization (`QMatrix::rows_f32`) with the products summed in f64.
//!
//! Tolerance: GPU and reference multiply the same dequantized weights by the same f32
//! activations; only the order of the f32 additions differs (≤ ~1e-7 relative per sum), so
//! the normalised MSE is ~1e-14. A wrong nibble, scale or block offset gives ~1e-2 or more.
//! We require NMSE < 1e-10.
#![cfg(all(not(target_arch = "wasm32"), feature = "gpu"))]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/bert_ref.rs"]
mod bert_ref;
mod common;
#[path = "common/reference_model.rs"]
mod reference_model;

use half::f16;
use kerze::cpu::int8::QMatrix;
use kerze::gguf::{FileSource, GgmlType, Gguf, TensorInfo};
use kerze::gpu::kernels::matvec::Matvec;
use kerze::gpu::kernels::Recorder;
use kerze::gpu::shaders;
use kerze::gpu::weights::{block_layout, GpuWeight};
use kerze::gpu::{Gpu, GpuOptions};

const NMSE_MAX: f64 = 1e-10;

fn gpu(opts: GpuOptions) -> Gpu {
    pollster::block_on(Gpu::new(&opts))
        .unwrap()
        .expect("no Vulkan adapter: install mesa-vulkan-drivers (lavapipe); `make test` does")
}

#[test]
fn naga_validates_every_shader() {
    let modules = shaders::all_modules();
    assert!(
        modules.len() >= shaders::WEIGHT_TYPES.len(),
        "found only {} shader modules",
        modules.len()
    );
    for (name, src) in &modules {
        let module = naga::front::wgsl::parse_str(src)
            .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(src)));
        // What WebGPU's core grants (unpack2x16float reads f16 scales without shader-f16).
        naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32,
        )
        .validate(&module)
        .unwrap_or_else(|e| panic!("{name}: {}", e.emit_to_string(src)));
    }
    eprintln!("naga: {} modules valid", modules.len());
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn byte(&mut self) -> u8 {
        (self.next() >> 32) as u8
    }
    fn f(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next() >> 40) as f32 / (1u64 << 24) as f32)
    }
}

/// Random file blocks of `ty` for a `rows × cols` matrix, with sane f16 scales.
fn random_tensor(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let (per, fb, _) = block_layout(ty).unwrap();
    let n_blocks = rows * cols / per;
    let mut out = Vec::with_capacity(n_blocks * fb);
    let h = |v: f32| f16::from_f32(v).to_le_bytes();
    for _ in 0..n_blocks {
        let mut blk: Vec<u8> = (0..fb).map(|_| rng.byte()).collect();
        match ty {
            GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q4_0 => {
                blk[0..2].copy_from_slice(&h(rng.f(-0.05, 0.05)))
            }
            GgmlType::Q4_1 | GgmlType::Q5_1 => {
                blk[0..2].copy_from_slice(&h(rng.f(-0.05, 0.05)));
                blk[2..4].copy_from_slice(&h(rng.f(-0.5, 0.5)));
            }
            GgmlType::F16 => blk.copy_from_slice(&h(rng.f(-1.0, 1.0))),
            GgmlType::BF16 => {
                blk.copy_from_slice(&half::bf16::from_f32(rng.f(-1.0, 1.0)).to_le_bytes())
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                blk[0..2].copy_from_slice(&h(rng.f(0.001, 0.02)));
                blk[2..4].copy_from_slice(&h(rng.f(0.001, 0.02)));
            }
            GgmlType::Q6_K => blk[208..210].copy_from_slice(&h(rng.f(-0.01, 0.01))),
            GgmlType::F32 => blk.copy_from_slice(&rng.f(-1.0, 1.0).to_le_bytes()),
            _ => unreachable!(),
        }
        out.extend_from_slice(&blk);
    }
    out
}

/// Dequantized rows `ids` of the tensor, the CPU backend's way (its int8 unpacking, or
/// candle's for F16 and BF16).
fn cpu_rows(src: &dyn kerze::gguf::ByteSource, info: &TensorInfo, ids: &[u32]) -> Vec<f32> {
    use kerze::Backend;
    let cols = info.dims[0] as usize;
    let rows = info.dims[1] as usize;
    if matches!(info.ty, GgmlType::F16 | GgmlType::BF16) {
        let mut be = kerze::cpu::CpuBackend::new();
        let w = be.load_weight(info, src).unwrap();
        let x = be.embed(&w, ids, 1.0).unwrap();
        return pollster::block_on(be.read(&x)).unwrap();
    }
    if info.ty == GgmlType::F32 {
        let mut out = Vec::new();
        for &r in ids {
            let mut b = vec![0u8; cols * 4];
            src.read_at(info.offset + (r as usize * cols * 4) as u64, &mut b)
                .unwrap();
            out.extend(
                b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            );
        }
        return out;
    }
    QMatrix::load(src, info.offset, rows, cols, info.ty)
        .unwrap()
        .rows_f32(ids, 1.0)
        .unwrap()
}

/// GPU `x (m × cols) @ Wᵀ`, all rows.
fn gpu_matvec(g: &Gpu, mv: &Matvec, w: &GpuWeight, x: &[f32], m: usize) -> Vec<f32> {
    let xb = g.storage("x", (x.len() * 4) as u64);
    g.queue.write_buffer(
        &xb,
        0,
        &x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
    );
    let yb = g.storage("y", (m * w.rows * 4) as u64);
    let mut rec = Recorder::new(g);
    mv.encode(g, &mut rec, w, &xb, &yb, m).unwrap();
    let enc = rec.take(g).unwrap();
    pollster::block_on(g.read_f32(enc, &yb, m * w.rows)).unwrap()
}

/// NMSE of `got` rows `ids` against the f64 products of the dequantized rows.
fn check(got: &[f32], n_rows: usize, deq: &[f32], ids: &[u32], x: &[f32], m: usize, what: &str) {
    let cols = x.len() / m;
    let pairs = (0..m).flat_map(|i| {
        ids.iter().enumerate().map(move |(k, &r)| {
            let w = &deq[k * cols..(k + 1) * cols];
            let want: f64 = w
                .iter()
                .zip(&x[i * cols..(i + 1) * cols])
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            (f64::from(got[i * n_rows + r as usize]), want)
        })
    });
    assert_nmse(pairs, what);
}

/// Normalised MSE of (got, want) pairs under [`NMSE_MAX`].
fn assert_nmse(pairs: impl Iterator<Item = (f64, f64)>, what: &str) {
    let (mut num, mut den) = (0f64, 0f64);
    for (g, want) in pairs {
        num += (g - want).powi(2);
        den += want.powi(2);
    }
    let nmse = num / den.max(1e-30);
    eprintln!("{what}: NMSE {nmse:.2e}");
    assert!(nmse < NMSE_MAX, "{what}: NMSE {nmse:.3e}");
}

#[test]
fn matvec_matches_the_cpu_on_random_tensors_at_odd_sizes_and_splits() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // One device and one set of pipelines for every case (each made its own: 63 devices and
    // their pipelines took most of this test's 31 s on lavapipe); the part limit is set per case.
    let mut g = gpu(GpuOptions::default());
    let full = g.max_part_bytes;
    let mut mv = Matvec::new(&g).unwrap();
    for (ty, cols) in [
        (GgmlType::Q8_0, 96),
        (GgmlType::Q8_0, 640),
        (GgmlType::Q5_0, 160),
        (GgmlType::Q5_0, 640),
        (GgmlType::Q4_K, 256),
        (GgmlType::Q4_K, 1024),
        (GgmlType::Q6_K, 512),
        (GgmlType::Q6_K, 2048),
        (GgmlType::Q4_0, 96),
        (GgmlType::Q4_0, 640),
        (GgmlType::Q4_1, 96),
        (GgmlType::Q4_1, 640),
        (GgmlType::Q5_1, 160),
        (GgmlType::Q5_1, 640),
        (GgmlType::Q5_K, 256),
        (GgmlType::Q5_K, 1024),
        (GgmlType::F16, 64),
        (GgmlType::F16, 160),
        (GgmlType::BF16, 64),
        (GgmlType::BF16, 160),
        (GgmlType::F32, 64),
    ] {
        for (rows, split_rows) in [(37usize, None), (301, Some(10usize)), (5, Some(1))] {
            let (per, _, gb) = block_layout(ty).unwrap();
            let gpu_row = (cols / per * gb) as u64;
            // A part limit that is not a whole number of rows: parts of `split_rows`.
            g.max_part_bytes = split_rows.map_or(full, |r| (gpu_row * r as u64 + 7).min(full));
            let bytes = random_tensor(ty, rows, cols, &mut rng);
            let info = TensorInfo {
                name: format!("random {ty} {rows}x{cols}"),
                ty,
                dims: vec![cols as u64, rows as u64],
                offset: 0,
                n_bytes: bytes.len() as u64,
            };
            let w = GpuWeight::load(&g, &info, &bytes).unwrap();
            assert_eq!(w.parts.len(), rows.div_ceil(split_rows.unwrap_or(rows)));
            let ids: Vec<u32> = (0..rows as u32).collect();
            let deq = cpu_rows(&bytes, &info, &ids);
            // GPUs: lanes per row (m = 1) or the tiled kernel (m > 1); software adapters: a
            // thread per row, in slices of activation rows (Q6_K × 2048 at m = 64 is 4).
            for (m, per_row) in [
                (1, false),
                (1, true),
                (3, false),
                (3, true),
                (17, false),
                (64, false),
                (64, true),
            ] {
                mv.row_per_thread = per_row;
                let x: Vec<f32> = (0..m * cols).map(|_| rng.f(-2.0, 2.0)).collect();
                let got = gpu_matvec(&g, &mv, &w, &x, m);
                let what = format!(
                    "{} m={m} per_row={per_row} parts={}",
                    info.name,
                    w.parts.len()
                );
                check(&got, rows, &deq, &ids, &x, m, &what);
            }
        }
    }
}

#[test]
fn matvec_matches_the_cpu_on_the_real_model_with_default_limits() {
    let src = FileSource::open(&common::model_path()).unwrap();
    let g = Gguf::read(&src).unwrap();
    // WebGPU's default limits: 128 MiB per binding, so the 178 MB LM head is split.
    let dev = gpu(GpuOptions {
        default_limits: true,
        ..Default::default()
    });
    assert_eq!(dev.max_part_bytes, 128 << 20);
    let mut mv = Matvec::new(&dev).unwrap();
    let mut rng = Rng(7);
    for name in [
        "blk.0.attn_q.weight",
        "blk.0.attn_v.weight",
        "blk.0.attn_output.weight",
        "blk.0.ffn_down.weight",
        "blk.3.ffn_gate.weight",
        "token_embd.weight",
    ] {
        let info = g.tensor(name).unwrap().clone();
        let w = GpuWeight::load(&dev, &info, &src).unwrap();
        let cols = w.cols;
        let x: Vec<f32> = (0..cols).map(|_| rng.f(-1.0, 1.0)).collect();
        mv.row_per_thread = false;
        let got = gpu_matvec(&dev, &mv, &w, &x, 1);
        mv.row_per_thread = true;
        let got_rows = gpu_matvec(&dev, &mv, &w, &x, 1);
        // All rows for the layers; for the LM head a sample, and every row around the split.
        let ids: Vec<u32> = if w.rows > 100_000 {
            let mut v: Vec<u32> = (0..w.rows as u32).step_by(997).collect();
            for p in &w.parts[1..] {
                v.extend(p.row0 as u32 - 3..p.row0 as u32 + 3);
            }
            v
        } else {
            (0..w.rows as u32).collect()
        };
        if w.rows > 100_000 {
            assert!(
                w.parts.len() >= 2,
                "{name} should be split under 128 MiB bindings"
            );
        }
        let deq = cpu_rows(&src, &info, &ids);
        for (y, variant) in [(&got, "lanes"), (&got_rows, "row per thread")] {
            let what = format!("{name} ({}, parts {}, {variant})", info.ty, w.parts.len());
            check(y, w.rows, &deq, &ids, &x, 1, &what);
        }
    }
}

/// A session on the GPU (WebGPU's default limits) for the model in `src`.
fn gpu_session(
    src: &dyn kerze::gguf::ByteSource,
) -> kerze::session::Session<kerze::gpu::backend::GpuBackend> {
    use kerze::gpu::backend::GpuBackend;
    use kerze::model::Model;
    use kerze::session::Session;
    use kerze::tokenizer::Tokenizer;
    use kerze::ModelConfig;

    let g = Gguf::read(src).unwrap();
    let cfg = ModelConfig::from_gguf(&g, None).unwrap();
    let mut be = pollster::block_on(GpuBackend::new(&GpuOptions {
        default_limits: true,
        ..Default::default()
    }))
    .unwrap()
    .expect("no Vulkan adapter");
    let model = Model::load(&mut be, &g, src, cfg, &mut |_, _| {}).unwrap();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let mut s = Session::new(be, model, tok).unwrap();
    pollster::block_on(s.warm_up()).unwrap();
    s
}

/// The tiny synthetic Gemma 3 (sliding window 8: the ring wraps many times; prompt longer
/// than one chunk) against the f64 reference's golden logits, as the CPU engine is held.
#[test]
fn tiny_model_on_the_gpu_matches_the_f64_golden() {
    let bytes = kerze::synth::tiny_gemma3().unwrap();
    let golden: common::TinyGolden =
        serde_json::from_str(include_str!("fixtures/tiny_golden.json")).unwrap();
    let mut s = gpu_session(&bytes);
    let n_vocab = s.model.cfg().n_vocab;
    let rows = pollster::block_on(s.logits_top_k(&golden.prompt_ids, n_vocab, 0)).unwrap();
    let worst = common::check_tiny_logits(&golden, &rows);
    eprintln!("tiny model on the GPU: worst NMSE {worst:.2e}");
}

/// The real model on the GPU under WebGPU's default limits (128 MiB bindings: the LM head is
/// split), teacher-forced on the float64 reference: the CPU engine's gate and the exactness
/// the CPU engine shows (the GPU computes in f32 throughout). On lavapipe (a CPU emulation)
/// the 628-token case takes minutes: it runs with KERZE_GPU_FULL=1; the ring and chunking
/// are covered by the tiny model above on every run.
#[test]
fn whole_model_on_the_gpu_meets_the_reference_gate() {
    let src = FileSource::open(&common::model_path()).unwrap();
    let t0 = std::time::Instant::now();
    let mut s = gpu_session(&src);
    eprintln!("GPU load {:.2} s", t0.elapsed().as_secs_f64());
    let reference: common::Reference =
        serde_json::from_str(include_str!("fixtures/reference_gemma3_270m.json")).unwrap();
    let full = std::env::var_os("KERZE_GPU_FULL").is_some();
    let mut stats = common::Agreement::default();
    let t0 = std::time::Instant::now();
    let mut n = 0;
    for case in reference
        .cases
        .iter()
        .filter(|c| full || c.prompt_ids.len() < 100)
    {
        let seq = case.sequence();
        n += seq.len();
        let first = case.prompt_ids.len() - 1;
        let top = pollster::block_on(s.logits_top_k(&seq, 10, first)).unwrap();
        stats.add_case(case, &top);
    }
    eprintln!(
        "{n} positions in {:.1} s\n{}",
        t0.elapsed().as_secs_f64(),
        stats.summary()
    );
    stats.assert_exact();
}

/// The GPU top-k equals the CPU's on the same values: ties (the lower id first), NaN,
/// -inf, a row of the real vocabulary's length, k from 1 to the limit.
#[test]
fn gpu_top_k_equals_the_cpu_top_k() {
    use kerze::gpu::backend::{GpuBackend, TOPK_MAX};
    use kerze::Backend;
    let mut be = pollster::block_on(GpuBackend::new(&GpuOptions::default()))
        .unwrap()
        .expect("no Vulkan adapter");
    let mut rng = Rng(11);
    for (n, n_tok) in [(1000usize, 1usize), (262_144, 2), (5000, 1)] {
        let mut v: Vec<f32> = (0..n * n_tok).map(|_| rng.f(-10.0, 10.0)).collect();
        // Ties and oddities in the last row.
        let last = (n_tok - 1) * n;
        v[last + 7] = 11.0;
        v[last + 3] = 11.0;
        v[last + n - 1] = 11.0;
        v[last + 1] = f32::NAN;
        v[last + 2] = f32::INFINITY.copysign(-1.0);
        let x = be.upload(&v, n_tok, n).unwrap();
        for k in [1, 2, 40, 104, TOPK_MAX] {
            let got = pollster::block_on(be.top_k(&x, k)).unwrap();
            let want = kerze::logits::top_k(&v[last..], k);
            assert_eq!(got, want, "n {n} k {k}");
        }
    }
}

/// The top-k under an output constraint's bitmask: on the device it is the CPU's masked top-k,
/// the allowed values bit for bit the unmasked ones, for dense, sparse (fewer allowed than k)
/// and empty masks.
#[test]
fn gpu_masked_top_k_equals_the_cpu_and_keeps_allowed_values_bit_for_bit() {
    use kerze::gpu::backend::{GpuBackend, TOPK_MAX};
    use kerze::Backend;
    let mut be = pollster::block_on(GpuBackend::new(&GpuOptions::default()))
        .unwrap()
        .expect("no Vulkan adapter");
    let mut cpu = kerze::cpu::CpuBackend::new();
    let mut rng = Rng(12);
    let n = 262_144;
    let v: Vec<f32> = (0..n).map(|_| rng.f(-10.0, 10.0)).collect();
    let x = be.upload(&v, 1, n).unwrap();
    let xc = act(&v, n);
    let words = n / 32;
    let dense: Vec<u32> = (0..words).map(|_| rng.next() as u32).collect();
    let mut sparse = vec![0u32; words];
    for id in [5usize, 77, 4000, 131_072, n - 1] {
        sparse[id / 32] |= 1 << (id % 32);
    }
    let empty = vec![0u32; words];
    for (what, mask) in [("dense", &dense), ("sparse", &sparse), ("empty", &empty)] {
        for k in [1, 40, TOPK_MAX] {
            let got = pollster::block_on(be.top_k_masked(&x, k, mask)).unwrap();
            let want = pollster::block_on(cpu.top_k_masked(&xc, k, mask)).unwrap();
            assert_eq!(got, want, "{what} k {k}");
            let allowed = |i: u32| (mask[i as usize / 32] >> (i % 32)) & 1 == 1;
            assert!(got
                .iter()
                .all(|&(i, l)| allowed(i) && l.to_bits() == v[i as usize].to_bits()));
            let n_allowed: usize = mask.iter().map(|w| w.count_ones() as usize).sum();
            assert_eq!(got.len(), k.min(n_allowed), "{what} k {k}");
        }
    }
}

/// A constrained decode on the GPU (a JSON schema on Gemma 3 270M): the CPU's ids, and a step
/// that samples still reads back at most 4 KiB (the mask goes to the device, the top-k comes
/// back); forced tokens run without a readback of their own.
#[test]
fn constrained_decode_on_the_gpu_reads_back_only_the_top_k() {
    use kerze::constrain::Constraint;
    use kerze::{Engine, GenerateOptions};
    use std::sync::atomic::Ordering;
    let src = FileSource::open(&common::model_path()).unwrap();
    let mut s = gpu_session(&src);
    let (mut cpu, _) = Engine::load(&src, &exact_cpu(), &mut |_, _| {}).unwrap();
    let schema = serde_json::json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"enum": ["Berlin", "Paris", "Rome"]}}, "required": ["name", "age", "city"], "additionalProperties": false});
    let opts = GenerateOptions {
        max_tokens: 48,
        sampler: kerze::SamplerConfig::greedy(),
        constraint: Some(Constraint::JsonSchema(schema)),
        ..Default::default()
    };
    let ids = s
        .tok
        .encode_user("Anna is 31 and lives in Paris. As JSON:", true)
        .unwrap();
    let mut g = pollster::block_on(s.start(ids.clone(), &opts, &|| false)).unwrap();
    let mut reads = Vec::new();
    loop {
        let b0 = s.be.gpu.bytes_read.load(Ordering::Relaxed);
        if pollster::block_on(s.step(&mut g, &|| false))
            .unwrap()
            .is_none()
        {
            break;
        }
        reads.push(s.be.gpu.bytes_read.load(Ordering::Relaxed) - b0);
    }
    assert!(
        reads.iter().all(|&b| b <= 4096),
        "bytes read per step: {reads:?}"
    );
    assert!(g.usage.forced_tokens > 0, "nothing forced");
    let want = pollster::block_on(cpu.generate(ids, &opts, &|| false, &mut |_| {})).unwrap();
    assert_eq!(g.generated(), want.generated());
    assert_eq!(g.finish(), Some(kerze::FinishReason::Stop));
    let text = s.tok.decode(g.generated(), true).unwrap();
    eprintln!(
        "constrained on the GPU: {text} ({} forced of {}), bytes read per step {reads:?}",
        g.usage.forced_tokens,
        g.generated().len()
    );
}

/// A decode step on the GPU is one submission, reads back at most 4 KiB (the top-k) and,
/// once a step of its shape ran, creates no buffer and no bind group; greedy generation
/// gives the CPU engine's tokens.
#[test]
fn decode_steps_read_back_little_and_match_the_cpu() {
    use kerze::{Engine, GenerateOptions};
    use std::sync::atomic::Ordering;
    let src = FileSource::open(&common::model_path()).unwrap();
    let mut s = gpu_session(&src);
    let (mut cpu, _) = Engine::load(&src, &exact_cpu(), &mut |_, _| {}).unwrap();
    let r: common::Reference =
        serde_json::from_str(include_str!("fixtures/llamacpp_gemma3_270m.json")).unwrap();
    for case in r.cases.iter().filter(|c| c.certain).take(2) {
        let ids = s.tok.encode_user(&case.prompt, true).unwrap();
        let opts = GenerateOptions::greedy_tokens(16);
        let mut g = pollster::block_on(s.start(ids.clone(), &opts, &|| false)).unwrap();
        let mut steps = Vec::new();
        let e0 = s.be.encode_ms();
        let counts = |s: &kerze::session::Session<kerze::gpu::backend::GpuBackend>| {
            [
                s.be.gpu.bytes_read.load(Ordering::Relaxed),
                s.be.gpu.submits.load(Ordering::Relaxed),
                s.be.gpu.buffers_created.load(Ordering::Relaxed),
                s.be.bind_groups_created(),
                s.be.dispatches(),
            ]
        };
        loop {
            let c0 = counts(&s);
            let Some(_) = pollster::block_on(s.step(&mut g, &|| false)).unwrap() else {
                break;
            };
            let c1 = counts(&s);
            steps.push([0, 1, 2, 3, 4].map(|i| c1[i] - c0[i]));
        }
        // Every step but the last computes the next token; the first decode step may meet
        // new shapes (one-row activations), none after it.
        // A decode step's dispatches: the same every step (the cache's length is a
        // parameter, not a shape), a few per layer.
        let dispatches = steps[0][4];
        let n_layer = s.model.cfg().n_layer as u64;
        assert!(
            dispatches >= 8 * n_layer && dispatches <= 40 * n_layer,
            "{dispatches} dispatches in a step"
        );
        for (i, &[bytes, submits, buffers, binds, d]) in steps[..steps.len() - 1].iter().enumerate()
        {
            assert!(bytes > 0 && bytes <= 4096, "{bytes} bytes read in a step");
            assert_eq!(submits, 1, "submissions in a step");
            assert_eq!(d, dispatches, "dispatches in step {i}");
            if i > 0 {
                assert_eq!(
                    (buffers, binds),
                    (0, 0),
                    "buffers, bind groups created in step {i}"
                );
            }
        }
        let want = pollster::block_on(cpu.generate(ids, &opts, &|| false, &mut |_| {})).unwrap();
        assert_eq!(g.generated(), want.generated(), "{:?}", case.prompt);
        eprintln!(
            "{:?}: {} steps, {} bytes read and {dispatches} dispatches per step, {:.2} ms encoding per step, pool {} KiB; prefill {:.1} tok/s, decode {:.2} tok/s on {}",
            case.prompt,
            steps.len(),
            steps[0][0],
            (s.be.encode_ms() - e0) / (steps.len() - 1) as f64,
            s.be.pool_bytes() / 1024,
            g.usage.prefill_tokens_per_s,
            g.usage.decode_tokens_per_s,
            s.be.gpu.info.name
        );
    }
}

/// The GPU is lost mid-generation (the device destroyed, as a driver reset or the browser
/// reclaiming it would): the tokens produced so far are kept, the engine loads the weights
/// onto the CPU from the kept file, runs the ids so far again and finishes there, reporting
/// the switch — and the continuation is what the CPU alone produces from that prefix. Lost
/// before the prompt ran, the whole generation is the CPU's.
#[test]
fn device_loss_mid_generation_continues_on_the_cpu() {
    use kerze::{Device, Engine, GenerateOptions, LoadOptions};
    let path = common::model_path();
    let load = || {
        let opts = LoadOptions {
            no_gpu: None,
            device: Device::Webgpu,
            n_ctx: None,
            exact: true,
        };
        let src = Box::new(FileSource::open(&path).unwrap());
        pollster::block_on(Engine::load_async(src, &opts, &mut |_, _| {})).unwrap()
    };
    let src = FileSource::open(&path).unwrap();
    let (mut cpu, _) = Engine::load(&src, &exact_cpu(), &mut |_, _| {}).unwrap();
    let never = || false;
    let n = 10;
    let opts = GenerateOptions::greedy_tokens(n);
    // Lost after `lose_after` tokens were returned (None: before the prompt ran).
    for lose_after in [Some(3usize), None] {
        let (mut e, info) = load();
        assert_eq!(info.backend, "webgpu");
        let ids = e
            .tokenizer()
            .encode_user("The three primary colors are", true)
            .unwrap();
        let mut g = e.begin(ids.clone(), &opts).unwrap();
        if lose_after.is_none() {
            e.gpu().unwrap().destroy();
        }
        while !pollster::block_on(e.prefill_step(&mut g)).unwrap() {}
        let mut text = String::new();
        let mut produced_on_gpu = 0;
        let mut i = 0;
        loop {
            if Some(i) == lose_after {
                // The token after these is already sampled on the GPU.
                produced_on_gpu = i + 1;
                e.gpu().unwrap().destroy();
            }
            let Some(c) = pollster::block_on(e.step(&mut g, &never)).unwrap() else {
                break;
            };
            text.push_str(&c.text);
            i += 1;
        }
        let switch = e.take_switch().expect("the switch is reported");
        assert!(switch.contains("continued on the CPU"), "{switch}");
        assert_eq!(e.info().backend, "cpu-native");
        assert!(e.gpu().is_none());
        let got = g.generated().to_vec();
        assert_eq!(got.len(), n, "every token arrives");
        assert_eq!(
            text,
            e.tokenizer().decode(&got, false).unwrap(),
            "no text lost"
        );
        let prefix: Vec<u32> = ids.iter().chain(&got[..produced_on_gpu]).copied().collect();
        let rest = GenerateOptions::greedy_tokens(n - produced_on_gpu);
        let want = pollster::block_on(cpu.generate(prefix, &rest, &never, &mut |_| {})).unwrap();
        assert_eq!(
            &got[produced_on_gpu..],
            want.generated(),
            "lost after {lose_after:?}"
        );
        eprintln!(
            "lost after {lose_after:?}: {switch}; {} tokens run again on the CPU in {:.0} ms",
            g.usage.replayed_tokens, g.usage.replay_ms
        );
    }
}

/// The embedding gather dequantizes rows as the CPU does, for every weight type, across
/// split parts (rows on both sides of each split).
#[test]
fn embedding_gather_matches_the_cpu_for_every_type() {
    use kerze::gpu::backend::GpuBackend;
    use kerze::Backend;
    let mut rng = Rng(5);
    for (ty, cols) in [
        (GgmlType::Q8_0, 96),
        (GgmlType::Q5_0, 160),
        (GgmlType::Q4_0, 96),
        (GgmlType::Q4_1, 96),
        (GgmlType::Q5_1, 160),
        (GgmlType::Q4_K, 256),
        (GgmlType::Q5_K, 256),
        (GgmlType::Q6_K, 512),
        (GgmlType::F16, 64),
        (GgmlType::BF16, 64),
        (GgmlType::F32, 64),
    ] {
        let rows = 301;
        let (per, _, gb) = block_layout(ty).unwrap();
        let opts = GpuOptions {
            max_part_bytes: Some((cols / per * gb) as u64 * 10 + 7),
            ..Default::default()
        };
        let mut be = pollster::block_on(GpuBackend::new(&opts))
            .unwrap()
            .expect("no Vulkan adapter");
        let bytes = random_tensor(ty, rows, cols, &mut rng);
        let info = TensorInfo {
            name: format!("random {ty} {rows}x{cols}"),
            ty,
            dims: vec![cols as u64, rows as u64],
            offset: 0,
            n_bytes: bytes.len() as u64,
        };
        let w = be.load_weight(&info, &bytes).unwrap();
        let ids = [0u32, 9, 10, 11, 150, 299, 300, 10];
        let x = be.embed(&w, &ids, 1.0).unwrap();
        let got = pollster::block_on(be.read(&x)).unwrap();
        let want = cpu_rows(&bytes, &info, &ids);
        assert_eq!(got.len(), want.len());
        let pairs = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (f64::from(*a), f64::from(*b)));
        assert_nmse(pairs, &format!("embed {}", info.name));
    }
}

/// Every Llama-block family (normal RoPE with frequency factors and an own LM head, q/k/v
/// biases, QK-norm with a head size apart from n_embd / n_head) on the GPU: teacher-forced
/// logits against the float64 reference over a prompt longer than one prefill chunk.
#[test]
fn every_family_on_the_gpu_matches_the_f64_reference() {
    use kerze::synth::{tiny_decoder, Quants};
    use kerze::Family;
    let mixes = [
        Quants {
            embd: GgmlType::Q8_0,
            inner: GgmlType::Q4_K,
            outer: GgmlType::Q6_K,
        },
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
    ];
    for (f, q) in [Family::Llama, Family::Qwen2, Family::Qwen3]
        .into_iter()
        .flat_map(|f| mixes.map(|q| (f, q)))
    {
        let bytes = tiny_decoder(f, q, 7).unwrap();
        let mut s = gpu_session(&bytes);
        let text = "the cat is in the garden and the dog is on the sofa; then the rain falls on \
            the hills and the river runs to the sea, is it not?";
        let ids = s.tok.encode_user(text, true).unwrap();
        assert!(ids.len() > 64);
        let n_vocab = s.model.cfg().n_vocab;
        let rows = pollster::block_on(s.logits_top_k(&ids, n_vocab, 0)).unwrap();
        // The GPU rounds keys and values as the CPU's f16 cache holds them: so does the
        // reference here.
        let reference = reference_model::RefModel::load(&bytes)
            .f16_kv()
            .logits(&ids);
        let mut worst: f64 = 0.0;
        for (mine, want) in rows.iter().zip(&reference) {
            let mut full = vec![0f64; n_vocab];
            for &(id, l) in mine {
                full[id as usize] = f64::from(l);
            }
            let num: f64 = full.iter().zip(want).map(|(a, b)| (a - b).powi(2)).sum();
            worst = worst.max(num / want.iter().map(|b| b * b).sum::<f64>());
        }
        eprintln!("{f:?} {q:?} on the GPU: worst NMSE {worst:.2e}");
        // f32 throughout on the same exact weights, keys and values as f16 on both sides:
        // rounding only, and a few keys whose f32 and f64 values round to different f16s
        // (0.6e-9 – 3.2e-8 on lavapipe here, whose code depends on the host's CPU).
        assert!(worst < 1e-7, "{f:?}: NMSE {worst}");
    }
}

/// Random activations of `n × width`.
fn random_act(rng: &mut Rng, n: usize, width: usize) -> Vec<f32> {
    (0..n * width).map(|_| rng.f(-2.0, 2.0)).collect()
}

/// A 1-D F32 weight as a byte source and its index entry.
fn vector_weight(v: &[f32]) -> (Vec<u8>, TensorInfo) {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let info = TensorInfo {
        name: "v".into(),
        ty: GgmlType::F32,
        dims: vec![v.len() as u64],
        offset: 0,
        n_bytes: bytes.len() as u64,
    };
    (bytes, info)
}

/// A GPU backend under WebGPU's default limits, for the per-op tests.
fn op_gpu() -> kerze::gpu::backend::GpuBackend {
    pollster::block_on(kerze::gpu::backend::GpuBackend::new(&GpuOptions {
        default_limits: true,
        ..Default::default()
    }))
    .unwrap()
    .expect("no Vulkan adapter")
}

/// Activations of `d` with rows of `w` values.
fn act(d: &[f32], w: usize) -> kerze::cpu::Act {
    kerze::cpu::Act {
        data: d.to_vec(),
        width: w,
    }
}

/// `got` (the GPU's) equals `want` (the CPU's) to NMSE `tol`.
fn close(what: &str, got: Vec<f32>, want: &[f32], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let e = common::nmse(&got, want);
    assert!(e < tol, "{what}: NMSE {e:.2e}");
}

/// The ops other than matmul, one by one on random tensors at odd sizes, GPU against CPU:
/// RMS norm (per row and per head, with and without the residual), RoPE in both modes with
/// frequency factors at a far position, both gated products, the row bias, and attention
/// (grouped heads, a sliding window that the ring wraps, chunks after cached rows).
#[test]
fn each_op_on_the_gpu_matches_the_cpu_on_random_tensors() {
    use kerze::backend::{AttnParams, Backend, Rope};
    use kerze::config::Glu;
    use kerze::cpu::CpuBackend;

    let mut rng = Rng(0x5eed_0123_4567);
    let mut cpu = CpuBackend::new();
    let mut gpu = op_gpu();
    // RMS norms: one weight per row (n_embd) and per head (head_dim), odd row counts and
    // widths (GPU weights are whole 32-value blocks).
    for (n, width, group) in [(1, 160, 160), (5, 3 * 96, 96), (13, 7 * 32, 32)] {
        let x = random_act(&mut rng, n, width);
        let r = random_act(&mut rng, n, width);
        let w: Vec<f32> = (0..group).map(|_| rng.f(0.5, 1.5)).collect();
        let (wb, wi) = vector_weight(&w);
        let (cw, gw) = (
            cpu.load_weight(&wi, &wb).unwrap(),
            gpu.load_weight(&wi, &wb).unwrap(),
        );
        let want = cpu.rms_norm(&act(&x, width), &cw, 1e-6).unwrap().data;
        let gx = gpu.upload(&x, n, width).unwrap();
        let t = gpu.rms_norm(&gx, &gw, 1e-6).unwrap();
        close(
            "rms_norm",
            pollster::block_on(gpu.read(&t)).unwrap(),
            &want,
            1e-11,
        );
        let want = cpu
            .add_rms_norm(&act(&r, width), &act(&x, width), &cw, 1e-6)
            .unwrap()
            .data;
        let gr = gpu.upload(&r, n, width).unwrap();
        let t = gpu.add_rms_norm(&gr, &gx, &gw, 1e-6).unwrap();
        close(
            "add_rms_norm",
            pollster::block_on(gpu.read(&t)).unwrap(),
            &want,
            1e-11,
        );
    }
    // RoPE: both pairings, linear scaling, frequency factors, positions far from 0.
    for neox in [true, false] {
        for (n, heads, hd, first) in [(1, 3, 64, 4000), (7, 2, 18, 0), (33, 5, 128, 123)] {
            let factors: Vec<f32> = (0..hd / 2).map(|i| 1.0 + i as f32 * 0.25).collect();
            let rope = Rope::new(hd, 500_000.0, 0.5, Some(&factors), neox);
            let x = random_act(&mut rng, n, heads * hd);
            let pos: Vec<usize> = (first..first + n).collect();
            let want = cpu.rope(&act(&x, heads * hd), &pos, &rope).unwrap().data;
            let gx = gpu.upload(&x, n, heads * hd).unwrap();
            let t = gpu.rope(&gx, &pos, &rope).unwrap();
            let what = format!("rope neox={neox} {n}×{heads}×{hd} at {first}");
            close(
                &what,
                pollster::block_on(gpu.read(&t)).unwrap(),
                &want,
                1e-11,
            );
        }
    }
    // Gated products and the row bias.
    for (n, width) in [(1, 32), (3, 992), (17, 4128)] {
        let a = random_act(&mut rng, n, width);
        let b: Vec<f32> = random_act(&mut rng, n, width)
            .iter()
            .map(|v| v * 20.0)
            .collect();
        let (ga, gb) = (
            gpu.upload(&a, n, width).unwrap(),
            gpu.upload(&b, n, width).unwrap(),
        );
        for g in [Glu::GeluTanh, Glu::Silu] {
            let want = cpu.glu(&act(&b, width), &act(&a, width), g).unwrap().data;
            let t = gpu.glu(&gb, &ga, g).unwrap();
            close(
                &format!("{g:?}"),
                pollster::block_on(gpu.read(&t)).unwrap(),
                &want,
                1e-11,
            );
        }
        let bias: Vec<f32> = (0..width).map(|_| rng.f(-1.0, 1.0)).collect();
        let (bb, bi) = vector_weight(&bias);
        let (cb, gbias) = (
            cpu.load_weight(&bi, &bb).unwrap(),
            gpu.load_weight(&bi, &bb).unwrap(),
        );
        let want = cpu.add_bias(&act(&a, width), &cb).unwrap().data;
        let t = gpu.add_bias(&ga, &gbias).unwrap();
        close(
            "add_bias",
            pollster::block_on(gpu.read(&t)).unwrap(),
            &want,
            1e-12,
        );
    }
    // Attention: chunks appended to a cache (a ring of `slots` where the window slides),
    // grouped heads, odd head sizes.
    for (n_head, n_head_kv, hd, window, slots, chunks) in [
        (6, 2, 40, usize::MAX, 64, vec![5, 1, 1, 9]),
        (4, 4, 64, 7, 7, vec![3, 9, 1, 1, 2]),
        (8, 1, 24, 5, 5, vec![1, 1, 1, 1, 1, 1, 1]),
    ] {
        let p = AttnParams {
            n_head,
            n_head_kv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            window,
        };
        let mut ckv = cpu.new_kv(slots, n_head_kv, hd).unwrap();
        let mut gkv = gpu.new_kv(slots, n_head_kv, hd).unwrap();
        let mut at = 0;
        for n in chunks {
            let q = random_act(&mut rng, n, n_head * hd);
            let mut k = random_act(&mut rng, n, n_head_kv * hd);
            let mut v = random_act(&mut rng, n, n_head_kv * hd);
            // Values an f16 cache rounds at its edges: subnormal f16s, ties to even (normal
            // and subnormal), beyond the range, f32 subnormals.
            let edges = [
                1e-6,
                -3.1e-5,
                1.0 + 1.0 / 2048.0,
                1.0 + 3.0 / 2048.0,
                3.0 * 2f32.powi(-25),
                -(2f32.powi(-25)),
                7e4,
                -1e9,
                1e-40,
                65519.0,
            ];
            let (nk, nv) = (k.len(), v.len());
            for (i, e) in edges.iter().enumerate() {
                k[i * 3 % nk] = *e;
                v[i * 5 % nv] = -*e;
            }
            let pos: Vec<usize> = (at..at + n).collect();
            let want = cpu
                .attention(
                    &act(&q, n_head * hd),
                    &act(&k, n_head_kv * hd),
                    &act(&v, n_head_kv * hd),
                    &mut ckv,
                    &pos,
                    p,
                )
                .unwrap()
                .data;
            let gq = gpu.upload(&q, n, n_head * hd).unwrap();
            let gk = gpu.upload(&k, n, n_head_kv * hd).unwrap();
            let gv = gpu.upload(&v, n, n_head_kv * hd).unwrap();
            let t = gpu.attention(&gq, &gk, &gv, &mut gkv, &pos, p).unwrap();
            let what = format!("attention {n_head}/{n_head_kv}×{hd} window {window} at {at}+{n}");
            close(
                &what,
                pollster::block_on(gpu.read(&t)).unwrap(),
                &want,
                1e-11,
            );
            at += n;
            // Both caches hold the same f16 values, bit for bit: each rounds as the other.
            let c = pollster::block_on(cpu.save_kv(&ckv, at)).unwrap();
            let g = pollster::block_on(gpu.save_kv(&gkv, at)).unwrap();
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&c.k), bits(&g.k), "{what}: keys");
            assert_eq!(bits(&c.v), bits(&g.v), "{what}: values");
        }
    }
}

/// Branches after a cached prefix, GPU against CPU on random tensors: Gemma's head size
/// (256, four query heads per KV head), eight heads per KV head, a sliding window whose ring
/// has wrapped, branches longer than a tile of 64 keys, and a prefix longer than one.
#[test]
fn attention_branches_on_the_gpu_match_the_cpu() {
    use kerze::backend::{AttnParams, Backend};
    use kerze::cpu::CpuBackend;

    let mut rng = Rng(0xb7a2_c4e5);
    let mut cpu = CpuBackend::new();
    let mut gpu = op_gpu();
    for (n_head, n_head_kv, hd, window, slots, prefix, lens) in [
        (4, 1, 256, usize::MAX, 64, 20, vec![3, 1, 5, 2]),
        (6, 2, 40, 7, 7, 12, vec![1, 4, 2]),
        (8, 1, 24, usize::MAX, 200, 100, vec![70, 1, 9]),
        (2, 2, 64, 50, 50, 130, vec![66, 2]),
    ] {
        let p = AttnParams {
            n_head,
            n_head_kv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            window,
        };
        let (qw, kw) = (n_head * hd, n_head_kv * hd);
        let mut ckv = cpu.new_kv(slots, n_head_kv, hd).unwrap();
        let mut gkv = gpu.new_kv(slots, n_head_kv, hd).unwrap();
        let pos: Vec<usize> = (0..prefix).collect();
        let (q, k, v) = (
            random_act(&mut rng, prefix, qw),
            random_act(&mut rng, prefix, kw),
            random_act(&mut rng, prefix, kw),
        );
        cpu.attention(&act(&q, qw), &act(&k, kw), &act(&v, kw), &mut ckv, &pos, p)
            .unwrap();
        let (gq, gk, gv) = (
            gpu.upload(&q, prefix, qw).unwrap(),
            gpu.upload(&k, prefix, kw).unwrap(),
            gpu.upload(&v, prefix, kw).unwrap(),
        );
        gpu.attention(&gq, &gk, &gv, &mut gkv, &pos, p).unwrap();
        let n: usize = lens.iter().sum();
        let (q, k, v) = (
            random_act(&mut rng, n, qw),
            random_act(&mut rng, n, kw),
            random_act(&mut rng, n, kw),
        );
        let want = cpu
            .attention_branches(
                &act(&q, qw),
                &act(&k, kw),
                &act(&v, kw),
                &ckv,
                prefix,
                &lens,
                p,
            )
            .unwrap()
            .data;
        let (gq, gk, gv) = (
            gpu.upload(&q, n, qw).unwrap(),
            gpu.upload(&k, n, kw).unwrap(),
            gpu.upload(&v, n, kw).unwrap(),
        );
        let t = gpu
            .attention_branches(&gq, &gk, &gv, &gkv, prefix, &lens, p)
            .unwrap();
        close(
            &format!("attention_branches {n_head}/{n_head_kv}×{hd} window {window} after {prefix}: {lens:?}"),
            pollster::block_on(gpu.read(&t)).unwrap(),
            &want,
            1e-11,
        );
    }
}

/// The encoder's ops on random tensors at odd sizes, GPU against CPU: LayerNorm with a bias,
/// the exact GELU over a wide range, and bidirectional attention within packed sequences
/// (grouped and plain heads, sequences of 1 to 70 rows).
#[test]
fn encoder_ops_on_the_gpu_match_the_cpu_on_random_tensors() {
    use kerze::backend::{AttnParams, Backend};
    use kerze::cpu::CpuBackend;

    let mut rng = Rng(0x5eed_0bee_f00d);
    let mut cpu = CpuBackend::new();
    let mut gpu = op_gpu();
    for (n, width) in [(1, 32), (7, 384), (19, 1024)] {
        // Rows with an offset and a spread, as residual sums have.
        let x: Vec<f32> = random_act(&mut rng, n, width)
            .iter()
            .map(|v| 3.0 + 5.0 * v)
            .collect();
        let w: Vec<f32> = (0..width).map(|_| rng.f(0.5, 1.5)).collect();
        let b: Vec<f32> = (0..width).map(|_| rng.f(-0.5, 0.5)).collect();
        let ((wb, wi), (bb, bi)) = (vector_weight(&w), vector_weight(&b));
        let (cw, cb) = (
            cpu.load_weight(&wi, &wb).unwrap(),
            cpu.load_weight(&bi, &bb).unwrap(),
        );
        let (gw, gb) = (
            gpu.load_weight(&wi, &wb).unwrap(),
            gpu.load_weight(&bi, &bb).unwrap(),
        );
        let want = cpu
            .layer_norm(&act(&x, width), &cw, &cb, 1e-12)
            .unwrap()
            .data;
        let gx = gpu.upload(&x, n, width).unwrap();
        let t = gpu.layer_norm(&gx, &gw, &gb, 1e-12).unwrap();
        close(
            &format!("layer_norm {n}×{width}"),
            pollster::block_on(gpu.read(&t)).unwrap(),
            &want,
            1e-11,
        );
        let y: Vec<f32> = x.iter().map(|v| v - 3.0).collect();
        let want = cpu.gelu(&act(&y, width)).unwrap().data;
        let gy = gpu.upload(&y, n, width).unwrap();
        let t = gpu.gelu(&gy).unwrap();
        close(
            &format!("gelu {n}×{width}"),
            pollster::block_on(gpu.read(&t)).unwrap(),
            &want,
            1e-11,
        );
    }
    for (n_head, n_head_kv, hd, lens) in [
        (12, 12, 32, vec![7, 1, 20]),
        (4, 2, 64, vec![70, 3]),
        (6, 1, 48, vec![1, 1, 2, 33]),
    ] {
        let n: usize = lens.iter().sum();
        let p = AttnParams {
            n_head,
            n_head_kv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            window: usize::MAX,
        };
        let q = random_act(&mut rng, n, n_head * hd);
        let k = random_act(&mut rng, n, n_head_kv * hd);
        let v = random_act(&mut rng, n, n_head_kv * hd);
        let want = cpu
            .attention_packed(
                &act(&q, n_head * hd),
                &act(&k, n_head_kv * hd),
                &act(&v, n_head_kv * hd),
                &lens,
                p,
            )
            .unwrap()
            .data;
        let gq = gpu.upload(&q, n, n_head * hd).unwrap();
        let gk = gpu.upload(&k, n, n_head_kv * hd).unwrap();
        let gv = gpu.upload(&v, n, n_head_kv * hd).unwrap();
        let t = gpu.attention_packed(&gq, &gk, &gv, &lens, p).unwrap();
        close(
            &format!("attention_packed {n_head}/{n_head_kv}×{hd} {lens:?}"),
            pollster::block_on(gpu.read(&t)).unwrap(),
            &want,
            1e-11,
        );
    }
}

/// all-MiniLM-L6-v2 converted to F16, on the GPU, against the f64 reference over its
/// safetensors on 200 sentences: cosine ≥ 0.99999.
#[test]
fn minilm_on_the_gpu_meets_the_f64_reference() {
    use kerze::embed::{cosine, EmbedOptions};
    use kerze::{Device, Engine, LoadOptions};
    let (folder, _, f16) = common::minilm_sources();
    let reference = bert_ref::BertRef::load(folder);
    let tok = kerze::Tokenizer::from_tokenizer_json(
        &std::fs::read(folder.join("tokenizer.json")).unwrap(),
    )
    .unwrap();
    // Every fourth of the sentences the CPU is gated on (tests/embed.rs): lavapipe took 32 s
    // for all 200 in f16.
    let texts: Vec<String> = common::minilm_sentences().into_iter().step_by(4).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let want: Vec<Vec<f32>> = texts
        .iter()
        .map(|t| {
            reference
                .embed_mean(&tok.encode_user(t, true).unwrap())
                .iter()
                .map(|&x| x as f32)
                .collect()
        })
        .collect();
    {
        let path = f16;
        let src = kerze::gguf::FileSource::open(path).unwrap();
        let (mut e, info) = pollster::block_on(Engine::load_async(
            Box::new(src),
            &LoadOptions {
                no_gpu: None,
                device: Device::Webgpu,
                n_ctx: None,
                exact: true,
            },
            &mut |_, _| {},
        ))
        .unwrap();
        assert_eq!(info.backend, "webgpu");
        let got = pollster::block_on(e.embed(&refs, &EmbedOptions::default())).unwrap();
        let worst = got
            .data
            .iter()
            .zip(&want)
            .map(|(a, b)| cosine(a, b))
            .fold(1.0f64, f64::min);
        eprintln!(
            "{} on the GPU: worst cosine to the f64 reference {worst:.7}",
            path.display()
        );
        assert!(worst >= 0.99999, "{}: {worst}", path.display());
    }
}

/// all-MiniLM-L6-v2 (the catalog's Q8_0 file) on the GPU gives the CPU engine's embeddings,
/// batched and one text at a time.
#[test]
fn minilm_on_the_gpu_equals_the_cpu() {
    use kerze::embed::{cosine, EmbedOptions};
    use kerze::{Device, Engine, LoadOptions};
    let path = common::catalog_model("all-minilm-l6-v2-q8_0.gguf");
    let load = |device| {
        let src = kerze::gguf::FileSource::open(&path).unwrap();
        pollster::block_on(Engine::load_async(
            Box::new(src),
            &LoadOptions {
                no_gpu: None,
                device,
                n_ctx: None,
                exact: true,
            },
            &mut |_, _| {},
        ))
        .unwrap()
    };
    let (mut g, info) = load(Device::Webgpu);
    assert_eq!(info.backend, "webgpu");
    let (mut c, _) = load(Device::Cpu);
    let texts = [
        "The weather is lovely today.",
        "It's so sunny outside!",
        "He drove to the stadium.",
        "Crème brûlée, naïve café — 東京は日本の首都です。",
        "https://www.example.com/path?query=1 and user@example.com 😀",
    ];
    let opts = EmbedOptions::default();
    let want = pollster::block_on(c.embed(&texts, &opts)).unwrap();
    let got = pollster::block_on(g.embed(&texts, &opts)).unwrap();
    assert_eq!(g.info().backend, "webgpu", "the engine stayed on the GPU");
    for ((a, b), t) in got.data.iter().zip(&want.data).zip(texts) {
        let cos = cosine(a, b);
        assert!(cos > 0.99999, "{t:?}: cosine {cos}");
    }
    let one = pollster::block_on(g.embed(&texts[..1], &opts)).unwrap();
    assert!(cosine(&one.data[0], &got.data[0]) > 0.999999);
}

/// Q2_K and Q3_K run on the CPU only: asking for the GPU is a typed error naming the tensor
/// and the types the GPU runs (`auto` goes to the CPU, see engine.rs).
#[test]
fn a_type_the_gpu_does_not_run_is_a_typed_error_on_webgpu() {
    use kerze::synth::{tiny_decoder, Quants};
    use kerze::{Device, Engine, Family, LoadOptions};
    let bytes = tiny_decoder(Family::Llama, Quants::all(GgmlType::Q2_K), 7).unwrap();
    let opts = LoadOptions {
        no_gpu: None,
        device: Device::Webgpu,
        n_ctx: None,
        exact: true,
    };
    let r = pollster::block_on(Engine::load_async(Box::new(bytes), &opts, &mut |_, _| {}));
    let e = r.err().expect("Q2_K loaded on the GPU");
    assert_eq!(e.kind(), "UnsupportedTensorTypeError", "{e}");
    assert!(
        e.to_string().contains("Q2_K") && e.to_string().contains("Q5_K"),
        "{e}"
    );
}

/// A prompt that shares only a beginning with what the GPU cache holds: the session goes back
/// to that beginning (the slots after it are ignored, then overwritten) and generates what the
/// CPU generates from scratch.
#[test]
fn going_back_to_a_shared_prefix_on_the_gpu_equals_the_cpu() {
    use kerze::synth::{tiny_decoder, Quants};
    let bytes = tiny_decoder(kerze::Family::Llama, Quants::all(GgmlType::Q8_0), 7).unwrap();
    let mut s = gpu_session(&bytes);
    let opts = kerze::GenerateOptions::greedy_tokens(6);
    let never = || false;
    let a = s
        .tok
        .encode_user("the sea and the river and the hills", true)
        .unwrap();
    let b = s
        .tok
        .encode_user("the sea and the river met a boat", true)
        .unwrap();
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    pollster::block_on(s.generate(a, &opts, &never, &mut |_| {})).unwrap();
    let g = pollster::block_on(s.generate(b.clone(), &opts, &never, &mut |_| {})).unwrap();
    assert_eq!(g.usage.prefill_tokens, b.len() - common);
    let (mut cpu, _) = kerze::Engine::load(&bytes, &exact_cpu(), &mut |_, _| {}).unwrap();
    let want = pollster::block_on(cpu.generate(b, &opts, &never, &mut |_| {})).unwrap();
    assert_eq!(g.generated(), want.generated());
}

/// Generative classification on the GPU equals the CPU's: the tiny Gemma 3 (window 8: the
/// prompt wraps the sliding layers' ring, which the labels' branches then read), labels of
/// one to several ids run as branches after the prompt in one pass.
#[test]
fn generative_classification_on_the_gpu_equals_the_cpu() {
    use kerze::classify::{ClassifyOptions, Labels};
    let bytes = kerze::synth::tiny_gemma3().unwrap();
    let mut s = gpu_session(&bytes);
    let labels = Labels::Names(
        [
            "sea",
            "a boat on the river",
            "the hills and the rain",
            "wind",
        ]
        .map(String::from)
        .into(),
    );
    let texts = ["the sea and the river and the hills", "a small boat"];
    let opts = ClassifyOptions::default();
    let got = pollster::block_on(s.classify(&texts, &labels, &opts)).unwrap();
    let (mut cpu, _) = kerze::Engine::load(&bytes, &exact_cpu(), &mut |_, _| {}).unwrap();
    let want = pollster::block_on(cpu.classify(&texts, &labels, &opts)).unwrap();
    assert_eq!(got.usage.decoder_passes, want.usage.decoder_passes);
    assert_eq!(got.usage.prompt_tokens, want.usage.prompt_tokens);
    for (g, w) in got.results.iter().zip(&want.results) {
        for s in w {
            let x = g.iter().find(|x| x.label == s.label).unwrap().score;
            // Keys and values held as f16 turn the backends' rounding differences into whole
            // f16 steps where a value straddles a rounding boundary: 1.0e-4 here.
            assert!(
                (x - s.score).abs() < 3e-4,
                "{}: GPU {x} vs CPU {}",
                s.label,
                s.score
            );
        }
    }
}

/// A prefix snapshot on the GPU: the keys and values read back and written into a fresh GPU
/// session give the teacher-forced logits of the session that computed them, bit for bit (the
/// tiny Gemma 3's rings wrap inside the prefix), and read back the same once restored.
#[test]
fn a_restored_prefix_on_the_gpu_gives_the_computed_logits_bit_for_bit() {
    let bytes = kerze::synth::tiny_gemma3().unwrap();
    let mut a = gpu_session(&bytes);
    let prefix = a
        .tok
        .encode_user(
            "the cat is in the garden and the dog is on the sofa, then the rain falls on the hills",
            true,
        )
        .unwrap();
    let mut ids = prefix.clone();
    ids.extend(
        a.tok
            .encode_user(" and the river runs to the sea", false)
            .unwrap(),
    );
    let p = prefix.len();
    assert!(p > 2 * kerze::synth::SLIDING_WINDOW);
    pollster::block_on(a.logits_from(&prefix, 1, p - 1)).unwrap();
    let snap = pollster::block_on(a.save_prefix()).unwrap();
    assert_eq!(snap.ids, prefix);
    let n_vocab = a.model.cfg().n_vocab;
    let want = pollster::block_on(a.logits_from(&ids, n_vocab, p)).unwrap();
    let mut b = gpu_session(&bytes);
    b.restore_prefix(&snap).unwrap();
    assert_eq!(pollster::block_on(b.save_prefix()).unwrap(), snap);
    let got = pollster::block_on(b.logits_from(&ids, n_vocab, p)).unwrap();
    assert_eq!(got.len(), ids.len() - p);
    let bits = |v: &[(u32, f32)]| {
        v.iter()
            .map(|&(id, l)| (id, l.to_bits()))
            .collect::<Vec<_>>()
    };
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(bits(g), bits(w), "position {}", p + i);
    }
    // The CPU's snapshot of the same prefix has the GPU's shapes and near its values.
    let (mut cpu, _) = kerze::Engine::load(&bytes, &exact_cpu(), &mut |_, _| {}).unwrap();
    let opts = kerze::GenerateOptions {
        save_prefix_at: Some(p),
        ..kerze::GenerateOptions::greedy_tokens(1)
    };
    let mut g = cpu.begin(ids.clone(), &opts).unwrap();
    while !pollster::block_on(cpu.prefill_step(&mut g)).unwrap() {}
    let c = g.take_prefix().unwrap();
    assert_eq!(c.layers.len(), snap.layers.len());
    for (x, y) in c.layers.iter().zip(&snap.layers) {
        assert_eq!(
            (x.n_slots, x.width, x.used()),
            (y.n_slots, y.width, y.used())
        );
        let (mut num, mut den) = (0f64, 0f64);
        for (a, b) in x.k.iter().chain(&x.v).zip(y.k.iter().chain(&y.v)) {
            num += (f64::from(*a) - f64::from(*b)).powi(2);
            den += f64::from(*b).powi(2);
        }
        // A whole model's rounding, not an exact kernel's (NMSE_MAX); both hold f16 values,
        // and where the two backends' f32 keys straddle an f16 rounding boundary they differ
        // by a whole f16 step (1.3e-7 here, against ~5e-8 with f32 caches).
        assert!(
            num / den < 3e-7,
            "CPU vs GPU prefix: NMSE {:.2e}",
            num / den
        );
    }
}

/// An int8 ONNX export kept int8 (I8 matrices with a scale and zero per row): the GPU loads
/// it dequantized to f32 (the backend's default) and gives the CPU's int8 kernel's
/// embeddings to the 16-bit activations' rounding.
#[test]
fn an_int8_onnx_export_on_the_gpu_equals_the_cpu() {
    use kerze::embed::{cosine, EmbedOptions};
    use kerze::{Device, Engine, LoadOptions};
    let onnx = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models/onnx/minilm/model_quantized.onnx");
    let g = kerze::convert::convert_onnx_file(&onnx, None).unwrap();
    let load = |device| {
        pollster::block_on(Engine::load_async(
            Box::new(g.clone()),
            &LoadOptions {
                no_gpu: None,
                device,
                n_ctx: None,
                exact: true,
            },
            &mut |_, _| {},
        ))
        .unwrap()
        .0
    };
    let (mut gpu, mut cpu) = (load(Device::Webgpu), load(Device::Cpu));
    assert_eq!(gpu.info().backend, "webgpu");
    let texts = ["The weather is lovely today.", "He drove to the stadium."];
    let opts = EmbedOptions::default();
    let want = pollster::block_on(cpu.embed(&texts, &opts)).unwrap();
    let got = pollster::block_on(gpu.embed(&texts, &opts)).unwrap();
    for (a, b) in got.data.iter().zip(&want.data) {
        let cos = cosine(a, b);
        assert!(cos > 0.99999, "cosine {cos}");
    }
}

/// The CPU engine the GPU is compared with: the exact path (16-bit activations), whose
/// numerics the GPU's kernels share; natively the default is the 8-bit path.
fn exact_cpu() -> kerze::LoadOptions {
    kerze::LoadOptions {
        exact: true,
        ..kerze::LoadOptions::default()
    }
}
