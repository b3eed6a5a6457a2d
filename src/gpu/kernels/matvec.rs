//! The decode product `y = x @ Wᵀ` for a few activation rows, per weight type, over every
//! part of a split weight (shaders/matvec.wgsl + the type's `subdot`).

use std::collections::HashMap;

use super::{grid, Recorder};
use crate::error::{Error, Result};
use crate::gguf::GgmlType;
use crate::gpu::shaders;
use crate::gpu::weights::GpuWeight;
use crate::gpu::Gpu;

/// Output rows per workgroup (ROWS in matvec.wgsl).
const ROWS: u32 = 4;

pub struct Matvec {
    pipelines: HashMap<GgmlType, wgpu::ComputePipeline>,
    /// The tiled product for many activation rows (shaders/matmat.wgsl).
    tiled: HashMap<GgmlType, wgpu::ComputePipeline>,
    /// One thread per row (shaders/matvec_rows.wgsl): for software adapters.
    per_row: HashMap<GgmlType, wgpu::ComputePipeline>,
    /// Use `per_row` (decode and prefill): set for software adapters (CPU emulations).
    pub row_per_thread: bool,
}

/// Loop iterations one invocation of the thread-per-row kernel may run. llvmpipe (lavapipe)
/// silently ends every loop of an invocation after ~65 535 iterations in all (measured: a
/// Q6_K 640×2048 product for 64 activation rows left rows 31.. unwritten), so a long
/// product is dispatched in slices of activation rows that stay under this.
const ROW_LOOP_BUDGET: usize = 40_000;

/// Loop iterations per 32-weight sub-block in a type's `subdot`, at most, plus the caller's.
const SUBDOT_ITERATIONS: usize = 34;

/// Activation rows per tiled workgroup (TM in matmat.wgsl); from 2 rows on the tiled kernel
/// pays (each weight is dequantized once per TM rows).
const TM: u32 = 16;

impl Matvec {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        let mut pipelines = HashMap::new();
        let mut tiled = HashMap::new();
        let mut per_row = HashMap::new();
        let l = super::layout(gpu, 3, 2, None);
        for (ty, _) in shaders::WEIGHT_TYPES {
            pipelines.insert(*ty, super::pipeline(gpu, "matvec", Some(*ty), "main", &l)?);
            tiled.insert(*ty, super::pipeline(gpu, "matmat", Some(*ty), "main", &l)?);
            per_row.insert(
                *ty,
                super::pipeline(gpu, "matvec_rows", Some(*ty), "main", &l)?,
            );
        }
        Ok(Self {
            pipelines,
            tiled,
            per_row,
            row_per_thread: gpu.info.device_type == wgpu::DeviceType::Cpu,
        })
    }

    /// Record `y (m × w.rows) = x (m × w.cols) @ wᵀ` into `enc`.
    pub fn encode(
        &self,
        gpu: &Gpu,
        rec: &mut Recorder,
        w: &GpuWeight,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        m: usize,
    ) -> Result<()> {
        // A thread per row on software adapters (no barriers: CPU emulations run it as plain
        // SIMD loops; 1.7x the tiled kernel's prefill on lavapipe); on GPUs lanes per row
        // for decode and the tiled kernel for prefill.
        let per_row = self.row_per_thread;
        let tiled = !per_row && m > 1;
        let table = if tiled {
            &self.tiled
        } else if per_row {
            &self.per_row
        } else {
            &self.pipelines
        };
        let pipeline = table.get(&w.ty).ok_or_else(|| {
            Error::Backend(format!("no matrix product kernel for {} weights", w.ty))
        })?;
        // Activation rows per dispatch: all, or for the thread-per-row kernel as many as
        // keep an invocation's loops under the software adapter's budget.
        let slice = if per_row {
            (ROW_LOOP_BUDGET / ((w.cols / 32).max(1) * SUBDOT_ITERATIONS)).max(1)
        } else {
            m.max(1)
        };
        for part in &w.parts {
            let rows = part.rows as u32;
            // (x, y) workgroups: 64 rows each (thread per row), 64 rows × TM activation rows
            // (tiled), or ROWS rows each (lanes per row); x past 65 535 folds into y.
            let (gx, gy) = if per_row {
                grid(rows.div_ceil(64))
            } else if tiled {
                (rows.div_ceil(64), (m as u32).div_ceil(TM))
            } else {
                grid(rows.div_ceil(ROWS))
            };
            for m0 in (0..m).step_by(slice) {
                let mc = slice.min(m - m0);
                let params = [
                    w.cols as u32,
                    rows,
                    part.row0 as u32,
                    w.rows as u32,
                    mc as u32,
                    gx,
                    m0 as u32,
                    0,
                ];
                rec.dispatch(
                    gpu,
                    pipeline,
                    &[(&part.buf).into(), x.into(), y.into()],
                    &params,
                    (gx, gy),
                );
            }
        }
        Ok(())
    }
}
