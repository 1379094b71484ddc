//! The in-memory changes of the checkpoint the request path makes ([`Checkpoint`]'s `set_*` and
//! [`Checkpoint::remove`]): each replaces or edits one claim's record, keeping what must survive
//! a change of state (the pods the claim was prepared for, whether the kubelet holds it). Pure:
//! the caller saves.

use std::collections::BTreeMap;

use super::{Checkpoint, ClaimRecord, MigModeSwitch, PrepareState, RecordedDevice, unix_now};

impl Checkpoint {
    /// Records that prepare of a claim started, replacing any earlier record; `devices` are the
    /// allocated devices, with their instances where already known. Callers check
    /// [`Checkpoint::get`] first so a retried prepare of a completed claim does not downgrade it.
    pub(crate) fn set_started(
        &mut self,
        claim_uid: &str,
        namespace: &str,
        name: &str,
        devices: Vec<RecordedDevice>,
    ) {
        self.upsert(
            claim_uid,
            namespace,
            name,
            PrepareState::PrepareStarted,
            devices,
            BTreeMap::new(),
        );
    }

    /// Records that prepare of a claim completed: its devices (instances filled in) and the CDI
    /// device IDs per device name. Replaces any earlier record, so it also works
    /// when the claim was never recorded as started (state rebuilt after a corrupt file).
    pub fn set_completed(
        &mut self,
        claim_uid: &str,
        namespace: &str,
        name: &str,
        devices: Vec<RecordedDevice>,
        cdi_device_ids: BTreeMap<String, Vec<String>>,
    ) {
        self.upsert(
            claim_uid,
            namespace,
            name,
            PrepareState::PrepareCompleted,
            devices,
            cdi_device_ids,
        );
    }

    fn upsert(
        &mut self,
        claim_uid: &str,
        namespace: &str,
        name: &str,
        state: PrepareState,
        devices: Vec<RecordedDevice>,
        cdi_device_ids: BTreeMap<String, Vec<String>>,
    ) {
        // The pods a claim was prepared for stay known across its states: a container of any of
        // them may use its MIG instances until the kubelet unprepares it. So does whether the kubelet
        // holds it (a repair keeps the guard); only the kubelet's unprepare or the orphan rule
        // ends that ([`Self::set_releasing_for_good`]).
        let previous = self.claims.get(claim_uid);
        let pods = previous.map(|r| r.pods.clone()).unwrap_or_default();
        let handed = previous.is_some_and(ClaimRecord::is_handed);
        let record = ClaimRecord {
            namespace: namespace.to_string(),
            name: name.to_string(),
            state,
            devices,
            cdi_device_ids,
            pods,
            handed_to_kubelet: handed
                && !matches!(
                    state,
                    PrepareState::PrepareCompleted | PrepareState::Repairing
                ),
            updated_at: unix_now(),
        };
        self.claims.insert(claim_uid.to_string(), record);
    }

    /// Sets the pods the claim's record knows (see [`ClaimRecord::pods`]); returns whether that
    /// changed anything. No-op without a record.
    pub(crate) fn set_pods(&mut self, claim_uid: &str, pods: Vec<String>) -> bool {
        match self.claims.get_mut(claim_uid) {
            Some(r) if r.pods != pods => {
                r.pods = pods;
                true
            }
            _ => false,
        }
    }

    /// Records that the claim's `devices` (their instances created) were carved before bind
    /// ([`PrepareState::Carved`]), replacing the started record the carve wrote first.
    pub(crate) fn set_carved(
        &mut self,
        claim_uid: &str,
        namespace: &str,
        name: &str,
        devices: Vec<RecordedDevice>,
    ) {
        self.upsert(
            claim_uid,
            namespace,
            name,
            PrepareState::Carved,
            devices,
            BTreeMap::new(),
        );
    }

