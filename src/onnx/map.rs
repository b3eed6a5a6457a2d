//! [`read_bert`]: the linears, LayerNorms and embedding tables found in the graph, checked
//! against `config.json`'s sizes and taken in graph order onto a BERT's layers (and a
//! classification head), under their GGUF names.

use super::patterns::{Lin, Ln, Role};
use super::proto::{self, bad, Graph, Node};
use super::view::{attr_i, attr_s, dequantize, transpose, Const, View};
use super::weights::{Found, HeadActivation, Int8Rows, Sizes, Stored, Weight};
use crate::error::{Error, Result};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

/// A `MatMulInteger`'s `(in, out)` weight `q` with a scale and zero point per output, as
/// `(out, in)` int8 rows: `q` and the zero points less 128 when `q` is uint8.
fn int8_rows(q: &Const, scale: &[f32], zero: &[f32], at: &str) -> Result<Weight> {
    let (k, o) = (q.dims[0], q.dims[1]);
    let (lo, hi) =
        q.v.iter()
            .fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let shift = if hi > 127.0 { 128.0 } else { 0.0 };
    if lo - shift < -128.0 || hi - shift > 127.0 || q.v.iter().any(|v| v.fract() != 0.0) {
        return Err(bad(format!(
            "{at}: an integer weight from {lo} to {hi}: not int8 or uint8"
        )));
    }
    let mut values = vec![0i8; k * o];
    for (i, row) in q.v.chunks_exact(o).enumerate() {
        for (j, &x) in row.iter().enumerate() {
            values[j * k + i] = (x - shift) as i8;
        }
    }
    Ok(Weight {
        shape: vec![o, k],
        values: Vec::new(),
        int8: Some(Int8Rows {
            values,
            scale: scale.to_vec(),
            zero: zero.iter().map(|z| z - shift).collect(),
        }),
    })
}

/// What a graph's op types are, most frequent first, for an error message.
fn op_summary(g: &Graph) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for n in &g.nodes {
        *counts
            .entry(if n.op.is_empty() { "(no op)" } else { n.op })
            .or_default() += 1;
    }
    let mut v: Vec<_> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let shown: Vec<String> = v
        .iter()
        .take(12)
        .map(|(op, n)| format!("{op}×{n}"))
        .collect();
    let more = if v.len() > 12 {
        format!(" and {} more op types", v.len() - 12)
    } else {
        String::new()
    };
    format!("{} nodes: {}{more}", g.nodes.len(), shown.join(", "))
}

const SUPPORTED: &str = "ONNX exports of BERT-family encoders (BertModel, BertForSequenceClassification, DistilBERT; f32, f16 or int8) mapped onto its encoder";

fn unsupported(g: &Graph, why: String) -> Error {
    Error::UnsupportedArch {
        arch: format!("ONNX graph ({why}; {})", op_summary(g)),
        supported: SUPPORTED,
    }
}

