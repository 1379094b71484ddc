//! The compute time slice of the emulated GPUs (docs/design.md §7, "Time-slicing"): NVIDIA's
//! level (0, the driver's default, to 3) that `nvidia-smi compute-policy --set-timeslice` sets
//! on a real GPU, kept per GPU in the state file (`timeSlice`, written only when not 0) so that
//! tests read what the plugin set. Setting the level a GPU has is a no-op; a change is written
//! to the state file before it is kept in memory.

use super::state::{gpu_state, gpu_state_mut};
use super::{EmuGpu, EmulatedBackend, lock};
use crate::gpu::{BackendError, Target};

impl EmulatedBackend {
    /// Sets GPU `gpu`'s time slice to `level` once no injected fault answered.
    pub(super) fn store_time_slice(&self, gpu: &EmuGpu, level: u32) -> Result<(), BackendError> {
        let mut state = lock(&self.state);
        if gpu_state(&state, gpu.index).time_slice == level {
            return Ok(());
        }
        let mut next = (*state).clone();
        gpu_state_mut(&mut next, gpu.index).time_slice = level;
        self.persist(&next, &Target::gpu(gpu.index))?;
        *state = next;
        tracing::info!(gpu = gpu.index, level, "emulated GPU: time slice set");
        Ok(())
    }

    /// GPU `gpu`'s time slice level now (what the model test's M5 reads).
    #[cfg(test)]
    pub(crate) fn time_slice_level(&self, gpu: u32) -> u32 {
        gpu_state(&lock(&self.state), gpu).time_slice
    }
}
