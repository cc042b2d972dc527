//! Where one rank computes and keeps its training state: chosen once, when the trainer starts,
//! from the backend (does it expose device buffers?) and `strategy.offload`.

use burn::tensor::backend::Backend;

use crate::params::{DeviceFlat, DeviceTensor, RawFn};

/// One rank's placement. Every step, evaluation and log line asks it rather than testing
/// the backend or the config again.
pub enum Placement<I: Backend> {
    /// The CPU: the compute reads the host's parameters; nothing crosses a host boundary.
    Host,
    /// A device computes, the state stays on the host (`strategy.offload = "cpu"`, torch's CPU
    /// offload): parameters are uploaded for each use and gradients read back, each transfer
    /// counted (`params::transfers`).
    Offload,
    /// A device computes and keeps the state: `proto` is a device buffer that device copies
    /// and gathers are made like; `raw` exposes the backend's tensors as device buffers (with
    /// their addresses where a device collective can use them), so gradients stay there too.
    Device {
        proto: Box<dyn DeviceTensor>,
        raw: RawFn<I>,
    },
}

impl<I: Backend> Placement<I> {
    /// The placement of a backend that exposes device buffers through `raw` (`None`: the CPU)
    /// under `strategy.offload`.
    pub fn choose(
        raw: Option<RawFn<I>>,
        offload: crate::config::Offload,
        device: &I::Device,
    ) -> Self {
        match raw {
            None => Placement::Host,
            Some(_) if offload != crate::config::Offload::None => Placement::Offload,
            Some(raw) => Placement::Device {
                proto: Box::new(DeviceFlat::<I>::new(
                    crate::params::master_zeros(1, device),
                    raw,
                )),
                raw,
            },
        }
    }

    /// A device computes: host transfers are counted and reported.
    pub fn on_device(&self) -> bool {
        !matches!(self, Placement::Host)
    }

    /// The device buffer that device copies are made like, when the state lives there.
    pub fn proto(&self) -> Option<&dyn DeviceTensor> {
        match self {
            Placement::Device { proto, .. } => Some(proto.as_ref()),
            _ => None,
        }
    }

    /// How the backend's tensors become device buffers, when the state lives there.
    pub fn raw_fn(&self) -> Option<RawFn<I>> {
        match self {
            Placement::Device { raw, .. } => Some(*raw),
            _ => None,
        }
    }
}
