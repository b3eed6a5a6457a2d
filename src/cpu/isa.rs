//! The one choice of instruction set for every CPU kernel family: the dense panels
//! (dense/), the quantized rows (int8/) and the vector helpers (ops/). Each family keeps
//! one file per instruction set (`avx2.rs`, `wasm.rs`, `portable.rs`); its dispatch asks
//! [`Isa::best`] and calls that file's kernel, or the portable reference; check.rs holds
//! every family's SIMD kernels to the portable ones.

/// An instruction set the CPU kernels are written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Plain Rust: the reference every other kernel is tested against.
    Portable,
    /// x86-64 with AVX2 and FMA, detected at run time.
    Avx2,
    /// wasm simd128: every wasm build (the crate does not compile without it).
    Simd128,
    /// wasm simd128 and relaxed SIMD: the relaxed builds (int8 products on 7-bit
    /// activations, the LM head's filter).
    RelaxedSimd,
}

impl Isa {
    /// The best this build and CPU have: fixed at compile time in wasm, natively AVX2 where
    /// the CPU has it (std caches the check).
    pub fn best() -> Isa {
        if cfg!(all(target_arch = "wasm32", target_feature = "relaxed-simd")) {
            return Isa::RelaxedSimd;
        }
        if cfg!(target_arch = "wasm32") {
            return Isa::Simd128;
        }
        #[cfg(target_arch = "x86_64")]
        {
            // Asked for every kernel call (a tile of a product): one load once it is known.
            static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
            *BEST.get_or_init(|| {
                if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                    Isa::Avx2
                } else {
                    Isa::Portable
                }
            })
        }
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Portable
    }

    /// Whether the AVX2 kernels may run: natively on a CPU that has AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    pub fn avx2() -> bool {
        Isa::best() == Isa::Avx2
    }

    /// The name [`crate::EngineInfo::simd`] reports: `relaxed-simd`, `simd128`, `avx2` or
    /// `portable`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Simd128 => "simd128",
            Isa::RelaxedSimd => "relaxed-simd",
        }
    }
}
