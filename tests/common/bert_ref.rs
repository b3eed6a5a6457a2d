#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]
//! The slow, obvious BERT encoder in f64 over a Hugging Face folder (`config.json`,
//! `model.safetensors` read here with its own small parser, Hugging Face tensor names, not
//! the GGUF): embeddings + LayerNorm, post-LN blocks of full attention and an erf-GELU
//! feed-forward, mean / CLS pooling, L2 normalisation. The engine's encoder is tested
//! against it; it shares no code with `kerze convert` or `model/bert.rs`.

use std::collections::HashMap;
use std::path::Path;

pub struct BertRef {
    n_embd: usize,
    n_head: usize,
    n_layer: usize,
    eps: f64,
    /// name → (values, rows, cols)
    w: HashMap<String, (Vec<f64>, usize, usize)>,
}

/// erf in f64 to ~1e-15: the Maclaurin series below 3, the continued fraction of erfc above.
pub fn erf(x: f64) -> f64 {
    let a = x.abs();
    let r = if a < 3.0 {
        let mut term = a;
        let mut sum = a;
        let mut n = 0.0;
        loop {
            n += 1.0;
            term *= -a * a / n;
            let t = term / (2.0 * n + 1.0);
            sum += t;
            if t.abs() < 1e-17 * sum.abs() {
                break;
            }
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc(a) = exp(-a²)/√π · 1/(a + 1/2/(a + 1/(a + 3/2/(a + 2/(a + …))))), from the tail.
        let mut f = a;
        for k in (1..60).rev() {
            f = a + (k as f64 / 2.0) / f;
        }
        1.0 - (-a * a).exp() / std::f64::consts::PI.sqrt() / f
    };
    if x < 0.0 {
        -r
    } else {
        r
    }
}

fn read_safetensors(bytes: &[u8]) -> HashMap<String, (Vec<f64>, usize, usize)> {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let mut out = HashMap::new();
    for (name, t) in header {
        if name == "__metadata__" || t["dtype"] != "F32" {
            continue;
        }
        let shape: Vec<usize> = t["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        let (s, e) = (
            t["data_offsets"][0].as_u64().unwrap() as usize,
            t["data_offsets"][1].as_u64().unwrap() as usize,
        );
        let v: Vec<f64> = data[s..e]
            .chunks_exact(4)
            .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .collect();
        let (rows, cols) = match shape[..] {
            [r, c] => (r, c),
            [c] => (1, c),
            _ => continue,
        };
        out.insert(name, (v, rows, cols));
    }
    out
}

impl BertRef {
    /// A BERT folder, or a DistilBERT one (its tensors renamed to BERT's, no token types).
    pub fn load(dir: &Path) -> Self {
        let cfg: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        let raw = read_safetensors(&std::fs::read(dir.join("model.safetensors")).unwrap());
        let distil = cfg["model_type"] == "distilbert";
        let mut w = HashMap::new();
        for (name, t) in raw {
            let mut n = name
                .trim_start_matches("bert.")
                .trim_start_matches("distilbert.")
                .to_string();
            if distil {
                for (from, to) in [
                    ("transformer.layer.", "encoder.layer."),
                    (".attention.q_lin.", ".attention.self.query."),
                    (".attention.k_lin.", ".attention.self.key."),
                    (".attention.v_lin.", ".attention.self.value."),
                    (".attention.out_lin.", ".attention.output.dense."),
                    (".sa_layer_norm.", ".attention.output.LayerNorm."),
                    (".ffn.lin1.", ".intermediate.dense."),
                    (".ffn.lin2.", ".output.dense."),
                    (".output_layer_norm.", ".output.LayerNorm."),
                ] {
                    n = n.replace(from, to);
                }
            }
            w.insert(n, t);
        }
        let k = |bert: &str, distilbert: &str| {
            cfg[if distil { distilbert } else { bert }]
                .as_u64()
                .unwrap() as usize
        };
        let n_embd = k("hidden_size", "dim");
        if distil {
            // No segment embeddings: zeros add nothing.
            w.insert(
                "embeddings.token_type_embeddings.weight".into(),
                (vec![0.0; n_embd], 1, n_embd),
            );
        }
        Self {
            n_embd,
            n_head: k("num_attention_heads", "n_heads"),
            n_layer: k("num_hidden_layers", "n_layers"),
            eps: cfg["layer_norm_eps"].as_f64().unwrap_or(1e-12),
            w,
        }
    }

    fn t(&self, name: &str) -> &(Vec<f64>, usize, usize) {
        self.w
            .get(name)
            .unwrap_or_else(|| panic!("no tensor {name}"))
    }

    /// `x (n × in) @ Wᵀ + b` for the linear layer `prefix`.
    fn linear(&self, x: &[f64], n: usize, prefix: &str) -> Vec<f64> {
        let (w, rows, cols) = self.t(&format!("{prefix}.weight"));
        let (b, _, _) = self.t(&format!("{prefix}.bias"));
        let mut y = vec![0.0; n * rows];
        for t in 0..n {
            let xr = &x[t * cols..(t + 1) * cols];
            for o in 0..*rows {
                let wr = &w[o * cols..(o + 1) * cols];
                y[t * rows + o] = crate::common::dot(xr, wr) + b[o];
            }
        }
        y
    }

    fn layer_norm(&self, x: &mut [f64], prefix: &str) {
        let (g, _, _) = self.t(&format!("{prefix}.weight"));
        let (b, _, _) = self.t(&format!("{prefix}.bias"));
        let d = self.n_embd;
        for row in x.chunks_exact_mut(d) {
            let mean = row.iter().sum::<f64>() / d as f64;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / d as f64;
            let inv = 1.0 / (var + self.eps).sqrt();
            for (i, v) in row.iter_mut().enumerate() {
                *v = (*v - mean) * inv * g[i] + b[i];
            }
        }
    }

    /// Every token's final state, `(ids.len(), n_embd)`.
    pub fn states(&self, ids: &[u32]) -> Vec<f64> {
        let (d, n) = (self.n_embd, ids.len());
        let (we, _, _) = self.t("embeddings.word_embeddings.weight");
        let (wp, _, _) = self.t("embeddings.position_embeddings.weight");
        let (wt, _, _) = self.t("embeddings.token_type_embeddings.weight");
        let mut x = vec![0.0; n * d];
        for (t, &id) in ids.iter().enumerate() {
            for i in 0..d {
                x[t * d + i] = we[id as usize * d + i] + wp[t * d + i] + wt[i];
            }
        }
        self.layer_norm(&mut x, "embeddings.LayerNorm");
        let hd = d / self.n_head;
        let scale = 1.0 / (hd as f64).sqrt();
        for l in 0..self.n_layer {
            let p = |s: &str| format!("encoder.layer.{l}.{s}");
            let q = self.linear(&x, n, &p("attention.self.query"));
            let k = self.linear(&x, n, &p("attention.self.key"));
            let v = self.linear(&x, n, &p("attention.self.value"));
            let mut a = vec![0.0; n * d];
            for h in 0..self.n_head {
                for t in 0..n {
                    let qv = &q[t * d + h * hd..t * d + (h + 1) * hd];
                    let s: Vec<f64> = (0..n)
                        .map(|j| {
                            let kv = &k[j * d + h * hd..j * d + (h + 1) * hd];
                            crate::common::dot(qv, kv) * scale
                        })
                        .collect();
                    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (j, ej) in e.iter().enumerate() {
                        for i in 0..hd {
                            a[t * d + h * hd + i] += ej / z * v[j * d + h * hd + i];
                        }
                    }
                }
            }
            let o = self.linear(&a, n, &p("attention.output.dense"));
            for (xi, oi) in x.iter_mut().zip(&o) {
                *xi += oi;
            }
            self.layer_norm(&mut x, &p("attention.output.LayerNorm"));
            let mut u = self.linear(&x, n, &p("intermediate.dense"));
            for v in &mut u {
                *v = 0.5 * *v * (1.0 + erf(*v / std::f64::consts::SQRT_2));
            }
            let dn = self.linear(&u, n, &p("output.dense"));
            for (xi, di) in x.iter_mut().zip(&dn) {
                *xi += di;
            }
            self.layer_norm(&mut x, &p("output.LayerNorm"));
        }
        x
    }

    /// The mean-pooled, unit-length sentence embedding (all-MiniLM-L6-v2's pooling).
    pub fn embed_mean(&self, ids: &[u32]) -> Vec<f64> {
        self.embed(ids, "mean")
    }

    /// The unit-length embedding pooled by `pooling`: `mean`, `cls` (first token) or `last`.
    pub fn embed(&self, ids: &[u32], pooling: &str) -> Vec<f64> {
        let d = self.n_embd;
        let s = self.states(ids);
        let v: Vec<f64> = match pooling {
            "cls" => s[..d].to_vec(),
            "last" => s[s.len() - d..].to_vec(),
            _ => {
                let mut v = vec![0.0; d];
                for row in s.chunks_exact(d) {
                    for (a, x) in v.iter_mut().zip(row) {
                        *a += x / ids.len() as f64;
                    }
                }
                v
            }
        };
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        v.iter().map(|x| x / norm).collect()
    }
}
