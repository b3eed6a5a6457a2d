//! The graph as [`View`] sees it: each value's producer and consumers, the initializers, and
//! the constants computed from them alone (`Constant`, `Identity`, `Cast`, `Transpose`,
//! `DequantizeLinear` of constants), cached and charged against a limit of this file's size.

use super::proto::{self, bad, Graph, Node, Tensor};
use crate::error::Result;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// A constant value the graph computes from initializers alone.
pub(super) struct Const {
    pub(super) dims: Vec<usize>,
    pub(super) v: Vec<f32>,
    /// Stored as 8- or 16-bit integers before any dequantization.
    pub(super) int: bool,
    pub(super) f16: bool,
}

/// The most steps a constant or a traced value is followed (a cycle in a hostile graph
/// ends here).
pub(super) const MAX_DEPTH: usize = 64;

pub(super) struct View<'m, 'a> {
    g: &'m Graph<'a>,
    /// Bytes of values computed so far, and the most a graph of this file's size may
    /// compute (a hostile graph that transposes one big constant many times stops here).
    spent: std::cell::Cell<usize>,
    limit: usize,
    producer: HashMap<&'a str, usize>,
    consumers: HashMap<&'a str, Vec<usize>>,
    pub(super) inits: HashMap<&'a str, &'m Tensor<'a>>,
    pub(super) consts: RefCell<HashMap<String, Option<Rc<Const>>>>,
}

pub(super) fn attr_i(n: &Node, name: &str) -> Option<i64> {
    n.attrs.iter().find(|a| a.name == name).and_then(|a| a.i)
}

pub(super) fn attr_f(n: &Node, name: &str) -> Option<f32> {
    n.attrs.iter().find(|a| a.name == name).and_then(|a| a.f)
}

pub(super) fn attr_s<'n>(n: &'n Node, name: &str) -> Option<&'n [u8]> {
    n.attrs.iter().find(|a| a.name == name).and_then(|a| a.s)
}

fn attr_ints<'n>(n: &'n Node, name: &str) -> Option<&'n [i64]> {
    n.attrs
        .iter()
        .find(|a| a.name == name)
        .map(|a| a.ints.as_slice())
}

fn tensor_const(t: &Tensor, v: &View) -> Result<Const> {
    v.charge(t.count()?)?;
    let dims = t
        .dims
        .iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| bad(format!("tensor {}: dims {:?}", t.name, t.dims)))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Const {
        v: t.to_f32()?,
        dims,
        int: matches!(
            t.dtype,
            proto::dtype::INT8 | proto::dtype::UINT8 | proto::dtype::INT16 | proto::dtype::UINT16
        ),
        f16: t.dtype == proto::dtype::FLOAT16 || t.dtype == proto::dtype::BFLOAT16,
    })
}

impl<'m, 'a> View<'m, 'a> {
    /// Count `n` more f32 values against the limit.
    pub(super) fn charge(&self, n: usize) -> Result<()> {
        let spent = n
            .checked_mul(4)
            .and_then(|b| b.checked_add(self.spent.get()))
            .filter(|&s| s <= self.limit)
            .ok_or_else(|| {
                bad(format!(
                    "the graph's constants come to more than {} MB of values (a file of this size has far less)",
                    self.limit >> 20
                ))
            })?;
        self.spent.set(spent);
        Ok(())
    }

