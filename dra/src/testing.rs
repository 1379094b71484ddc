//! Test doubles for a driver's tests (feature `testing`; this crate's own tests use them too):
//!
//! - [`api_server`]: a mocked API server that checks a kube client's exact requests;
//! - [`FakeSliceApi`]: a [`PublishApi`] that answers like kube-apiserver's ResourceSlice
//!   registry, each of the four feature gates the publisher acts on on or off;
//! - [`Recorded`]: [`NodeEvents`] and a [`GateGauge`] that record what the publisher told.
//!
//! The real API server is exercised by the repository's e2e tests
//! (`e2e/tests/plugin_publisher.rs`).

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device, ResourceSlice, ResourceSliceSpec};
use kube::api::Preconditions;
use kube::core::Status;
use tokio::time::Instant;

use crate::resourceslice::gates::without_binding_conditions;
use crate::resourceslice::{GateGauge, NodeEvents, Notice, PublishApi};

pub mod api_server;

/// What [`FakeSliceApi`] stores, which gates are on, and what it saw.
#[derive(Debug, Default)]
pub struct FakeState {
    /// The stored slices by name.
    pub slices: BTreeMap<String, ResourceSlice>,
    /// The last resourceVersion given.
    pub next_rv: u64,
    /// `DRAPartitionableDevices` on.
    pub counters_gate: bool,
    /// `DRADeviceTaints` on.
    pub taints_gate: bool,
    /// `DRAConsumableCapacity` on.
    pub shares_gate: bool,
    /// `DRADeviceBindingConditions` on.
    pub binding_gate: bool,
    /// Dry runs fail (an admission webhook without dry-run support).
    pub refuse_dry_run: bool,
    /// Dry-run creates answered, with when.
    pub dry_runs: Vec<Instant>,
    /// Devices of every slice a real (not dry-run) create or update sent.
    pub devices_written: Vec<usize>,
    /// Every slice the server stored, as stored (to check nothing was offered without counters).
    pub stored_history: Vec<ResourceSliceSpec>,
}

/// A [`PublishApi`] that answers like kube-apiserver's ResourceSlice registry: a create, dry run
/// or not, drops the fields of a gate that is off; an update keeps them only when the stored
/// slice already used them (kubernetes `pkg/registry/resource/resourceslice/strategy.go`,
/// `dropDisabledFields`). The Node has UID `node-uid`.
#[derive(Debug, Default)]
pub struct FakeSliceApi(Mutex<FakeState>);

impl FakeSliceApi {
    /// A registry with `DRAPartitionableDevices` (`counters_gate`) and `DRADeviceTaints`
    /// (`taints_gate`) on or off, the other two gates off.
    pub fn new(counters_gate: bool, taints_gate: bool) -> Self {
        Self(Mutex::new(FakeState {
            counters_gate,
            taints_gate,
            ..Default::default()
        }))
    }

    /// The state, to read or to change (turn a gate on).
    pub fn state(&self) -> MutexGuard<'_, FakeState> {
        self.0.lock().unwrap()
    }

    /// The stored slices, by name.
    pub fn stored(&self) -> Vec<ResourceSlice> {
        self.state().slices.values().cloned().collect()
    }
}

fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
    kube::Error::Api(Status::failure(message, reason).with_code(code).boxed())
}

/// Whether `spec` carries shared counters (a set, or a device consuming one).
pub fn uses_counters(spec: &ResourceSliceSpec) -> bool {
    spec.shared_counters.is_some()
        || spec
            .devices
            .iter()
            .flatten()
            .any(|d| d.consumes_counters.is_some())
}

fn uses_taints(spec: &ResourceSliceSpec) -> bool {
    spec.devices.iter().flatten().any(|d| d.taints.is_some())
}

fn uses_shares(spec: &ResourceSliceSpec) -> bool {
    spec.devices
        .iter()
        .flatten()
        .any(|d| d.allow_multiple_allocations.is_some())
}

fn uses_binding(spec: &ResourceSliceSpec) -> bool {
    let bound =
        |d: &Device| d.binding_conditions.is_some() || d.binding_failure_conditions.is_some();
    spec.devices.iter().flatten().any(bound)
}

/// `dropDisabledFields(new, old)` for the gates the publisher acts on.
fn drop_disabled(state: &FakeState, new: &mut ResourceSliceSpec, old: Option<&ResourceSliceSpec>) {
    if !state.counters_gate && !old.is_some_and(uses_counters) {
        new.shared_counters = None;
        for d in new.devices.iter_mut().flatten() {
            d.consumes_counters = None;
        }
    }
    if !state.taints_gate && !old.is_some_and(uses_taints) {
        for d in new.devices.iter_mut().flatten() {
            d.taints = None;
        }
    }
    if !state.shares_gate && !old.is_some_and(uses_shares) {
        for d in new.devices.iter_mut().flatten() {
            d.allow_multiple_allocations = None;
            for c in d.capacity.iter_mut().flat_map(|c| c.values_mut()) {
                c.request_policy = None;
            }
        }
    }
    if !state.binding_gate && !old.is_some_and(uses_binding) {
        new.devices
            .iter_mut()
            .flatten()
            .for_each(without_binding_conditions);
    }
}

