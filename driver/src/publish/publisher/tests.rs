//! Unit tests of [`super`] (`publisher.rs`).

use super::*;

#[test]
fn complete_specs_sets_pool_driver_and_node() {
    let specs = complete_specs(
        "n0",
        vec![
            ResourceSliceSpec::default(),
            ResourceSliceSpec {
                driver: "other".into(),
                node_name: Some("elsewhere".into()),
                ..Default::default()
            },
        ],
    )
    .unwrap();
    for s in &specs {
        assert_eq!(s.driver, DRIVER_NAME);
        assert_eq!(s.node_name.as_deref(), Some("n0"));
        assert_eq!(
            (
                s.pool.name.as_str(),
                s.pool.generation,
                s.pool.resource_slice_count
            ),
            ("n0", 0, 2)
        );
    }
}

#[test]
fn empty_lists_are_unset() {
    let spec = ResourceSliceSpec {
        devices: Some(vec![]),
        shared_counters: Some(vec![]),
        ..Default::default()
    };
    let specs = complete_specs("n0", vec![spec]).unwrap();
    assert!(specs[0].devices.is_none() && specs[0].shared_counters.is_none());
}

#[test]
fn an_empty_pool_is_one_empty_slice() {
    let specs = complete_specs("n0", vec![]).unwrap();
    assert_eq!(specs.len(), 1);
    assert_eq!(specs[0].pool.resource_slice_count, 1);
    assert!(specs[0].devices.is_none() && specs[0].shared_counters.is_none());
}

#[test]
fn node_selecting_specs_are_refused_with_their_index() {
    let specs = vec![
        ResourceSliceSpec::default(),
        ResourceSliceSpec {
            per_device_node_selection: Some(true),
            ..Default::default()
        },
    ];
    let err = complete_specs("n0", specs).unwrap_err();
    assert!(matches!(
        err,
        PublishError::NotNodeLocal {
            index: 1,
            field: "perDeviceNodeSelection",
            ..
        }
    ));
    assert!(err.to_string().contains("#1 of pool n0"), "{err}");
}

// ---- The publisher against a fake API server's answers (no silent overlap) ----
//
// `FakeApi` answers like kube-apiserver's ResourceSlice registry: a create, dry run or not,
// drops the fields of a gate that is off; an update keeps them only when the stored slice
// already used them (kubernetes `pkg/registry/resource/resourceslice/strategy.go`,
// `dropDisabledFields`). The real server is exercised by e2e/tests/plugin_publisher.rs.

use std::sync::Mutex;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device, DeviceTaint};
use kube::api::Preconditions;
use kube::core::Status;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::events::EventSink;
use crate::gpu::GpuInfo;
use crate::publish::resource_slices::{ResourceSliceLayout, desired_resource_slices};

#[derive(Default)]
struct FakeState {
    slices: BTreeMap<String, ResourceSlice>,
    next_rv: u64,
    /// `DRAPartitionableDevices` on.
    counters_gate: bool,
    /// `DRADeviceTaints` on.
    taints_gate: bool,
    /// `DRAConsumableCapacity` on.
    shares_gate: bool,
    /// `DRADeviceBindingConditions` on.
    binding_gate: bool,
    /// Dry runs fail (an admission webhook without dry-run support).
    refuse_dry_run: bool,
    /// Dry-run creates answered, with when.
    dry_runs: Vec<Instant>,
    /// Devices of every slice a real (not dry-run) create or update sent.
    devices_written: Vec<usize>,
    /// Every slice the server stored, as stored (to check nothing was offered without counters).
    stored_history: Vec<ResourceSliceSpec>,
    /// Node events: (warning, reason, note).
    events: Vec<(bool, String, String)>,
}

struct FakeApi(Mutex<FakeState>);

