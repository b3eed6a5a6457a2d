//! Element-wise kernels (shaders/elementwise.wgsl): sums, gated products, row biases.

use super::{grid, Recorder};
use crate::config::Glu;
use crate::error::Result;
use crate::gpu::Gpu;

/// What an element-wise dispatch computes from `a` and `b`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `a + b`.
    Add,
    /// `act(a) * b`.
    Glu(Glu),
    /// `a + b[i % width]`: `b` is one row (a bias).
    AddRow { width: u32 },
    /// The exact (erf) GELU of `a` (`b` unread).
    GeluErf,
}

/// The shader's `Params`.
#[derive(Clone, Copy, Debug)]
struct Params {
    n: u32,
    groups_x: u32,
    /// Values per row of `a` (AddRow).
    width: u32,
}

impl Params {
    fn words(&self) -> [u32; 4] {
        [self.n, self.groups_x, self.width, 0]
    }
}

pub struct Elementwise {
    add: wgpu::ComputePipeline,
    gelu_mul: wgpu::ComputePipeline,
    silu_mul: wgpu::ComputePipeline,
    add_row: wgpu::ComputePipeline,
    gelu_erf: wgpu::ComputePipeline,
}

impl Elementwise {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        let l = super::layout(gpu, 3, 2, None);
        let p = |entry: &str| super::pipeline(gpu, "elementwise", None, entry, &l);
        Ok(Self {
            add: p("add")?,
            gelu_mul: p("gelu_mul")?,
            silu_mul: p("silu_mul")?,
            add_row: p("add_row")?,
            gelu_erf: p("gelu_erf")?,
        })
    }

    /// `out[i] = op(a, b)[i]` for `i < n`.
    #[allow(clippy::too_many_arguments)]
    pub fn encode(
        &self,
        gpu: &Gpu,
        rec: &mut Recorder,
        op: Op,
        a: &wgpu::Buffer,
        b: &wgpu::Buffer,
        out: &wgpu::Buffer,
        n: u32,
    ) {
        let (gx, gy) = grid(n.div_ceil(64));
        let (pipeline, width) = match op {
            Op::Add => (&self.add, 0),
            Op::Glu(Glu::GeluTanh) => (&self.gelu_mul, 0),
            Op::Glu(Glu::Silu) => (&self.silu_mul, 0),
            Op::AddRow { width } => (&self.add_row, width),
            Op::GeluErf => (&self.gelu_erf, 0),
        };
        let p = Params {
            n,
            groups_x: gx,
            width,
        };
        rec.dispatch(
            gpu,
            pipeline,
            &[a.into(), b.into(), out.into()],
            &p.words(),
            (gx, gy),
        );
    }
}