#[tonic::async_trait]
impl PublishApi for FakeSliceApi {
    async fn list(&self, _field_selector: &str) -> Result<Vec<ResourceSlice>, kube::Error> {
        Ok(self.stored())
    }

    async fn node(&self, name: &str) -> Result<Node, kube::Error> {
        Ok(serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": "node-uid"}
        }))
        .unwrap())
    }

    async fn create(
        &self,
        slice: &ResourceSlice,
        dry_run: bool,
    ) -> Result<ResourceSlice, kube::Error> {
        let mut s = self.state();
        if dry_run {
            if s.refuse_dry_run {
                return Err(api_error(
                    400,
                    "BadRequest",
                    "webhook does not support dry run",
                ));
            }
            s.dry_runs.push(Instant::now());
        }
        let mut slice = slice.clone();
        if slice.metadata.name.is_none() {
            let prefix = slice.metadata.generate_name.clone().unwrap_or_default();
            slice.metadata.name = Some(format!("{prefix}x7k2p"));
        }
        let name = slice.metadata.name.clone().unwrap();
        if s.slices.contains_key(&name) {
            return Err(api_error(409, "AlreadyExists", "already exists"));
        }
        drop_disabled(&s, &mut slice.spec, None);
        s.next_rv += 1;
        slice.metadata.resource_version = Some(s.next_rv.to_string());
        slice.metadata.uid = Some(format!("uid-{name}"));
        if !dry_run {
            s.devices_written
                .push(slice.spec.devices.as_ref().map_or(0, Vec::len));
            s.stored_history.push(slice.spec.clone());
            s.slices.insert(name, slice.clone());
        }
        Ok(slice)
    }

    async fn replace(&self, slice: &ResourceSlice) -> Result<ResourceSlice, kube::Error> {
        let mut s = self.state();
        let name = slice.metadata.name.clone().unwrap_or_default();
        let Some(old) = s.slices.get(&name).cloned() else {
            return Err(api_error(404, "NotFound", "not found"));
        };
        if slice.metadata.resource_version != old.metadata.resource_version {
            return Err(api_error(409, "Conflict", "the object has been modified"));
        }
        let mut slice = slice.clone();
        drop_disabled(&s, &mut slice.spec, Some(&old.spec));
        s.next_rv += 1;
        slice.metadata.resource_version = Some(s.next_rv.to_string());
        s.devices_written
            .push(slice.spec.devices.as_ref().map_or(0, Vec::len));
        s.stored_history.push(slice.spec.clone());
        s.slices.insert(name, slice.clone());
        Ok(slice)
    }

    async fn delete(&self, name: &str, preconditions: Preconditions) -> Result<(), kube::Error> {
        let mut s = self.state();
        let Some(old) = s.slices.get(name) else {
            return Err(api_error(404, "NotFound", "not found"));
        };
        if preconditions.uid.is_some() && preconditions.uid != old.metadata.uid {
            return Err(api_error(409, "Conflict", "uid precondition"));
        }
        s.slices.remove(name);
        Ok(())
    }
}

/// [`NodeEvents`] and [`GateGauge`] that record: the events as `(warning, reason, note)` (notes
/// as [`Notice::note`] words them), the gauge's last value per gate.
#[derive(Debug, Default)]
pub struct Recorded {
    events: Mutex<Vec<(bool, String, String)>>,
    gates: Mutex<BTreeMap<&'static str, bool>>,
}

impl Recorded {
    /// The events posted, in order: `(warning, reason, note)`.
    pub fn events(&self) -> Vec<(bool, String, String)> {
        self.events.lock().unwrap().clone()
    }

    /// The gauge of `gate` as last set; `None` before the first publish.
    pub fn gate_off(&self, gate: &str) -> Option<bool> {
        self.gates.lock().unwrap().get(gate).copied()
    }
}

#[tonic::async_trait]
impl NodeEvents for Recorded {
    async fn post(&self, notice: &Notice, note: String) {
        let event = (notice.is_warning(), notice.reason().to_string(), note);
        self.events.lock().unwrap().push(event);
    }
}

impl GateGauge for Recorded {
    fn set_gate_off(&self, gate: &'static str, off: bool) {
        self.gates.lock().unwrap().insert(gate, off);
    }
}
