//! Unit tests of [`super`] (`publisher.rs`): DAS's publisher against a fake API server's
//! answers (no silent overlap): DAS's slices, Node events in DAS's words, the
//! `das_kubelet_plugin_apiserver_feature_gate_off` gauge, DAS's shareable devices. The generic
//! publisher's own tests are dra-plugin's (`resourceslice/publisher/tests.rs`).

use super::*;

// `FakeApi` answers like kube-apiserver's ResourceSlice registry (dra-plugin's `FakeSliceApi`):
// a create, dry run or not, drops the fields of a gate that is off; an update keeps them only
// when the stored slice already used them (kubernetes
// `pkg/registry/resource/resourceslice/strategy.go`, `dropDisabledFields`); and it records the
// Node events. The real server is exercised by e2e/tests/plugin_publisher.rs.

use std::sync::Mutex;

use dra_plugin::testing::{FakeSliceApi, FakeState, uses_counters};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceTaint, ResourceSlice};
use kube::api::Preconditions;
use tokio::time::Instant;

use crate::events::{EventKind, EventTarget};
use crate::gpu::GpuInfo;
use crate::publish::PublishApi;
use crate::publish::resource_slices::{ResourceSliceLayout, desired_resource_slices};

struct FakeApi {
    slices: FakeSliceApi,
    /// Node events: (warning, reason, note).
    events: Mutex<Vec<(bool, String, String)>>,
}

impl FakeApi {
    fn new(counters_gate: bool, taints_gate: bool) -> Arc<Self> {
        Arc::new(Self {
            slices: FakeSliceApi::new(counters_gate, taints_gate),
            events: Mutex::default(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.slices.state()
    }

    fn stored(&self) -> Vec<ResourceSlice> {
        self.slices.stored()
    }

    fn events(&self) -> Vec<(bool, String, String)> {
        self.events.lock().unwrap().clone()
    }
}

#[tonic::async_trait]
impl PublishApi for FakeApi {
    async fn list(&self, field_selector: &str) -> Result<Vec<ResourceSlice>, kube::Error> {
        self.slices.list(field_selector).await
    }

    async fn node(&self, name: &str) -> Result<Node, kube::Error> {
        self.slices.node(name).await
    }

    async fn create(
        &self,
        slice: &ResourceSlice,
        dry_run: bool,
    ) -> Result<ResourceSlice, kube::Error> {
        self.slices.create(slice, dry_run).await
    }

    async fn replace(&self, slice: &ResourceSlice) -> Result<ResourceSlice, kube::Error> {
        self.slices.replace(slice).await
    }

    async fn delete(&self, name: &str, preconditions: Preconditions) -> Result<(), kube::Error> {
        self.slices.delete(name, preconditions).await
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
        self.events
            .lock()
            .unwrap()
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
    Publisher::with_api(api.clone(), api.clone(), "n0", None)
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
    let mut p =
        Publisher::with_api(api.clone(), api.clone(), "n0", None).with_metrics(metrics.clone());
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

mod api;
mod binding;
mod shareable;
mod shares;
