//! The device decision, pure: which device a load asks for ([`Device`]), what the probe found
//! ([`GpuProbe`]), and where to load with the reason the engine reports ([`choose`], and
//! [`after_gpu_failure`] when the GPU could not take the model).

use crate::error::{Error, Result};

/// Which device to run on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// WebGPU when an adapter exists and the model fits it, else the CPU.
    #[default]
    Auto,
    Cpu,
    Webgpu,
}

/// What the device check found about a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuProbe {
    /// `device: 'cpu'`: not looked for.
    NotAsked,
    /// A build without the GPU backend.
    NotBuilt,
    NoAdapter,
    /// Opening the adapter or its device failed.
    Failed(String),
    /// The caller looked already and found no GPU to take, for this reason.
    Declined(String),
    Adapter {
        name: String,
        software: bool,
    },
}

/// Where to load, with the reason the engine reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    Cpu(String),
    /// On the adapter named so.
    Gpu(String),
}

/// The device decision, pure: every reason the engine gives for its backend is written
/// here (and in [`after_gpu_failure`]).
pub fn choose(device: Device, probe: &GpuProbe) -> Result<Choice> {
    use GpuProbe as P;
    Ok(match (device, probe) {
        (Device::Cpu, _) => Choice::Cpu("device 'cpu' was asked for".into()),
        (Device::Webgpu, P::NotBuilt) => {
            return Err(Error::InvalidArgument(
                "device 'webgpu' is not available in this build: use 'auto' or 'cpu'".into(),
            ))
        }
        (Device::Webgpu, P::NoAdapter | P::NotAsked | P::Declined(_)) => {
            return Err(Error::Backend(
                "device 'webgpu' was asked for, but there is no WebGPU adapter".into(),
            ))
        }
        (Device::Webgpu, P::Failed(e)) => {
            return Err(Error::Backend(format!(
                "device 'webgpu' was asked for, but the GPU failed to open: {e}"
            )))
        }
        (Device::Webgpu, P::Adapter { name, .. }) => Choice::Gpu(name.clone()),
        (
            Device::Auto,
            P::Adapter {
                name,
                software: false,
            },
        ) => Choice::Gpu(name.clone()),
        (
            Device::Auto,
            P::Adapter {
                name,
                software: true,
            },
        ) => Choice::Cpu(format!(
            "the only GPU adapter, {name}, is a software renderer: the CPU engine is faster"
        )),
        (Device::Auto, P::NoAdapter) => Choice::Cpu("no WebGPU adapter: running on the CPU".into()),
        (Device::Auto, P::Failed(e)) => {
            Choice::Cpu(format!("the GPU failed to open ({e}): running on the CPU"))
        }
        (Device::Auto, P::NotBuilt | P::NotAsked) => {
            Choice::Cpu("no GPU backend in this build: running on the CPU".into())
        }
        (Device::Auto, P::Declined(why)) => Choice::Cpu(format!("{why}: running on the CPU")),
    })
}

/// After the model failed to load on the GPU with `e`: the reason to load it on the CPU
/// instead, or `None` to fail. What the GPU cannot do (a lost device, out of memory, a limit,
/// a weight type its kernels lack) leaves `auto` the CPU; a bad file fails there too, and
/// `webgpu` asked for the GPU only.
pub fn after_gpu_failure(device: Device, e: &Error) -> Option<String> {
    let gpu_side = matches!(
        e,
        Error::Device(_) | Error::Backend(_) | Error::UnsupportedTensorType { .. }
    );
    (device == Device::Auto && gpu_side)
        .then(|| format!("the model did not load on the GPU ({e}): running on the CPU"))
}

#[cfg(test)]
mod choose_tests {
    use super::*;

    fn gpu(software: bool) -> GpuProbe {
        GpuProbe::Adapter {
            name: "Adapter (Vulkan)".into(),
            software,
        }
    }

    #[test]
    fn every_device_and_probe_has_one_answer() {
        let probes = [
            GpuProbe::NotAsked,
            GpuProbe::NotBuilt,
            GpuProbe::NoAdapter,
            GpuProbe::Failed("lost".into()),
            GpuProbe::Declined("no WebGPU adapter".into()),
            gpu(false),
            gpu(true),
        ];
        let want = |d: Device, p: &GpuProbe| -> std::result::Result<&str, &str> {
            match (d, p) {
                (Device::Cpu, _) => Ok("cpu: device 'cpu' was asked for"),
                (
                    Device::Auto,
                    GpuProbe::Adapter {
                        software: false, ..
                    },
                )
                | (Device::Webgpu, GpuProbe::Adapter { .. }) => Ok("gpu"),
                (Device::Auto, GpuProbe::Adapter { software: true, .. }) => {
                    Ok("cpu: the only GPU adapter")
                }
                (Device::Auto, GpuProbe::NoAdapter) => Ok("cpu: no WebGPU adapter"),
                (Device::Auto, GpuProbe::Failed(_)) => Ok("cpu: the GPU failed to open (lost)"),
                (Device::Auto, GpuProbe::Declined(_)) => Ok("cpu: no WebGPU adapter: running"),
                (Device::Auto, _) => Ok("cpu: no GPU backend in this build"),
                (Device::Webgpu, GpuProbe::NotBuilt) => Err("not available in this build"),
                (Device::Webgpu, GpuProbe::Failed(_)) => Err("failed to open: lost"),
                (Device::Webgpu, _) => Err("no WebGPU adapter"),
            }
        };
        for d in [Device::Auto, Device::Cpu, Device::Webgpu] {
            for p in &probes {
                let got = choose(d, p);
                match (want(d, p), got) {
                    (Ok("gpu"), Ok(Choice::Gpu(name))) => assert_eq!(name, "Adapter (Vulkan)"),
                    (Ok(w), Ok(Choice::Cpu(reason))) => {
                        assert!(
                            w.starts_with("cpu: ") && reason.starts_with(&w[5..]),
                            "{d:?} {p:?}: {reason}"
                        )
                    }
                    (Err(w), Err(e)) => assert!(e.to_string().contains(w), "{d:?} {p:?}: {e}"),
                    (w, g) => panic!("{d:?} {p:?}: want {w:?}, got {g:?}"),
                }
            }
        }
    }

    #[test]
    fn a_gpu_side_failure_falls_back_only_on_auto() {
        let lost = Error::Device("lost".into());
        assert!(after_gpu_failure(Device::Auto, &lost)
            .unwrap()
            .starts_with("the model did not load on the GPU"));
        assert_eq!(after_gpu_failure(Device::Webgpu, &lost), None);
        let bad = Error::Model("truncated".into());
        assert_eq!(after_gpu_failure(Device::Auto, &bad), None);
    }
}
