//! The one table of WGSL sources (src/gpu/shaders/*.wgsl). A kernel that depends on the
//! weight type is its body plus that type's `subdot` (WGSL has no includes), one that reads
//! keys and values its body plus `kv_f16`: [`source`] joins them, and the naga test
//! validates every joined module.

use crate::gguf::GgmlType;

/// A shader file: its name and text.
pub struct Shader {
    pub name: &'static str,
    pub text: &'static str,
}

/// Keys and values rounded as the CPU backend's f16 cache holds them (`kv_f16`), for the
/// kernels that attend over them or write them into the cache.
const KV_F16: &str = include_str!("shaders/kv_f16.wgsl");

/// Every kernel body.
pub const KERNELS: &[Shader] = &[
    Shader {
        name: "matvec",
        text: include_str!("shaders/matvec.wgsl"),
    },
    Shader {
        name: "matvec_rows",
        text: include_str!("shaders/matvec_rows.wgsl"),
    },
    Shader {
        name: "matmat",
        text: include_str!("shaders/matmat.wgsl"),
    },
    Shader {
        name: "embed",
        text: include_str!("shaders/embed.wgsl"),
    },
    Shader {
        name: "rms_norm",
        text: include_str!("shaders/rms_norm.wgsl"),
    },
    Shader {
        name: "rope",
        text: include_str!("shaders/rope.wgsl"),
    },
    Shader {
        name: "elementwise",
        text: include_str!("shaders/elementwise.wgsl"),
    },
    Shader {
        name: "topk",
        text: include_str!("shaders/topk.wgsl"),
    },
    Shader {
        name: "attention",
        text: include_str!("shaders/attention.wgsl"),
    },
    Shader {
        name: "kv_write",
        text: include_str!("shaders/kv_write.wgsl"),
    },
    Shader {
        name: "fill",
        text: include_str!("shaders/fill.wgsl"),
    },
    Shader {
        name: "layer_norm",
        text: include_str!("shaders/layer_norm.wgsl"),
    },
    Shader {
        name: "attention_branches",
        text: include_str!("shaders/attention_branches.wgsl"),
    },
    Shader {
        name: "attention_packed",
        text: include_str!("shaders/attention_packed.wgsl"),
    },
];

/// Kernels built once per weight type (they call the type's `subdot` or `deq`).
pub fn per_weight_type(kernel: &str) -> bool {
    matches!(kernel, "matvec" | "matvec_rows" | "matmat" | "embed")
}

/// Every weight type's access functions.
pub const WEIGHT_TYPES: &[(GgmlType, Shader)] = &[
    (
        GgmlType::Q8_0,
        Shader {
            name: "q8_0",
            text: include_str!("shaders/q8_0.wgsl"),
        },
    ),
    (
        GgmlType::Q5_0,
        Shader {
            name: "q5_0",
            text: include_str!("shaders/q5_0.wgsl"),
        },
    ),
    (
        GgmlType::Q4_K,
        Shader {
            name: "q4_k",
            text: include_str!("shaders/q4_k.wgsl"),
        },
    ),
    (
        GgmlType::Q6_K,
        Shader {
            name: "q6_k",
            text: include_str!("shaders/q6_k.wgsl"),
        },
    ),
    (
        GgmlType::Q4_0,
        Shader {
            name: "q4_0",
            text: include_str!("shaders/q4_0.wgsl"),
        },
    ),
    (
        GgmlType::F16,
        Shader {
            name: "f16",
            text: include_str!("shaders/f16.wgsl"),
        },
    ),
    (
        GgmlType::Q4_1,
        Shader {
            name: "q4_1",
            text: include_str!("shaders/q4_1.wgsl"),
        },
    ),
    (
        GgmlType::Q5_1,
        Shader {
            name: "q5_1",
            text: include_str!("shaders/q5_1.wgsl"),
        },
    ),
    (
        GgmlType::Q5_K,
        Shader {
            name: "q5_k",
            text: include_str!("shaders/q5_k.wgsl"),
        },
    ),
    (
        GgmlType::BF16,
        Shader {
            name: "bf16",
            text: include_str!("shaders/bf16.wgsl"),
        },
    ),
    (
        GgmlType::F32,
        Shader {
            name: "f32",
            text: include_str!("shaders/f32.wgsl"),
        },
    ),
];

/// The full source of `kernel` for weights of type `ty` (None: a kernel without weights).
pub fn source(kernel: &str, ty: Option<GgmlType>) -> Option<String> {
    let body = KERNELS.iter().find(|s| s.name == kernel)?;
    let mut out = body.text.to_string();
    if matches!(kernel, "attention" | "attention_branches" | "kv_write") {
        out.push('\n');
        out.push_str(KV_F16);
    }
    if let Some(ty) = ty {
        let (_, w) = WEIGHT_TYPES.iter().find(|(t, _)| *t == ty)?;
        out.push('\n');
        out.push_str(w.text);
    }
    Some(out)
}

/// Every module the backend builds: (label, source). The naga test walks this.
pub fn all_modules() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for k in KERNELS {
        if per_weight_type(k.name) {
            for (ty, w) in WEIGHT_TYPES {
                if let Some(src) = source(k.name, Some(*ty)) {
                    out.push((format!("{}+{}", k.name, w.name), src));
                }
            }
        } else if let Some(src) = source(k.name, None) {
            out.push((k.name.to_string(), src));
        }
    }
    out
}