    pub(super) fn new(g: &'m Graph<'a>, file_len: usize) -> Self {
        let mut producer = HashMap::new();
        let mut consumers: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, n) in g.nodes.iter().enumerate() {
            for o in &n.outputs {
                producer.insert(*o, i);
            }
            for x in &n.inputs {
                if !x.is_empty() {
                    consumers.entry(*x).or_default().push(i);
                }
            }
        }
        let inits = g.initializers.iter().map(|t| (t.name, t)).collect();
        Self {
            g,
            // int8 weights grow 4× as f32, and each is copied once more into the output.
            spent: std::cell::Cell::new(0),
            limit: file_len.saturating_mul(10).saturating_add(64 << 20),
            producer,
            consumers,
            inits,
            consts: RefCell::new(HashMap::new()),
        }
    }

    pub(super) fn node_of(&self, name: &str) -> Option<&'m Node<'a>> {
        self.producer.get(name).map(|&i| &self.g.nodes[i])
    }

    pub(super) fn users(&self, name: &str) -> impl Iterator<Item = (usize, &'m Node<'a>)> + '_ {
        self.consumers
            .get(name)
            .into_iter()
            .flatten()
            .map(|&i| (i, &self.g.nodes[i]))
    }

    /// The value of `name` when it is computed from constants alone.
    pub(super) fn constant(&self, name: &str) -> Result<Option<Rc<Const>>> {
        self.constant_at(name, 0)
    }

    fn constant_at(&self, name: &str, depth: usize) -> Result<Option<Rc<Const>>> {
        if name.is_empty() {
            return Ok(None);
        }
        if let Some(c) = self.consts.borrow().get(name) {
            return Ok(c.clone());
        }
        if depth > MAX_DEPTH {
            return Err(bad(format!(
                "constants nested more than {MAX_DEPTH} deep at {name} (a cycle?)"
            )));
        }
        let c = self.compute(name, depth)?;
        self.consts.borrow_mut().insert(name.to_string(), c.clone());
        Ok(c)
    }

    fn compute(&self, name: &str, depth: usize) -> Result<Option<Rc<Const>>> {
        if let Some(t) = self.inits.get(name) {
            return tensor_const(t, self).map(|c| Some(Rc::new(c)));
        }
        let Some(n) = self.node_of(name) else {
            return Ok(None);
        };
        let input = |i: usize| -> Result<Option<Rc<Const>>> {
            match n.inputs.get(i) {
                Some(x) => self.constant_at(x, depth + 1),
                None => Ok(None),
            }
        };
        let copy = |c: &Const| -> Result<Const> {
            self.charge(c.v.len())?;
            Ok(Const {
                dims: c.dims.clone(),
                v: c.v.clone(),
                int: c.int,
                f16: c.f16,
            })
        };
        // Identity and a Cast to float share the value (no copy).
        if n.op == "Identity"
            || (n.op == "Cast" && attr_i(n, "to") == Some(proto::dtype::FLOAT as i64))
        {
            return match input(0)? {
                Some(c) if n.op == "Identity" || !c.int => Ok(Some(c)),
                // A cast to float keeps the values (int8 → f32 is exact), no longer narrow.
                Some(c) => copy(&c).map(|mut c| {
                    c.int = false;
                    Some(Rc::new(c))
                }),
                None => Ok(None),
            };
        }
        Ok(match n.op {
            "Constant" => match n.attrs.iter().find(|a| a.name == "value") {
                Some(a) => match &a.t {
                    Some(t) => Some(tensor_const(t, self)?),
                    None => None,
                },
                None => {
                    if let Some(f) = attr_f(n, "value_float") {
                        Some(Const {
                            dims: vec![],
                            v: vec![f],
                            int: false,
                            f16: false,
                        })
                    } else {
                        attr_i(n, "value_int").map(|i| Const {
                            dims: vec![],
                            v: vec![i as f32],
                            int: false,
                            f16: false,
                        })
                    }
                }
            },
            "Transpose" => match input(0)? {
                Some(c) if c.dims.len() == 2 => {
                    let perm = attr_ints(n, "perm").unwrap_or(&[1, 0]);
                    if perm == [0, 1] {
                        return Ok(Some(c));
                    }
                    self.charge(c.v.len())?;
                    Some(Const {
                        dims: vec![c.dims[1], c.dims[0]],
                        v: transpose(&c.v, c.dims[0], c.dims[1]),
                        int: c.int,
                        f16: c.f16,
                    })
                }
                _ => None,
            },
            "DequantizeLinear" => {
                let (Some(x), Some(s)) = (input(0)?, input(1)?) else {
                    return Ok(None);
                };
                let zp = input(2)?;
                self.charge(x.v.len())?;
                Some(Const {
                    v: dequantize(&x, &s, zp.as_deref(), attr_i(n, "axis").unwrap_or(1), name)?,
                    dims: x.dims.clone(),
                    int: true,
                    f16: false,
                })
            }
            _ => None,
        }
        .map(Rc::new))
    }
}

/// A row-major `rows × cols` matrix transposed.
pub(super) fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; x.len()];
    for (i, row) in x.chunks_exact(cols).enumerate().take(rows) {
        for (j, &v) in row.iter().enumerate() {
            t[j * rows + i] = v;
        }
    }
    t
}

/// `(x − zero_point) · scale` in f32, per tensor or per slice along `axis`.
pub(super) fn dequantize(
    x: &Const,
    s: &Const,
    zp: Option<&Const>,
    axis: i64,
    at: &str,
) -> Result<Vec<f32>> {
    let rank = x.dims.len() as i64;
    let axis = if axis < 0 { axis + rank } else { axis };
    if let Some(z) = zp {
        if z.v.len() != s.v.len() {
            return Err(bad(format!(
                "{at}: {} scales but {} zero points",
                s.v.len(),
                z.v.len()
            )));
        }
    }
    if s.v.len() == 1 {
        let (s, z) = (s.v[0], zp.map_or(0.0, |z| z.v[0]));
        return Ok(x.v.iter().map(|&q| (q - z) * s).collect());
    }
    let ax = usize::try_from(axis).ok().filter(|&a| a < x.dims.len());
    let Some(ax) = ax.filter(|&a| x.dims[a] == s.v.len()) else {
        return Err(bad(format!(
            "{at}: {} scales for a tensor of dims {:?} along axis {axis}",
            s.v.len(),
            x.dims
        )));
    };
    let inner: usize = x.dims[ax + 1..].iter().product();
    let n = x.dims[ax];
    Ok(x.v
        .iter()
        .enumerate()
        .map(|(i, &q)| {
            let c = (i / inner) % n;
            (q - zp.map_or(0.0, |z| z.v[c])) * s.v[c]
        })
        .collect())
}
