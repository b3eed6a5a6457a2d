//! The patterns the mapping looks for in the graph: a linear (`MatMul`, `Gemm` or
//! `MatMulInteger` of a constant weight, with its bias), a LayerNorm (the node or its opset <
//! 17 decomposition), and the tracing of attention's inputs back to the linears that made
//! them (their Q, K and V roles).

use super::proto::{bad, Node};
use super::view::{attr_f, attr_i, transpose, Const, View, MAX_DEPTH};
use crate::error::Result;
use std::collections::HashMap;
use std::rc::Rc;

/// A linear layer found in the graph.
pub(super) struct Lin {
    /// The index of its MatMul (graph order).
    pub(super) at: usize,
    /// `(in, out)`, the layout of `MatMul(x, W)`.
    pub(super) w: Rc<Const>,
    pub(super) bias: Option<Rc<Const>>,
    /// Its output (after the bias when there is one) and the MatMul's own output.
    pub(super) outs: Vec<String>,
    pub(super) quantized: bool,
    /// A `MatMulInteger`'s weight as stored: `(q (in, out), scale, zero point)` per output
    /// (then `w` holds only the dims).
    pub(super) int8: Option<(Rc<Const>, Vec<f32>, Vec<f32>)>,
}

pub(super) struct Ln {
    pub(super) at: usize,
    pub(super) gamma: Rc<Const>,
    pub(super) beta: Option<Rc<Const>>,
    pub(super) eps: f32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    Q,
    K,
    V,
}

/// Ops a traced value passes through on its way from a linear to attention.
const PASS: &[&str] = &[
    "Reshape",
    "Transpose",
    "Div",
    "Mul",
    "Unsqueeze",
    "Squeeze",
    "Identity",
    "Cast",
    "Dropout",
    "Add",
];