    /// Records that the claim's instances in `devices` must still be destroyed
    /// ([`PrepareState::Releasing`]); keeps the claim's namespace and name. A record the
    /// kubelet holds ([`ClaimRecord::is_handed`]) keeps every device it had, so it goes on
    /// guarding all its placements: those in `devices` with the instance left to destroy, the
    /// others without one ([`guarded_devices`]).
    pub fn set_releasing(
        &mut self,
        claim_uid: &str,
        namespace: &str,
        name: &str,
        devices: Vec<RecordedDevice>,
    ) {
        let devices = match self.claims.get(claim_uid) {
            Some(r) if r.is_handed() => guarded_devices(&r.devices, devices),
            _ => devices,
        };
        self.upsert(
            claim_uid,
            namespace,
            name,
            PrepareState::Releasing,
            devices,
            BTreeMap::new(),
        );
    }

    /// Records that the claim's instances in `devices` must be destroyed for good: the kubelet
    /// unprepared the claim, or the orphan rule found no container of its pods left. Unlike
    /// [`Self::set_releasing`] the record stops guarding its placements: it is dropped once its
    /// instances are gone.
    pub(crate) fn set_releasing_for_good(
        &mut self,
        claim_uid: &str,
        namespace: &str,
        name: &str,
        devices: Vec<RecordedDevice>,
    ) {
        self.set_releasing(claim_uid, namespace, name, devices);
        if let Some(r) = self.claims.get_mut(claim_uid) {
            r.handed_to_kubelet = false;
        }
    }

    /// Turns the record of a claim the kubelet holds into a guard without instances
    /// ([`PrepareState::Repairing`]): its devices (every allocated one, so the guard covers all
    /// its placements) without instances, no CDI device IDs.
    pub(crate) fn set_repairing(
        &mut self,
        claim_uid: &str,
        namespace: &str,
        name: &str,
        devices: Vec<RecordedDevice>,
    ) {
        let devices = devices
            .into_iter()
            .map(|d| RecordedDevice {
                instance: None,
                ..d
            })
            .collect();
        self.upsert(
            claim_uid,
            namespace,
            name,
            PrepareState::Repairing,
            devices,
            BTreeMap::new(),
        );
    }

    /// Records that a switch of GPU `gpu_index` (`gpu_uuid`) to MIG mode `mig_enabled` starts
    /// for claim `claim`, replacing any earlier one on that GPU.
    pub(crate) fn set_mig_mode_switch(
        &mut self,
        gpu_index: u32,
        gpu_uuid: &str,
        mig_enabled: bool,
        claim: &str,
    ) {
        let switch = MigModeSwitch {
            gpu_uuid: gpu_uuid.to_string(),
            mig_enabled,
            claim: claim.to_string(),
            started_at: unix_now(),
        };
        self.mig_mode_switches.insert(gpu_index, switch);
    }

    /// Forgets the switch under way on GPU `gpu_index` (it finished or was recovered); returns
    /// it, `None` when there was none.
    pub(crate) fn clear_mig_mode_switch(&mut self, gpu_index: u32) -> Option<MigModeSwitch> {
        self.mig_mode_switches.remove(&gpu_index)
    }

    /// Forgets a claim (after unprepare). Idempotent: returns the removed record, `None` when
    /// there was none.
    pub fn remove(&mut self, claim_uid: &str) -> Option<ClaimRecord> {
        self.claims.remove(claim_uid)
    }
}

/// The devices of a guard being released: each of `guarded` (the record's), taken from `left`
/// where `left` has it (same request and device: the instance still to destroy), else without
/// an instance (destroyed, or never created). What is left of `left` (a device `guarded` lacks,
/// or a second instance of one device: a failed create's leftover GPU instance) is appended,
/// so no instance still to destroy is forgotten.
fn guarded_devices(
    guarded: &[RecordedDevice],
    mut left: Vec<RecordedDevice>,
) -> Vec<RecordedDevice> {
    let mut out = Vec::with_capacity(guarded.len() + left.len());
    for g in guarded {
        match left
            .iter()
            .position(|l| l.request == g.request && l.device == g.device)
        {
            Some(i) => out.push(left.remove(i)),
            None => out.push(RecordedDevice {
                instance: None,
                ..g.clone()
            }),
        }
    }
    out.extend(left);
    out
}
