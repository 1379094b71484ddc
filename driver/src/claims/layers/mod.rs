//! Layers any kind of device can wear (issue 42): MPS (docs/design.md §7, "MPS on a slice"),
//! time-slicing (§7, "Time-slicing") and kernel-enforced memory limits (§7, "Memory slices of a
//! whole GPU"), a service run on what a device holds, for the claim's
//! containers. A layer is put on
//! once a prepare's devices hold what their kinds acquired and before the CDI spec is written,
//! adds its own CDI edits, is taken off before a release destroys anything, and is brought back
//! at start-up. The transaction ([`super::preparer`]) asks every layer through the registry
//! ([`Layers`]) and never names one.
//!
//! Adding a layer: a folder `layers/<layer>/` whose type implements [`Layer`], one line in
//! [`Layers::standard`] and, when it reads the claim's configs, one in [`plan`]; and its tests.
//! A layer never imports another, and the rest of the crate reaches it only through this module
//! (`tools/modgraph.py check`, the isolated rule).

use std::collections::BTreeMap;
use std::sync::Arc;

use das_api::device_config::MigDeviceConfig;

use crate::blocking::BlockingCalls;
use crate::claims::PrepareError;
use crate::claims::cdi::SpecDevice;
use crate::claims::checkpoint::{CheckpointStore, RecordedDevice};
use crate::claims::handler::ClaimRef;
use crate::claims::kinds::{NodeDevices, Planned};
use crate::claims::memory_limits::MemoryLimits;
use crate::gpu::{GpuInfo, TimeSlicer};
use crate::mps::MpsDaemons;

pub(crate) mod memory_limits;
pub(crate) mod mps;
pub(crate) mod time_slicing;

/// One layer: what it adds to the devices that wear it, at each step of the transaction.
#[tonic::async_trait]
pub(crate) trait Layer: Send + Sync + 'static {
    /// Whether recorded device `d` wears this layer.
    fn worn_by(&self, d: &RecordedDevice) -> bool;

    /// Checks a claim's planned devices against this node before anything is created or
    /// recorded.
    ///
    /// # Errors
    /// Why the claim cannot wear the layer here.
    fn check(&self, planned: &[Planned], node: &NodeDevices) -> Result<(), PrepareError>;

    /// Puts the layer on `devices` of claim `claim` (what they hold exists; one already on is
    /// kept).
    ///
    /// # Errors
    /// Why it could not be put on the first device; the caller rolls the prepare back (which
    /// takes it off the others).
    async fn put_on(
        &self,
        claim: &ClaimRef,
        devices: &[RecordedDevice],
    ) -> Result<(), PrepareError>;

    /// Takes the layer off a released claim's devices: `leaving`, whose instances are destroyed
    /// next (the layer goes first: what runs there keeps them in use), and `kept`, whose
    /// instances other claims keep (only this claim's part of it goes).
    async fn take_off(&self, claim: &ClaimRef, leaving: &[RecordedDevice], kept: &[RecordedDevice]);

    /// Adds the layer's edits to the CDI devices (`specs`, keyed by device name) of claim
    /// `claim_uid`'s `devices` that wear it.
    fn cdi_edits(&self, claim_uid: &str, devices: &[RecordedDevice], specs: &mut [SpecDevice]);

    /// Start-up, and a GPU that answers again: brings the layer back on `kept` (claims whose
    /// instances exist), all at once.
    async fn restore(&self, kept: &[(ClaimRef, Vec<RecordedDevice>)]);

    /// Start-up, once the records are settled: takes off what no record of `records` wears.
    async fn remove_unrecorded(&self, records: &CheckpointStore);
}

/// Each layer's reading of a claim's configs (`configs`, by request name) into its planned
/// devices (pure): the registration lines of the layers that plan.
///
/// # Errors
/// [`PrepareError::InvalidConfig`]: a config a device cannot wear.
pub fn plan(
    planned: Vec<Planned>,
    configs: &BTreeMap<String, MigDeviceConfig>,
) -> Result<Vec<Planned>, PrepareError> {
    let planned = mps::plan::with_mps(planned, configs)?;
    time_slicing::plan::with_time_slice(planned, configs)
}

/// Proof that start-up has settled the layers: brought back on the kept claims and taken off
/// whatever no record wears. Made only by [`Layers::restore_at_startup`] (the field is private
/// to this module); start-up's destroy of orphaned instances requires it, because what a layer
/// runs on an instance keeps it in use (an unrecorded MPS daemon's server would make the
/// destroy fail).
#[derive(Debug)]
pub(crate) struct Restored(());

/// The layers this plugin runs, in the order they are put on (taken off in the same order).
pub(crate) struct Layers {
    all: Vec<Box<dyn Layer>>,
}

impl Layers {
    /// The standard layers, over their services: the registration lines.
    pub fn standard(
        mps: Arc<MpsDaemons>,
        slicer: TimeSlicer,
        blocking: BlockingCalls,
        memory: Option<MemoryLimits>,
        inventory: &[GpuInfo],
    ) -> Self {
        Layers {
            all: vec![
                Box::new(mps::MpsLayer::new(mps)),
                Box::new(time_slicing::TimeSlicingLayer::new(slicer, blocking)),
                Box::new(memory_limits::MemoryLimitLayer::new(memory, inventory)),
            ],
        }
    }

    /// Whether any of `devices` wears a layer.
    pub(crate) fn worn(&self, devices: &[RecordedDevice]) -> bool {
        devices
            .iter()
            .any(|d| self.all.iter().any(|l| l.worn_by(d)))
    }

    /// Every layer's [`Layer::check`].
    ///
    /// # Errors
    /// The first layer's refusal.
    pub fn check(&self, planned: &[Planned], node: &NodeDevices) -> Result<(), PrepareError> {
        self.all.iter().try_for_each(|l| l.check(planned, node))
    }

    /// Every layer's [`Layer::put_on`].
    ///
    /// # Errors
    /// The first failure.
    pub(crate) async fn put_on(
        &self,
        claim: &ClaimRef,
        devices: &[RecordedDevice],
    ) -> Result<(), PrepareError> {
        for l in &self.all {
            l.put_on(claim, devices).await?;
        }
        Ok(())
    }

    /// Every layer's [`Layer::take_off`].
    pub(crate) async fn take_off(
        &self,
        claim: &ClaimRef,
        leaving: &[RecordedDevice],
        kept: &[RecordedDevice],
    ) {
        for l in &self.all {
            l.take_off(claim, leaving, kept).await;
        }
    }

    /// Every layer's [`Layer::cdi_edits`].
    pub(crate) fn cdi_edits(
        &self,
        claim_uid: &str,
        devices: &[RecordedDevice],
        specs: &mut [SpecDevice],
    ) {
        for l in &self.all {
            l.cdi_edits(claim_uid, devices, specs);
        }
    }

    /// Every layer's [`Layer::restore`].
    pub(crate) async fn restore(&self, kept: &[(ClaimRef, Vec<RecordedDevice>)]) {
        for l in &self.all {
            l.restore(kept).await;
        }
    }

    /// Start-up, once the records are settled: every layer's [`Layer::restore`] on `kept` (the
    /// claims whose instances exist), then its [`Layer::remove_unrecorded`] against `records`;
    /// the [`Restored`] proof that instances may now be destroyed.
    pub(crate) async fn restore_at_startup(
        &self,
        kept: &[(ClaimRef, Vec<RecordedDevice>)],
        records: &CheckpointStore,
    ) -> Restored {
        self.restore(kept).await;
        for l in &self.all {
            l.remove_unrecorded(records).await;
        }
        Restored(())
    }
}
