//! Rows of an embedding table, dequantized and scaled (shaders/embed.wgsl + the type's
//! `deq`): one dispatch per part of a split table, each writing the rows it holds.

use std::collections::HashMap;

use super::{Bind, Recorder};
use crate::error::{Error, Result};
use crate::gguf::GgmlType;
use crate::gpu::weights::GpuWeight;
use crate::gpu::{shaders, Gpu};

pub struct Embed {
    pipelines: HashMap<GgmlType, wgpu::ComputePipeline>,
}

/// Arena bytes [`Embed::encode`] needs for its params, per part of the table.
pub const PARAMS_BYTES_PER_PART: u64 = 32 + 256;

impl Embed {
    pub fn new(gpu: &Gpu) -> Result<Self> {
        let gather = super::layout(gpu, 3, 2, Some(1));
        let mut pipelines = HashMap::new();
        for (ty, _) in shaders::WEIGHT_TYPES {
            pipelines.insert(
                *ty,
                super::pipeline(gpu, "embed", Some(*ty), "main", &gather)?,
            );
        }
        Ok(Self { pipelines })
    }

    /// `out[t] = scale · table[ids[t]]` for `n_tok` ids already in the arena (`ids`).
    #[allow(clippy::too_many_arguments)]
    pub fn encode(
        &self,
        gpu: &Gpu,
        rec: &mut Recorder,
        table: &GpuWeight,
        ids: Bind,
        n_tok: u32,
        scale: f32,
        out: &wgpu::Buffer,
    ) -> Result<()> {
        let pipeline = self
            .pipelines
            .get(&table.ty)
            .ok_or_else(|| Error::Backend(format!("no embedding kernel for {}", table.ty)))?;
        for part in &table.parts {
            let params = [
                table.cols as u32,
                part.rows as u32,
                part.row0 as u32,
                n_tok,
                scale.to_bits(),
                0,
                0,
                0,
            ];
            rec.dispatch(
                gpu,
                pipeline,
                &[(&part.buf).into(), ids, out.into()],
                &params,
                (n_tok, 1),
            );
        }
        Ok(())
    }
}