impl View<'_, '_> {
    /// The linear whose MatMul is node `i`, if it is one.
    pub(super) fn linear(&self, i: usize, n: &Node) -> Result<Option<Lin>> {
        let two_d = |c: &Option<Rc<Const>>| c.as_ref().is_some_and(|c| c.dims.len() == 2);
        let mut int8 = None;
        let (w, mut out, quantized) = match n.op {
            "MatMul" => {
                let w = self.constant(n.inputs.get(1).copied().unwrap_or(""))?;
                let a = self.constant(n.inputs.first().copied().unwrap_or(""))?;
                if !two_d(&w) || a.is_some() {
                    return Ok(None);
                }
                let q = w.as_ref().is_some_and(|w| w.int);
                (w, n.outputs[0].to_string(), q)
            }
            "Gemm" => {
                let w = self.constant(n.inputs.get(1).copied().unwrap_or(""))?;
                if !two_d(&w) {
                    return Ok(None);
                }
                if attr_i(n, "transA").unwrap_or(0) != 0
                    || attr_f(n, "alpha").unwrap_or(1.0) != 1.0
                    || attr_f(n, "beta").unwrap_or(1.0) != 1.0
                {
                    return Err(bad(format!(
                        "Gemm {} with transA, alpha or beta: not a linear layer kerze maps",
                        n.name
                    )));
                }
                let mut w = w.ok_or_else(|| bad("Gemm without weight"))?;
                if attr_i(n, "transB").unwrap_or(0) != 0 {
                    self.charge(w.v.len())?;
                    w = Rc::new(Const {
                        dims: vec![w.dims[1], w.dims[0]],
                        v: transpose(&w.v, w.dims[0], w.dims[1]),
                        int: w.int,
                        f16: w.f16,
                    });
                }
                let bias = self.constant(n.inputs.get(2).copied().unwrap_or(""))?;
                let quantized = w.int;
                return Ok(Some(Lin {
                    at: i,
                    bias: check_bias(bias, w.dims[1], n.name)?,
                    w,
                    outs: vec![n.outputs[0].to_string()],
                    quantized,
                    int8: None,
                }));
            }
            "MatMulInteger" => {
                // onnxruntime's dynamic quantization: DynamicQuantizeLinear(x) → MatMulInteger
                // (x_q, W_q, x_zp, W_zp) → Cast → Mul(·, x_scale · W_scale).
                let wq = self.constant(n.inputs.get(1).copied().unwrap_or(""))?;
                if !two_d(&wq) {
                    return Ok(None);
                }
                let wq = wq.ok_or_else(|| bad("MatMulInteger without weight"))?;
                let zp = self.constant(n.inputs.get(3).copied().unwrap_or(""))?;
                let scale = self.integer_scale(n)?;
                let Some((scale, out)) = scale else {
                    return Err(bad(format!(
                        "MatMulInteger {}: no Cast → Mul by the weight's scale after it (not onnxruntime's dynamic quantization)",
                        n.name
                    )));
                };
                let per_out = |c: &Const, what: &str| match c.v.len() {
                    1 => Ok(vec![c.v[0]; wq.dims[1]]),
                    n if n == wq.dims[1] => Ok(c.v.clone()),
                    len => Err(bad(format!(
                        "{}: {len} {what} for a weight of {:?} (one, or one per output)",
                        n.name, wq.dims
                    ))),
                };
                let scales = per_out(&scale, "scales")?;
                let zeros = match &zp {
                    Some(z) => per_out(z, "zero points")?,
                    None => vec![0.0; wq.dims[1]],
                };
                // The matrix stays int8; `w` carries its dims (and its kind) only.
                let w = Const {
                    dims: wq.dims.clone(),
                    v: Vec::new(),
                    int: true,
                    f16: false,
                };
                int8 = Some((wq, scales, zeros));
                (Some(Rc::new(w)), out, true)
            }
            _ => return Ok(None),
        };
        let w = w.ok_or_else(|| bad("linear without weight"))?;
        let mut outs = vec![out.clone()];
        // The bias: an Add of a constant vector of `out` values, the only user.
        let mut bias = None;
        let users: Vec<_> = self.users(&out).collect();
        if let [(_, add)] = users[..] {
            if add.op == "Add" && add.inputs.len() == 2 {
                let other = if add.inputs[0] == out {
                    add.inputs[1]
                } else {
                    add.inputs[0]
                };
                if let Some(b) = self.constant(other)? {
                    bias = check_bias(Some(b), w.dims[1], add.name)?;
                    out = add.outputs[0].to_string();
                    outs.push(out.clone());
                }
            }
        }
        Ok(Some(Lin {
            at: i,
            w,
            bias,
            outs,
            quantized,
            int8,
        }))
    }

    /// The weight scale of a MatMulInteger: the constant factor of the `Mul` its (cast)
    /// output goes into, and that Mul's output.
    fn integer_scale(&self, n: &Node) -> Result<Option<(Rc<Const>, String)>> {
        for (_, cast) in self.users(n.outputs[0]) {
            if cast.op != "Cast" {
                continue;
            }
            for (_, mul) in self.users(cast.outputs[0]) {
                if mul.op != "Mul" || mul.inputs.len() != 2 {
                    continue;
                }
                let other = if mul.inputs[0] == cast.outputs[0] {
                    mul.inputs[1]
                } else {
                    mul.inputs[0]
                };
                // other = Mul(x_scale, W_scale): the constant one is the weight's.
                if let Some(p) = self.node_of(other) {
                    if p.op == "Mul" && p.inputs.len() == 2 {
                        for x in &p.inputs {
                            if let Some(s) = self.constant(x)? {
                                return Ok(Some((s, mul.outputs[0].to_string())));
                            }
                        }
                    }
                }
                if let Some(s) = self.constant(other)? {
                    return Ok(Some((s, mul.outputs[0].to_string())));
                }
            }
        }
        Ok(None)
    }

