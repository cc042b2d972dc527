//! Bytes moved between the host and a device backend's memory, counted on the thread that moves
//! them (a rank's worker thread: one per device). The engine and the strategies record every
//! copy they make of parameters, optimizer state and gradients; `summary.json` reports each
//! rank's totals, so "the parameters stay on the device" is a count, not a claim.

use std::cell::Cell;

use serde::Serialize;

/// What crossed the host boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moved {
    /// Parameters written to the device (a forward's host parameters, a device copy made).
    ParamsToDevice,
    /// Parameters read back (evaluation, checkpoints, the end of training).
    ParamsToHost,
    /// Optimizer state written to the device.
    StateToDevice,
    /// Optimizer state read back (checkpoints, the end).
    StateToHost,
    /// Gradients read to the host (a host optimizer, or a host-staged collective).
    GradsToHost,
    /// Gradients written back after a host-staged collective.
    GradsToDevice,
}

/// Bytes per kind of copy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Transfers {
    pub params_to_device: u64,
    pub params_to_host: u64,
    pub state_to_device: u64,
    pub state_to_host: u64,
    pub grads_to_host: u64,
    pub grads_to_device: u64,
}

impl Transfers {
    fn slot(&mut self, what: Moved) -> &mut u64 {
        match what {
            Moved::ParamsToDevice => &mut self.params_to_device,
            Moved::ParamsToHost => &mut self.params_to_host,
            Moved::StateToDevice => &mut self.state_to_device,
            Moved::StateToHost => &mut self.state_to_host,
            Moved::GradsToHost => &mut self.grads_to_host,
            Moved::GradsToDevice => &mut self.grads_to_device,
        }
    }
    /// What was moved since `earlier` (a snapshot of the same thread's counts).
    pub fn since(&self, earlier: &Transfers) -> Transfers {
        Transfers {
            params_to_device: self.params_to_device - earlier.params_to_device,
            params_to_host: self.params_to_host - earlier.params_to_host,
            state_to_device: self.state_to_device - earlier.state_to_device,
            state_to_host: self.state_to_host - earlier.state_to_host,
            grads_to_host: self.grads_to_host - earlier.grads_to_host,
            grads_to_device: self.grads_to_device - earlier.grads_to_device,
        }
    }
    /// Parameters and optimizer state, either way.
    pub fn model_state(&self) -> u64 {
        self.params_to_device + self.params_to_host + self.state_to_device + self.state_to_host
    }
}

thread_local! {
    static COUNTS: Cell<Transfers> = Cell::new(Transfers::default());
}

/// Counts `elems` f32 values moved as `what` by this thread.
pub fn record(what: Moved, elems: usize) {
    COUNTS.with(|c| {
        let mut t = c.get();
        *t.slot(what) += (elems * 4) as u64;
        c.set(t);
    });
}

/// This thread's counts so far.
pub fn counted() -> Transfers {
    COUNTS.with(|c| c.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_per_thread_and_in_bytes() {
        let before = counted();
        record(Moved::ParamsToDevice, 10);
        record(Moved::GradsToHost, 3);
        std::thread::spawn(|| record(Moved::ParamsToDevice, 1000))
            .join()
            .unwrap();
        let d = counted().since(&before);
        assert_eq!(d.params_to_device, 40);
        assert_eq!(d.grads_to_host, 12);
        assert_eq!(d.model_state(), 40);
    }
}