impl FakeApi {
    fn new(counters_gate: bool, taints_gate: bool) -> Arc<Self> {
        Arc::new(Self(Mutex::new(FakeState {
            counters_gate,
            taints_gate,
            ..Default::default()
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.0.lock().unwrap()
    }

    fn stored(&self) -> Vec<ResourceSlice> {
        self.state().slices.values().cloned().collect()
    }

    fn events(&self) -> Vec<(bool, String, String)> {
        self.state().events.clone()
    }
}

fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
    kube::Error::Api(Status::failure(message, reason).with_code(code).boxed())
}

fn uses_counters(spec: &ResourceSliceSpec) -> bool {
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

/// `dropDisabledFields(new, old)` for the gates DAS acts on.
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
            .for_each(crate::publish::binding::without_binding_conditions);
    }
}

fn uses_binding(spec: &ResourceSliceSpec) -> bool {
    let bound =
        |d: &Device| d.binding_conditions.is_some() || d.binding_failure_conditions.is_some();
    spec.devices.iter().flatten().any(bound)
}

#[tonic::async_trait]
impl PublishApi for FakeApi {
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

#[tonic::async_trait]
impl EventSink for FakeApi {
    async fn event(&self, about: &EventTarget, kind: EventKind, reason: &str, note: String) {
        assert_eq!(
            about,
            &EventTarget::Node,
            "the publisher posts about the Node only"
        );
        self.state()
            .events
            .push((kind == EventKind::Warning, reason.to_string(), note));
    }
}

/// The desired specs of one A100-40GB on `n0` in `layout`, with `taint` on its first device.
fn desired(layout: ResourceSliceLayout, taint: bool) -> Vec<ResourceSliceSpec> {
    let gpu = GpuInfo::for_tests(0, "A100-SXM4-40GB");
    let mut specs: Vec<ResourceSliceSpec> = desired_resource_slices("n0", &[gpu], layout)
        .unwrap()
        .into_iter()
        .map(|d| d.slice.spec)
        .collect();
    if taint {
        let device = specs
            .iter_mut()
            .flat_map(|s| s.devices.iter_mut().flatten())
            .next()
            .unwrap();
        device.taints = Some(vec![DeviceTaint {
            key: "mig.das.com/unhealthy".into(),
            value: Some("xid-79".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        }]);
    }
    specs
}

const LAYOUTS: [ResourceSliceLayout; 2] = [
    ResourceSliceLayout::CountersWithDevices,
    ResourceSliceLayout::SeparateCounterSlices,
];

fn publisher(api: &Arc<FakeApi>, metrics: &Arc<Metrics>) -> Publisher {
    Publisher::with_api(api.clone(), "n0", None)
        .with_metrics(metrics.clone())
        .with_probe_retry(Duration::from_secs(10), Duration::from_secs(40))
}

fn gauge(metrics: &Metrics, gate: &str) -> Option<String> {
    let want = format!("das_kubelet_plugin_apiserver_feature_gate_off{{gate=\"{gate}\"}} ");
    metrics
        .probe
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(&want).map(str::to_string))
}

/// The stored pool is one slice without devices or counters.
fn assert_withdrawn(api: &FakeApi) {
    let stored = api.stored();
    assert_eq!(stored.len(), 1, "{stored:?}");
    let spec = &stored[0].spec;
    assert!(
        spec.devices.is_none() && spec.shared_counters.is_none(),
        "{spec:?}"
    );
    assert_eq!(spec.pool.resource_slice_count, 1);
}

/// The stored pool is the desired one, counters included.
fn assert_full(api: &FakeApi, want: &[ResourceSliceSpec]) {
    let stored = api.stored();
    assert_eq!(stored.len(), want.len());
    let devices: usize = stored
        .iter()
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum();
    let want_devices: usize = want
        .iter()
        .map(|s| s.devices.as_ref().map_or(0, Vec::len))
        .sum();
    assert!(devices > 0 && devices == want_devices);
    assert!(stored.iter().all(|s| uses_counters(&s.spec)));
}

#[tokio::test(start_paused = true)]
async fn with_the_gate_off_no_device_is_ever_offered_and_the_node_gets_a_warning() {
    for layout in LAYOUTS {
        let api = FakeApi::new(false, true);
        let metrics = Arc::new(Metrics::new());
        let mut p = publisher(&api, &metrics);
        let stats = p.publish(desired(layout, false)).await.unwrap();
        assert!(stats.withdrawn && p.withdrawn(), "{layout:?}: {stats:?}");
        assert_withdrawn(&api);
        let s = api.state();
        assert_eq!(
            s.dry_runs.len(),
            1,
            "{layout:?}: probed once, before writing"
        );
        assert_eq!(
            s.devices_written,
            vec![0],
            "{layout:?}: only the empty slice was written"
        );
        drop(s);
        let events = api.events();
        assert_eq!(events.len(), 1, "{events:?}");
        let (warning, reason, note) = &events[0];
        assert!(*warning && reason == "SharedCountersDropped");
        assert!(
            note.contains("DRAPartitionableDevices")
                && note.contains("kube-apiserver and kube-scheduler"),
            "{note}"
        );
        assert_eq!(
            gauge(&metrics, "DRAPartitionableDevices").as_deref(),
            Some("1")
        );
    }
}

#[tokio::test(start_paused = true)]
async fn withdrawn_devices_come_back_once_a_probe_shows_the_gate_on() {
    for layout in LAYOUTS {
        let api = FakeApi::new(false, true);
        let metrics = Arc::new(Metrics::new());
        let mut p = publisher(&api, &metrics);
        let want = desired(layout, false);
        p.publish(want.clone()).await.unwrap();
        api.state().counters_gate = true;
        // Before the next probe is due (10 s): still withdrawn, nothing asked, nothing written.
        tokio::time::advance(Duration::from_secs(9)).await;
        let stats = p.publish(want.clone()).await.unwrap();
        assert!(stats.withdrawn && stats.writes() == 0, "{stats:?}");
        assert_eq!(api.state().dry_runs.len(), 1);
        // Due: the probe keeps the counters, the full pool is published, a Normal event says so.
        tokio::time::advance(Duration::from_secs(1)).await;
        let stats = p.publish(want.clone()).await.unwrap();
        assert!(!stats.withdrawn && !p.withdrawn(), "{stats:?}");
        assert_eq!(
            stats.created + stats.updated,
            want.len(),
            "{layout:?}: every slice written: {stats:?}"
        );
        assert_full(&api, &want);
        let events = api.events();
        assert_eq!(
            events
                .iter()
                .map(|(w, r, _)| (*w, r.as_str()))
                .collect::<Vec<_>>(),
            [
                (true, "SharedCountersDropped"),
                (false, "SharedCountersKept")
            ]
        );
        assert_eq!(
            gauge(&metrics, "DRAPartitionableDevices").as_deref(),
            Some("0")
        );
        // Known kept: no more probes.
        p.publish(want.clone()).await.unwrap();
        assert_eq!(api.state().dry_runs.len(), 2);
    }
}

#[tokio::test(start_paused = true)]
async fn with_the_gate_on_the_pool_is_published_after_one_dry_run() {
    for layout in LAYOUTS {
        let api = FakeApi::new(true, true);
        let metrics = Arc::new(Metrics::new());
        let mut p = publisher(&api, &metrics);
        let want = desired(layout, false);
        let stats = p.publish(want.clone()).await.unwrap();
        assert!(!stats.withdrawn && stats.created == want.len(), "{stats:?}");
        assert_full(&api, &want);
        let stats = p.publish(want.clone()).await.unwrap();
        assert_eq!(stats.writes(), 0);
        assert_eq!(api.state().dry_runs.len(), 1);
        assert!(api.events().is_empty());
        assert_eq!(
            gauge(&metrics, "DRAPartitionableDevices").as_deref(),
            Some("0")
        );
    }
}

#[tokio::test(start_paused = true)]
async fn when_the_dry_run_is_refused_a_write_that_loses_its_counters_is_withdrawn_at_once() {
    let api = FakeApi::new(false, true);
    api.state().refuse_dry_run = true;
    let metrics = Arc::new(Metrics::new());
    let mut p = publisher(&api, &metrics);
    let want = desired(ResourceSliceLayout::SeparateCounterSlices, false);
    let stats = p.publish(want.clone()).await.unwrap();
    assert!(stats.withdrawn, "{stats:?}");
    assert_withdrawn(&api);
    assert_eq!(
        stats.created,
        want.len(),
        "the desired slices were written first"
    );
    assert_eq!(stats.deleted, want.len() - 1, "then all but one deleted");
    let events = api.events();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].1, "SharedCountersDropped");
    // While withdrawn, a failing probe keeps the devices withdrawn.
    tokio::time::advance(Duration::from_secs(10)).await;
    let stats = p.publish(want.clone()).await.unwrap();
    assert!(stats.withdrawn && stats.writes() == 0, "{stats:?}");
    // The dry run works again, with the gate on: the devices come back.
    {
        let mut s = api.state();
        s.refuse_dry_run = false;
        s.counters_gate = true;
    }
    tokio::time::advance(Duration::from_secs(20)).await;
    let stats = p.publish(want.clone()).await.unwrap();
    assert!(!stats.withdrawn, "{stats:?}");
    assert_full(&api, &want);
}

#[tokio::test(start_paused = true)]
async fn dropped_taints_keep_the_devices_published_and_post_one_node_event() {
    let api = FakeApi::new(true, false);
    let metrics = Arc::new(Metrics::new());
    let mut p = publisher(&api, &metrics);
    let want = desired(ResourceSliceLayout::SeparateCounterSlices, true);
    let stats = p.publish(want.clone()).await.unwrap();
    assert!(!stats.withdrawn && stats.dropped_fields == 1, "{stats:?}");
    assert_full(&api, &want);
    let events = api.events();
    assert_eq!(events.len(), 1, "{events:?}");
    let (warning, reason, note) = &events[0];
    assert!(*warning && reason == "DeviceTaintsDropped" && note.contains("DRADeviceTaints"));
    assert_eq!(gauge(&metrics, "DRADeviceTaints").as_deref(), Some("1"));
    // The taint changes (another GPU fault): written again, dropped again, no second event.
    let mut again = want.clone();
    let first = again
        .iter_mut()
        .flat_map(|s| s.devices.iter_mut().flatten())
        .next()
        .unwrap();
    first.taints.as_mut().unwrap()[0].value = Some("xid-48".into());
    p.publish(again).await.unwrap();
    assert_eq!(api.events().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_run_loop_probes_with_backoff_and_republishes_when_the_gate_is_turned_on() {
    let api = FakeApi::new(false, true);
    let metrics = Arc::new(Metrics::new());
    let want = desired(ResourceSliceLayout::SeparateCounterSlices, false);
    let (_tx, rx) = watch::channel(want.clone());
    let stop = CancellationToken::new();
    let config = RunConfig {
        resync: Duration::from_secs(3600),
        ..RunConfig::default()
    };
    let start = Instant::now();
    let task = tokio::spawn(publisher(&api, &metrics).run(rx, stop.clone(), config));
    // Probes at 0 s and 10 s (the gate still off); the next one is due at 30 s.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_withdrawn(&api);
    let probes: Vec<Duration> = api.state().dry_runs.iter().map(|t| *t - start).collect();
    assert_eq!(probes, [Duration::ZERO, Duration::from_secs(10)]);
    api.state().counters_gate = true;
    tokio::time::sleep(Duration::from_secs(17)).await;
    assert_withdrawn(&api);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_full(&api, &want);
    let warnings = api.events().iter().filter(|e| e.0).count();
    assert_eq!(
        warnings, 2,
        "a Warning per probe that found the counters dropped"
    );
    stop.cancel();
    let p = task.await.unwrap();
    assert!(!p.withdrawn());
    // Nothing was ever stored with devices but without counters.
    assert!(
        api.state()
            .stored_history
            .iter()
            .all(|s| s.devices.is_none() || uses_counters(s))
    );
}

#[tokio::test(start_paused = true)]
async fn an_api_server_restarted_with_the_gate_off_is_found_at_the_next_recheck() {
    let api = FakeApi::new(true, true);
    let metrics = Arc::new(Metrics::new());
    let mut p = Publisher::with_api(api.clone(), "n0", None).with_metrics(metrics.clone());
    let want = desired(ResourceSliceLayout::SeparateCounterSlices, false);
    p.publish(want.clone()).await.unwrap();
    // Restarted with the gate off: the stored slices keep their counters (updates keep fields
    // in use), so nothing written shows it; only a create (the probe) does.
    api.state().counters_gate = false;
    tokio::time::advance(Duration::from_secs(299)).await;
    let stats = p.publish(want.clone()).await.unwrap();
    assert!(!stats.withdrawn && stats.writes() == 0, "{stats:?}");
    assert_eq!(api.state().dry_runs.len(), 1);
    tokio::time::advance(Duration::from_secs(1)).await;
    let stats = p.publish(want.clone()).await.unwrap();
    assert!(stats.withdrawn, "{stats:?}");
    assert_withdrawn(&api);
    assert_eq!(api.events()[0].1, "SharedCountersDropped");
    assert_eq!(
        gauge(&metrics, "DRAPartitionableDevices").as_deref(),
        Some("1")
    );
}

mod binding;
mod shares;