/// The encoder weights of an ONNX file whose sizes `config.json` gives.
pub fn read_bert(bytes: &[u8], s: &Sizes) -> Result<Found> {
    let m = proto::parse(bytes)?;
    let g = &m.graph;
    if g.sparse_initializers > 0 {
        return Err(bad("sparse initializers are not supported"));
    }
    if let Some(n) = g
        .nodes
        .iter()
        .find(|n| !n.domain.is_empty() && n.domain != "ai.onnx")
    {
        return Err(unsupported(
            g,
            format!(
                "op {} of domain {} (a fused, runtime-specific graph: give the plain export, not an optimized one)",
                n.op, n.domain
            ),
        ));
    }
    let v = View::new(g, bytes.len());
    let (e, f) = (s.n_embd, s.n_ff);

    // Linears, LayerNorms and embedding tables, in graph order.
    let mut lins: Vec<Lin> = Vec::new();
    let mut lns: Vec<Ln> = Vec::new();
    let mut tables: Vec<(usize, Rc<Const>, String)> = Vec::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if let Some(l) = v.linear(i, n)? {
            lins.push(l);
        } else if let Some(l) = v.layer_norm(i, n)? {
            lns.push(l);
        } else if n.op == "Gather" && n.inputs.len() == 2 {
            if let Some(t) = v.constant(n.inputs[0])? {
                if t.dims.len() == 2 && t.dims[1] == e {
                    let t = if t.int {
                        // onnxruntime's quantized Gather: the rows, then DequantizeLinear.
                        let dq = v
                            .users(n.outputs[0])
                            .find(|(_, d)| d.op == "DequantizeLinear");
                        let Some((_, dq)) = dq else {
                            return Err(bad(format!(
                                "Gather {} of an integer table without DequantizeLinear",
                                n.name
                            )));
                        };
                        let sc = v.constant(dq.inputs.get(1).copied().unwrap_or(""))?;
                        let zp = v.constant(dq.inputs.get(2).copied().unwrap_or(""))?;
                        let sc = sc.ok_or_else(|| {
                            bad(format!(
                                "DequantizeLinear {} without a constant scale",
                                dq.name
                            ))
                        })?;
                        v.charge(t.v.len())?;
                        let vals = dequantize(
                            &t,
                            &sc,
                            zp.as_deref(),
                            attr_i(dq, "axis").unwrap_or(1),
                            dq.name,
                        )?;
                        Rc::new(Const {
                            dims: t.dims.clone(),
                            v: vals,
                            int: true,
                            f16: false,
                        })
                    } else {
                        t
                    };
                    tables.push((i, t, n.inputs[1].to_string()));
                }
            }
        }
    }
    if lins.is_empty() && lns.is_empty() {
        return Err(unsupported(g, "no linear layers or LayerNorms".into()));
    }

    // Attention roles.
    let mut lin_of: HashMap<String, usize> = HashMap::new();
    for (k, l) in lins.iter().enumerate() {
        for o in &l.outs {
            lin_of.insert(o.clone(), k);
        }
    }
    let mut roles: HashMap<usize, Role> = HashMap::new();
    let mut attentions = 0;
    for n in &g.nodes {
        if n.op != "MatMul" || n.inputs.len() != 2 || v.constant(n.inputs[1])?.is_some() {
            continue;
        }
        let (a, b) = (v.trace(n.inputs[0], &lin_of), v.trace(n.inputs[1], &lin_of));
        match (a, b) {
            (Some(Ok(q)), Some(Ok(k))) => {
                attentions += 1;
                roles.insert(q, Role::Q);
                roles.insert(k, Role::K);
            }
            (Some(Err(())), Some(Ok(val))) => {
                roles.insert(val, Role::V);
            }
            _ => {}
        }
    }
    if attentions != s.n_layer {
        return Err(unsupported(
            g,
            format!(
                "{attentions} attention blocks found, config.json says {} layers",
                s.n_layer
            ),
        ));
    }
    // Erf (the decomposition) or an opset-20 Gelu that is not the tanh approximation.
    let erf_gelu = |n: &&Node| {
        n.op == "Erf" || (n.op == "Gelu" && attr_s(n, "approximate").is_none_or(|a| a == b"none"))
    };
    let gelus = g.nodes.iter().filter(erf_gelu).count();
    if gelus < s.n_layer {
        return Err(unsupported(
            g,
            format!("{gelus} erf GELUs for {} layers", s.n_layer),
        ));
    }
    if lins.len() < 6 * s.n_layer || lns.len() != 2 * s.n_layer + 1 {
        return Err(unsupported(
            g,
            format!(
                "{} linear layers and {} LayerNorms; a {}-layer BERT has {} and {}",
                lins.len(),
                lns.len(),
                s.n_layer,
                6 * s.n_layer,
                2 * s.n_layer + 1
            ),
        ));
    }

    let stored = if lins.iter().any(|l| l.quantized) {
        Stored::Int8
    } else if lins.iter().all(|l| l.w.f16) {
        Stored::F16
    } else {
        Stored::F32
    };
    let eps = lns.first().map(|l| l.eps);
    // From here each value has one owner (the cache let go), so the tables move out and
    // each matrix is freed once transposed: the peak is the file, its values and one matrix.
    v.consts.borrow_mut().clear();
    let mut out: BTreeMap<String, Weight> = BTreeMap::new();
    let owned = |c: Rc<Const>| Rc::try_unwrap(c).map_or_else(|c| c.v.clone(), |c| c.v);
    let matrix = |c: &Const| -> Result<Weight> {
        // (in, out) → (out, in)
        v.charge(c.v.len())?;
        Ok(Weight::float(
            vec![c.dims[1], c.dims[0]],
            transpose(&c.v, c.dims[0], c.dims[1]),
        ))
    };
    let vector = |c: &Const| Weight::float(vec![c.v.len()], c.v.clone());
    let put_lin = |out: &mut BTreeMap<String, Weight>,
                   name: &str,
                   l: Lin,
                   k: usize,
                   o: usize|
     -> Result<()> {
        if l.w.dims != [k, o] {
            return Err(bad(format!(
                "{name}: a {}×{} matrix where {k}×{o} belongs",
                l.w.dims[0], l.w.dims[1]
            )));
        }
        let w = match &l.int8 {
            Some((q, scale, zero)) => int8_rows(q, scale, zero, name)?,
            None => matrix(&l.w)?,
        };
        out.insert(format!("{name}.weight"), w);
        let b = l
            .bias
            .as_ref()
            .map_or_else(|| Weight::float(vec![o], vec![0.0; o]), |b| vector(b));
        out.insert(format!("{name}.bias"), b);
        Ok(())
    };
    let put_ln = |out: &mut BTreeMap<String, Weight>, name: &str, l: &Ln| -> Result<()> {
        if l.gamma.v.len() != e || l.beta.as_ref().is_some_and(|b| b.v.len() != e) {
            return Err(bad(format!(
                "{name}: a LayerNorm of {} values where {e} belong",
                l.gamma.v.len()
            )));
        }
        out.insert(format!("{name}.weight"), vector(&l.gamma));
        out.insert(
            format!("{name}.bias"),
            l.beta
                .as_ref()
                .map_or_else(|| Weight::float(vec![e], vec![0.0; e]), |b| vector(b)),
        );
        Ok(())
    };

    put_ln(&mut out, "token_embd_norm", &lns[0])?;
    let n_lins = lins.len();
    let mut slots: Vec<Option<Lin>> = lins.into_iter().map(Some).collect();
    let mut take = |j: usize| {
        slots
            .get_mut(j)
            .and_then(Option::take)
            .ok_or_else(|| bad("a linear layer taken twice"))
    };
    for il in 0..s.n_layer {
        let mut qkv = [None; 3];
        let mut rest = Vec::new();
        for j in 6 * il..6 * il + 6 {
            match roles.get(&j) {
                Some(Role::Q) => qkv[0] = Some(j),
                Some(Role::K) => qkv[1] = Some(j),
                Some(Role::V) => qkv[2] = Some(j),
                None => rest.push(j),
            }
        }
        let (Some(q), Some(k), Some(val), &[o, up, down]) = (qkv[0], qkv[1], qkv[2], &rest[..])
        else {
            return Err(unsupported(
                g,
                format!("layer {il}'s six linear layers are not Q, K, V, output, up and down"),
            ));
        };
        let (n1, n2) = (&lns[1 + 2 * il], &lns[2 + 2 * il]);
        let b = |n: &str| format!("blk.{il}.{n}");
        let (o, up, down) = (take(o)?, take(up)?, take(down)?);
        // Each LayerNorm sits between its layer's linears: after the attention output,
        // before up; after down.
        if !(o.at < n1.at && n1.at < up.at && down.at < n2.at) {
            return Err(unsupported(g, format!("layer {il}'s LayerNorms are not post-LN (after attention and after the feed-forward)")));
        }
        put_lin(&mut out, &b("attn_q"), take(q)?, e, e)?;
        put_lin(&mut out, &b("attn_k"), take(k)?, e, e)?;
        put_lin(&mut out, &b("attn_v"), take(val)?, e, e)?;
        put_lin(&mut out, &b("attn_output"), o, e, e)?;
        put_lin(&mut out, &b("ffn_up"), up, e, f)?;
        put_lin(&mut out, &b("ffn_down"), down, f, e)?;
        put_ln(&mut out, &b("attn_output_norm"), n1)?;
        put_ln(&mut out, &b("layer_output_norm"), n2)?;
    }
    let head_lins: Vec<Lin> = (6 * s.n_layer..n_lins)
        .map(&mut take)
        .collect::<Result<_>>()?;
    let mut head_lins = head_lins.into_iter();
    let head = match (head_lins.next(), head_lins.next(), head_lins.len()) {
        (None, _, _) => None,
        (Some(cls), None, _) => {
            let n = cls.w.dims[1];
            put_lin(&mut out, "cls.output", cls, e, n)?;
            None
        }
        (Some(pool), Some(cls), 0) => {
            let act = pool.outs.last().and_then(|o| {
                v.users(o).find_map(|(_, n)| match n.op {
                    "Tanh" => Some(HeadActivation::Tanh),
                    "Relu" => Some(HeadActivation::Relu),
                    _ => None,
                })
            });
            let act = act.ok_or_else(|| {
                unsupported(
                    g,
                    "a head whose pooler is followed by neither Tanh nor Relu".into(),
                )
            })?;
            put_lin(&mut out, "cls", pool, e, e)?;
            let n = cls.w.dims[1];
            put_lin(&mut out, "cls.output", cls, e, n)?;
            Some(act)
        }
        (_, _, more) => {
            return Err(unsupported(
                g,
                format!(
                "{} linear layers after the last encoder layer (a head kerze maps has one or two)",
                more + 2
            ),
            ))
        }
    };

    // Embedding tables by their rows (the word table also by its indices: input_ids).
    let mut word = None;
    let mut pos = None;
    let mut types = None;
    let n_tables = tables.len();
    for (_, t, idx) in tables {
        let rows = t.dims[0];
        let from_ids = g.inputs.contains(&idx.as_str()) && idx.contains("input_ids");
        if (from_ids || rows == s.n_vocab) && word.is_none() {
            word = Some(t);
        } else if rows == s.n_pos && pos.is_none() {
            pos = Some(t);
        } else if rows == s.n_types && types.is_none() {
            types = Some(t);
        }
    }
    let (Some(word), Some(pos)) = (word, pos) else {
        return Err(unsupported(
            g,
            format!("{n_tables} embedding tables, no word or position table among them"),
        ));
    };
    if word.dims[0] != s.n_vocab {
        return Err(bad(format!(
            "the word table has {} rows, config.json says vocab_size {}",
            word.dims[0], s.n_vocab
        )));
    }
    let table = |c: Rc<Const>| Weight::float(c.dims.clone(), owned(c));
    out.insert("token_embd.weight".into(), table(word));
    out.insert("position_embd.weight".into(), table(pos));
    if let Some(t) = types {
        out.insert("token_types.weight".into(), table(t));
    }
    Ok(Found {
        tensors: out,
        eps,
        head,
        stored,
        producer: m.producer.to_string(),
    })
}
