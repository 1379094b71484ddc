//! Time-slicing as a layer (docs/design.md §7, "Time-slicing"): a whole GPU whose config says
//! `sharing: {strategy: TimeSlicing, timeSlicing: {interval: …}}` is prepared as a whole GPU,
//! and its GPU's compute time slice is then set to the interval, for the claim's containers (of
//! every pod sharing the claim) to take turns with. The claim's configs give each device its
//! interval ([`plan`]); a prepare checks that this node can set one before anything is recorded
//! ([`TimeSlicingLayer::check`]); the interval is set once the GPU is held and before the CDI
//! spec is written, and goes back to the driver's default when the claim is released. Its
//! record carries the interval (checkpoint version 10), so start-up sets it again.
//! [`crate::gpu::TimeSlicer`] sets it (NVIDIA's `nvidia-smi compute-policy`, or the emulated
//! backend).

use das_api::device_config::TimeSliceInterval;
use tracing::Instrument;

use crate::blocking::BlockingCalls;
use crate::claims::PrepareError;
use crate::claims::cdi::SpecDevice;
use crate::claims::checkpoint::{CheckpointStore, RecordedDevice};
use crate::claims::handler::ClaimRef;
use crate::claims::kinds::{NodeDevices, Planned};
use crate::claims::layers::Layer;
use crate::claims::spans::claim_span;
use crate::gpu::time_slice::NO_NVIDIA_SMI;
use crate::gpu::{BackendError, TimeSlicer};

pub(crate) mod plan;

/// The time-slicing layer: who sets a GPU's time slice, and where that blocking call runs.
pub(crate) struct TimeSlicingLayer {
    slicer: TimeSlicer,
    blocking: BlockingCalls,
}

impl TimeSlicingLayer {
    /// The layer over `slicer`, its calls run by `blocking`.
    pub fn new(slicer: TimeSlicer, blocking: BlockingCalls) -> Self {
        Self { slicer, blocking }
    }

    /// Sets `d`'s GPU to `interval`.
    async fn set(&self, d: &RecordedDevice, interval: TimeSliceInterval) -> Result<(), String> {
        let (slicer, gpu, uuid) = (self.slicer.clone(), d.gpu_index, d.gpu_uuid.clone());
        match self
            .blocking
            .run(move || slicer.set(gpu, &uuid, interval))
            .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Puts `d`'s GPU back to the driver's default time slice; a failure is logged (the GPU is
    /// released anyway: the next claim's config sets its own, and a reset clears it).
    async fn reset(&self, d: &RecordedDevice) {
        let (slicer, gpu, uuid) = (self.slicer.clone(), d.gpu_index, d.gpu_uuid.clone());
        let result = self
            .blocking
            .run(move || slicer.set(gpu, &uuid, TimeSliceInterval::Default))
            .await;
        match result {
            Ok(Ok(())) => {
                tracing::info!(device = %d.device, gpu = d.gpu_index, "time slice back to the default")
            }
            // As NVIDIA's driver: a GPU that refuses only gets a log line.
            Ok(Err(e @ BackendError::NotSupported { .. })) => {
                tracing::info!(device = %d.device, error = %e, "time slice not reset")
            }
            Ok(Err(e)) => {
                tracing::warn!(device = %d.device, error = %e, "time slice not reset")
            }
            Err(e) => {
                tracing::warn!(device = %d.device, error = %e, "time slice not reset")
            }
        }
    }
}

#[tonic::async_trait]
impl Layer for TimeSlicingLayer {
    fn worn_by(&self, d: &RecordedDevice) -> bool {
        d.time_slice.is_some()
    }

    /// This node can set a time slice if a device asks for one.
    ///
    /// # Errors
    /// [`PrepareError::TimeSlice`]: no `nvidia-smi` ([`NO_NVIDIA_SMI`]).
    fn check(&self, planned: &[Planned], _node: &NodeDevices) -> Result<(), PrepareError> {
        match planned.iter().find(|p| p.time_slice.is_some()) {
            Some(p) if !self.slicer.available() => Err(PrepareError::TimeSlice {
                device: p.device.clone(),
                gpu: p.at.gpu_index,
                reason: NO_NVIDIA_SMI.to_string(),
            }),
            _ => Ok(()),
        }
    }

    async fn put_on(
        &self,
        _claim: &ClaimRef,
        devices: &[RecordedDevice],
    ) -> Result<(), PrepareError> {
        for d in devices {
            let Some(interval) = d.time_slice else {
                continue;
            };
            self.set(d, interval)
                .await
                .map_err(|reason| PrepareError::TimeSlice {
                    device: d.device.clone(),
                    gpu: d.gpu_index,
                    reason,
                })?;
            tracing::info!(device = %d.device, gpu = d.gpu_index, interval = ?interval, "time slice set");
        }
        Ok(())
    }

    /// The released whole GPUs go back to the default (a whole GPU is never kept by another
    /// claim, so `kept` has none of this layer's).
    async fn take_off(
        &self,
        _claim: &ClaimRef,
        leaving: &[RecordedDevice],
        _kept: &[RecordedDevice],
    ) {
        for d in leaving.iter().filter(|d| self.worn_by(d)) {
            self.reset(d).await;
        }
    }

    fn cdi_edits(&self, _claim_uid: &str, _devices: &[RecordedDevice], _specs: &mut [SpecDevice]) {
        // The time slice is the GPU's, not the container's: nothing to add.
    }

    /// Sets each kept record's time slice again: the GPU keeps it across a plugin restart, but
    /// not across a GPU reset.
    async fn restore(&self, kept: &[(ClaimRef, Vec<RecordedDevice>)]) {
        for (claim, devices) in kept {
            // In the span of the claim it is set again for (start-up settles many at once).
            let again = async {
                for d in devices {
                    let Some(interval) = d.time_slice else {
                        continue;
                    };
                    if let Err(error) = self.set(d, interval).await {
                        tracing::warn!(device = %d.device, %error, "time slice not set again");
                    }
                }
            };
            again
                .instrument(claim_span!("restore_time_slice", claim))
                .await;
        }
    }

    /// Nothing: a GPU whose record went (a crash between the reset and the record's drop) keeps
    /// at most a time slice, which changes only how its contexts take turns; the next
    /// time-sliced claim sets its own.
    async fn remove_unrecorded(&self, _records: &CheckpointStore) {}
}