    /// The LayerNorm ending at node `i`, if one does.
    pub(super) fn layer_norm(&self, i: usize, n: &Node) -> Result<Option<Ln>> {
        if n.op == "LayerNormalization" {
            let axis = attr_i(n, "axis").unwrap_or(-1);
            if axis != -1 && axis != 2 {
                return Err(bad(format!(
                    "LayerNormalization {} over axis {axis}: not a BERT LayerNorm",
                    n.name
                )));
            }
            let gamma = self
                .constant(n.inputs.get(1).copied().unwrap_or(""))?
                .ok_or_else(|| {
                    bad(format!(
                        "LayerNormalization {} without a constant scale",
                        n.name
                    ))
                })?;
            let beta = self.constant(n.inputs.get(2).copied().unwrap_or(""))?;
            return Ok(Some(Ln {
                at: i,
                gamma,
                beta,
                eps: attr_f(n, "epsilon").unwrap_or(1e-5),
            }));
        }
        // The decomposition ends in Add(Mul(Div(x − mean, Sqrt(var + ε)), γ), β).
        if n.op != "Add" || n.inputs.len() != 2 {
            return Ok(None);
        }
        for (mul_in, beta_in) in [(n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])] {
            let Some(mul) = self
                .node_of(mul_in)
                .filter(|m| m.op == "Mul" && m.inputs.len() == 2)
            else {
                continue;
            };
            for (div_in, gamma_in) in [
                (mul.inputs[0], mul.inputs[1]),
                (mul.inputs[1], mul.inputs[0]),
            ] {
                let Some(div) = self
                    .node_of(div_in)
                    .filter(|d| d.op == "Div" && d.inputs.len() == 2)
                else {
                    continue;
                };
                let Some(sqrt) = self.node_of(div.inputs[1]).filter(|s| s.op == "Sqrt") else {
                    continue;
                };
                let Some(add) = sqrt
                    .inputs
                    .first()
                    .and_then(|x| self.node_of(x))
                    .filter(|a| a.op == "Add" && a.inputs.len() == 2)
                else {
                    continue;
                };
                let mut eps = None;
                for x in &add.inputs {
                    if let Some(c) = self.constant(x)? {
                        eps = c.v.first().copied().filter(|_| c.v.len() == 1);
                    }
                }
                let mean = self.node_of(div.inputs[0]).is_some_and(|s| s.op == "Sub");
                let (Some(eps), Some(gamma), Some(beta), true) =
                    (eps, self.constant(gamma_in)?, self.constant(beta_in)?, mean)
                else {
                    continue;
                };
                return Ok(Some(Ln {
                    at: i,
                    gamma,
                    beta: Some(beta),
                    eps,
                }));
            }
        }
        Ok(None)
    }

    /// Where `name` comes from, followed back through reshapes, transposes and scalings: a
    /// linear (by output), a Softmax, or neither.
    pub(super) fn trace(
        &self,
        name: &str,
        lin_of: &HashMap<String, usize>,
    ) -> Option<Result<usize, ()>> {
        let mut x = name.to_string();
        for _ in 0..MAX_DEPTH {
            if let Some(&l) = lin_of.get(&x) {
                return Some(Ok(l));
            }
            let n = self.node_of(&x)?;
            if n.op == "Softmax" {
                return Some(Err(()));
            }
            if !PASS.contains(&n.op) {
                return None;
            }
            // Follow the input that is computed (the other is a constant scale or shape).
            let next = n.inputs.iter().find(|i| {
                !i.is_empty()
                    && !self.inits.contains_key(*i)
                    && self.node_of(i).is_some_and(|p| {
                        p.op != "Constant" && p.op != "Shape" && p.op != "Concat" && p.op != "Sqrt"
                    })
            })?;
            x = next.to_string();
        }
        None
    }
}

fn check_bias(b: Option<Rc<Const>>, out: usize, at: &str) -> Result<Option<Rc<Const>>> {
    match b {
        Some(b) if b.v.len() == out => Ok(Some(b)),
        Some(b) => Err(bad(format!(
            "{at}: a bias of {} values after a linear of {out} outputs",
            b.v.len()
        ))),
        None => Ok(None),
    }
}
