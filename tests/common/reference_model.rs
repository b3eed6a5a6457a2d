#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The slow, obvious decoder forward pass in f64 for every family (Gemma 3, Llama, Qwen2,
//! Qwen3): weights dequantized by candle from their original GGUF types, no KV cache, every
//! position recomputed; what differs between families is read from the tensors the file has
//! (biases, QK-norm, post-norms, `output.weight`, `rope_freqs.weight`) and the family. The
//! engine's fast path is tested against it.

use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::Device;
use kerze::gguf::{ByteSource, GgmlType, Gguf};
use kerze::ModelConfig;
use std::borrow::Cow;
use std::collections::HashMap;

pub struct RefModel {
    pub cfg: ModelConfig,
    w: HashMap<String, (Vec<f64>, usize, usize)>,
    /// Keys and values rounded to f16 before they are attended, as the CPU backend's cache
    /// (and llama.cpp's) holds them.
    f16_kv: bool,
}

fn dequant(bytes: &[u8], ty: GgmlType, rows: usize, cols: usize) -> Vec<f64> {
    let dt = match ty {
        GgmlType::F32 => GgmlDType::F32,
        GgmlType::F16 => GgmlDType::F16,
        GgmlType::BF16 => GgmlDType::BF16,
        GgmlType::Q4_0 => GgmlDType::Q4_0,
        GgmlType::Q4_1 => GgmlDType::Q4_1,
        GgmlType::Q5_0 => GgmlDType::Q5_0,
        GgmlType::Q5_1 => GgmlDType::Q5_1,
        GgmlType::Q8_0 => GgmlDType::Q8_0,
        GgmlType::Q2_K => GgmlDType::Q2K,
        GgmlType::Q3_K => GgmlDType::Q3K,
        GgmlType::Q4_K => GgmlDType::Q4K,
        GgmlType::Q5_K => GgmlDType::Q5K,
        GgmlType::Q6_K => GgmlDType::Q6K,
        t => panic!("reference: no dequantizer for {t}"),
    };
    let aligned: Vec<u64> = bytes
        .chunks(8)
        .map(|c| {
            let mut a = [0u8; 8];
            a[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(a)
        })
        .collect();
    // SAFETY: reinterpreting initialised u64s as bytes.
    let view = unsafe { std::slice::from_raw_parts(aligned.as_ptr().cast::<u8>(), bytes.len()) };
    let s = QStorage::from_data(Cow::Borrowed(view), &Device::Cpu, dt).unwrap();
    let t = QTensor::new(s, (rows, cols))
        .unwrap()
        .dequantize(&Device::Cpu)
        .unwrap();
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .into_iter()
        .map(f64::from)
        .collect()
}

impl RefModel {
    pub fn load(bytes: &[u8]) -> Self {
        let g = Gguf::read(bytes).unwrap();
        let cfg = ModelConfig::from_gguf(&g, None).unwrap();
        let mut w = HashMap::new();
        for t in &g.tensors {
            let mut buf = vec![0u8; t.n_bytes as usize];
            bytes.read_at(t.offset, &mut buf).unwrap();
            let (rows, cols) = t.rows_cols();
            w.insert(
                t.name.clone(),
                (dequant(&buf, t.ty, rows, cols), rows, cols),
            );
        }
        Self {
            cfg,
            w,
            f16_kv: false,
        }
    }

    /// The same model with its keys and values rounded to f16 (what the CPU backend holds).
    #[allow(dead_code)] // not every test binary that includes this file asks for it
    pub fn f16_kv(self) -> Self {
        Self {
            f16_kv: true,
            ..self
        }
    }

    fn get(&self, name: &str) -> &(Vec<f64>, usize, usize) {
        &self.w[name]
    }

    fn has(&self, name: &str) -> bool {
        self.w.contains_key(name)
    }

    /// `x + bias` on every row, if the file has the bias.
    fn bias(&self, mut x: Vec<f64>, name: &str) -> Vec<f64> {
        if let Some((b, _, _)) = self.w.get(name) {
            for row in x.chunks_mut(b.len()) {
                row.iter_mut().zip(b).for_each(|(v, bi)| *v += bi);
            }
        }
        x
    }

    /// RMS-norm with `name` if the file has it.
    fn rms_opt(&self, x: Vec<f64>, name: &str) -> Vec<f64> {
        if self.has(name) {
            self.rms(&x, name)
        } else {
            x
        }
    }

    /// x (n, k) @ W(rows=m, cols=k)ᵀ → (n, m)
    fn mm(&self, x: &[f64], name: &str) -> Vec<f64> {
        let (w, m, k) = self.get(name);
        let n = x.len() / k;
        let mut y = vec![0.0; n * m];
        for i in 0..n {
            for j in 0..*m {
                y[i * m + j] = crate::common::dot(&x[i * k..(i + 1) * k], &w[j * k..(j + 1) * k]);
            }
        }
        y
    }

    fn rms(&self, x: &[f64], name: &str) -> Vec<f64> {
        let (w, _, d) = self.get(name);
        let d = *d;
        let eps = f64::from(self.cfg.rms_eps);
        x.chunks(d)
            .flat_map(|g| {
                let r = 1.0 / (g.iter().map(|v| v * v).sum::<f64>() / d as f64 + eps).sqrt();
                g.iter()
                    .zip(w)
                    .map(move |(v, wi)| v * r * wi)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn rope(&self, x: &mut [f64], width: usize, base: f64) {
        let c = &self.cfg;
        let hd = c.head_dim;
        let half = hd / 2;
        let factors = self.w.get("rope_freqs.weight").map(|t| &t.0);
        let neox = c.family != kerze::Family::Llama;
        for (p, row) in x.chunks_mut(width).enumerate() {
            for h in row.chunks_mut(hd) {
                for i in 0..half {
                    let ff = factors.map_or(1.0, |f| f[i]);
                    let ang = p as f64
                        * f64::from(c.rope_freq_scale)
                        * base.powf(-2.0 * i as f64 / hd as f64)
                        / ff;
                    let (s, co) = ang.sin_cos();
                    let (ia, ib) = if neox {
                        (i, i + half)
                    } else {
                        (2 * i, 2 * i + 1)
                    };
                    let (a, b) = (h[ia], h[ib]);
                    h[ia] = a * co - b * s;
                    h[ib] = a * s + b * co;
                }
            }
        }
    }

    /// Logits (n_vocab) after every position of `ids`.
    pub fn logits(&self, ids: &[u32]) -> Vec<Vec<f64>> {
        let c = &self.cfg;
        let t = ids.len();
        let (emb, _, d) = self.get("token_embd.weight");
        let mut x: Vec<f64> = ids
            .iter()
            .flat_map(|&id| {
                emb[id as usize * d..(id as usize + 1) * d]
                    .iter()
                    .map(|v| v * f64::from(c.embd_scale))
            })
            .collect();
        let (hd, nh, nkv) = (c.head_dim, c.n_head, c.n_head_kv);
        for il in 0..c.n_layer {
            let p = |n: &str| format!("blk.{il}.{n}.weight");
            let global = c.is_global(il);
            let b = |n: &str| format!("blk.{il}.{n}.bias");
            let h = self.rms(&x, &p("attn_norm"));
            let q = self.bias(self.mm(&h, &p("attn_q")), &b("attn_q"));
            let k = self.bias(self.mm(&h, &p("attn_k")), &b("attn_k"));
            let v = self.bias(self.mm(&h, &p("attn_v")), &b("attn_v"));
            let mut q = self.rms_opt(q, &p("attn_q_norm"));
            let mut k = self.rms_opt(k, &p("attn_k_norm"));
            let base = f64::from(if global {
                c.rope_base_global
            } else {
                c.rope_base_local
            });
            self.rope(&mut q, nh * hd, base);
            self.rope(&mut k, nkv * hd, base);
            let mut v = v;
            if self.f16_kv {
                for x in k.iter_mut().chain(v.iter_mut()) {
                    *x = half::f16::from_f64(*x).to_f64();
                }
            }
            let mut out = vec![0.0; t * nh * hd];
            for i in 0..t {
                for hh in 0..nh {
                    let kh = hh * nkv / nh;
                    let qv = &q[(i * nh + hh) * hd..(i * nh + hh + 1) * hd];
                    let mut s: Vec<f64> = (0..t)
                        .map(|j| {
                            let visible = j <= i && (global || i - j < c.sliding_window.unwrap());
                            if !visible {
                                return f64::NEG_INFINITY;
                            }
                            let kv = &k[(j * nkv + kh) * hd..(j * nkv + kh + 1) * hd];
                            crate::common::dot(qv, kv) * f64::from(c.attn_scale)
                        })
                        .collect();
                    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    s.iter_mut().for_each(|v| *v = (*v - m).exp());
                    let sum: f64 = s.iter().sum();
                    for j in 0..t {
                        for e in 0..hd {
                            out[(i * nh + hh) * hd + e] += s[j] / sum * v[(j * nkv + kh) * hd + e];
                        }
                    }
                }
            }
            let a = self.rms_opt(self.mm(&out, &p("attn_output")), &p("post_attention_norm"));
            x.iter_mut().zip(&a).for_each(|(xi, ai)| *xi += ai);
            let h = self.rms(&x, &p("ffn_norm"));
            let gate = self.mm(&h, &p("ffn_gate"));
            let up = self.mm(&h, &p("ffn_up"));
            let f: Vec<f64> = gate
                .iter()
                .zip(&up)
                .map(|(g, u)| {
                    let act = if c.family == kerze::Family::Gemma3 {
                        0.5 * g
                            * (1.0
                                + ((2.0 / std::f64::consts::PI).sqrt()
                                    * (g + 0.044715 * g * g * g))
                                    .tanh())
                    } else {
                        g / (1.0 + (-g).exp())
                    };
                    act * u
                })
                .collect();
            let f = self.rms_opt(self.mm(&f, &p("ffn_down")), &p("post_ffw_norm"));
            x.iter_mut().zip(&f).for_each(|(xi, fi)| *xi += fi);
        }
        let x = self.rms(&x, "output_norm.weight");
        let head = if self.has("output.weight") {
            "output.weight"
        } else {
            "token_embd.weight"
        };
        let l = self.mm(&x, head);
        l.chunks(c.n_vocab).map(|r| r.to_vec()).collect()
    }
}
