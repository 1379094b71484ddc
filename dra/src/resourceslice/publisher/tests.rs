//! Unit tests of [`super`] (`publisher.rs`): the completion of desired specs, and the publisher
//! against a fake API server's answers (no silent overlap; `tests/shares.rs`,
//! `tests/binding.rs` for the gates that latch).

use super::*;

const DRIVER: &str = "dev.example.com";

fn pool() -> Pool {
    Pool::new(DRIVER, "n0")
}

#[test]
fn complete_specs_sets_pool_driver_and_node() {
    let specs = complete_specs(
        &pool(),
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
        assert_eq!(s.driver, DRIVER);
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
    let specs = complete_specs(&pool(), vec![spec]).unwrap();
    assert!(specs[0].devices.is_none() && specs[0].shared_counters.is_none());
}

#[test]
fn an_empty_pool_is_one_empty_slice() {
    let specs = complete_specs(&pool(), vec![]).unwrap();
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
    let err = complete_specs(&pool(), specs).unwrap_err();
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
// `FakeSliceApi` answers like kube-apiserver's ResourceSlice registry: a create, dry run or not,
// drops the fields of a gate that is off; an update keeps them only when the stored slice
// already used them. The real server is exercised by e2e/tests/plugin_publisher.rs.

use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::testing::{FakeSliceApi, Recorded, uses_counters};

/// Where a card's counter set goes.
#[derive(Debug, Clone, Copy)]
enum Layout {
    /// With the devices that consume it (Kubernetes 1.34).
    Together,
    /// In a counter-only slice of its own (1.35 and newer).
    Apart,
}

const LAYOUTS: [Layout; 2] = [Layout::Together, Layout::Apart];

/// A device consuming parts `[start, start + size)` of card 0's counter set.
fn device(name: &str, start: usize, size: usize) -> Value {
    let parts: serde_json::Map<String, Value> = (start..start + size)
        .map(|p| (format!("part-{p}"), json!({"value": "1"})))
        .collect();
    json!({"name": name, "attributes": {"kind": {"string": "part"}},
           "consumesCounters": [{"counterSet": "card-0", "counters": parts}]})
}

/// The desired specs of one card on `n0` in `layout`: a counter set of four parts, four devices
/// of one part, two of two and one of four; `devices` appended to them.
fn desired_with(layout: Layout, devices: Vec<Value>) -> Vec<ResourceSliceSpec> {
    let counters = json!([{"name": "card-0",
        "counters": {"part-0": {"value": "1"}, "part-1": {"value": "1"},
                     "part-2": {"value": "1"}, "part-3": {"value": "1"}}}]);
    let mut all: Vec<Value> = (0..4).map(|p| device(&format!("one-{p}"), p, 1)).collect();
    all.extend([
        device("two-0", 0, 2),
        device("two-2", 2, 2),
        device("four-0", 0, 4),
    ]);
    all.extend(devices);
    let specs = match layout {
        Layout::Together => vec![json!({"sharedCounters": counters, "devices": all})],
        Layout::Apart => vec![json!({"sharedCounters": counters}), json!({"devices": all})],
    };
    specs
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect()
}

/// [`desired_with`] no other device, with a taint on the first device when `taint`.
fn desired(layout: Layout, taint: bool) -> Vec<ResourceSliceSpec> {
    let mut specs = desired_with(layout, vec![]);
    if taint {
        let first = specs
            .iter_mut()
            .flat_map(|s| s.devices.iter_mut().flatten())
            .next()
            .unwrap();
        first.taints = Some(vec![serde_json::from_value(
            json!({"key": "dev.example.com/unhealthy", "value": "fault-79", "effect": "NoSchedule"}),
        )
        .unwrap()]);
    }
    specs
}

fn publisher(api: &Arc<FakeSliceApi>, told: &Arc<Recorded>) -> Publisher {
    Publisher::with_api(api.clone(), pool())
        .with_events(told.clone())
        .with_gauge(told.clone())
        .with_probe_retry(Duration::from_secs(10), Duration::from_secs(40))
}

fn fake(counters_gate: bool, taints_gate: bool) -> (Arc<FakeSliceApi>, Arc<Recorded>) {
    (
        Arc::new(FakeSliceApi::new(counters_gate, taints_gate)),
        Arc::new(Recorded::default()),
    )
}

/// The stored pool is one slice without devices or counters.
fn assert_withdrawn(api: &FakeSliceApi) {
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
fn assert_full(api: &FakeSliceApi, want: &[ResourceSliceSpec]) {
    let stored = api.stored();
    assert_eq!(stored.len(), want.len());
    let count = |specs: &mut dyn Iterator<Item = &ResourceSliceSpec>| -> usize {
        specs.map(|s| s.devices.as_ref().map_or(0, Vec::len)).sum()
    };
    let devices = count(&mut stored.iter().map(|s| &s.spec));
    assert!(devices > 0 && devices == count(&mut want.iter()));
    assert!(stored.iter().all(|s| uses_counters(&s.spec)));
}

#[tokio::test(start_paused = true)]
async fn with_the_gate_off_no_device_is_ever_offered_and_the_node_gets_a_warning() {
    for layout in LAYOUTS {
        let (api, told) = fake(false, true);
        let mut p = publisher(&api, &told);
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
            "{layout:?}: only the empty slice"
        );
        drop(s);
        let events = told.events();
        assert_eq!(events.len(), 1, "{events:?}");
        let (warning, reason, note) = &events[0];
        assert!(*warning && reason == "SharedCountersDropped");
        assert!(
            note.contains("DRAPartitionableDevices") && note.contains(DRIVER),
            "the default note: {note}"
        );
        assert_eq!(told.gate_off("DRAPartitionableDevices"), Some(true));
    }
}

#[tokio::test(start_paused = true)]
async fn the_lines_of_a_publish_carry_its_driver_and_pool_in_its_span() {
    use das_runtime::logging::{LogFormat, capture};
    let (api, told) = fake(false, true);
    let mut p = publisher(&api, &told);
    let (out, _guard) = capture(LogFormat::Text, "warn");
    p.publish(desired(Layout::Together, false)).await.unwrap();
    let lines = out.lines();
    let notice = lines
        .iter()
        .find(|l| l.contains("reason=\"SharedCountersDropped\""))
        .unwrap_or_else(|| panic!("no notice in {lines:#?}"));
    assert!(
        notice.contains(&format!("publish{{driver={DRIVER} pool=n0}}: ")),
        "{notice}"
    );
    assert!(
        !notice.contains("node="),
        "the pool is the span's: {notice}"
    );
}

#[tokio::test(start_paused = true)]
async fn withdrawn_devices_come_back_once_a_probe_shows_the_gate_on() {
    for layout in LAYOUTS {
        let (api, told) = fake(false, true);
        let mut p = publisher(&api, &told);
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
        assert_eq!(stats.created + stats.updated, want.len(), "{stats:?}");
        assert_full(&api, &want);
        let reasons: Vec<(bool, String)> =
            told.events().into_iter().map(|(w, r, _)| (w, r)).collect();
        assert_eq!(
            reasons,
            [
                (true, "SharedCountersDropped".to_string()),
                (false, "SharedCountersKept".to_string())
            ]
        );
        assert_eq!(told.gate_off("DRAPartitionableDevices"), Some(false));
        // Known kept: no more probes.
        p.publish(want.clone()).await.unwrap();
        assert_eq!(api.state().dry_runs.len(), 2);
    }
}

#[tokio::test(start_paused = true)]
async fn with_the_gate_on_the_pool_is_published_after_one_dry_run() {
    for layout in LAYOUTS {
        let (api, told) = fake(true, true);
        let mut p = publisher(&api, &told);
        let want = desired(layout, false);
        let stats = p.publish(want.clone()).await.unwrap();
        assert!(!stats.withdrawn && stats.created == want.len(), "{stats:?}");
        assert_full(&api, &want);
        let stats = p.publish(want.clone()).await.unwrap();
        assert_eq!(stats.writes(), 0);
        assert_eq!(api.state().dry_runs.len(), 1);
        assert!(told.events().is_empty());
        assert_eq!(told.gate_off("DRAPartitionableDevices"), Some(false));
    }
}

#[tokio::test(start_paused = true)]
async fn when_the_dry_run_is_refused_a_write_that_loses_its_counters_is_withdrawn_at_once() {
    let (api, told) = fake(false, true);
    api.state().refuse_dry_run = true;
    let mut p = publisher(&api, &told);
    let want = desired(Layout::Apart, false);
    let stats = p.publish(want.clone()).await.unwrap();
    assert!(stats.withdrawn, "{stats:?}");
    assert_withdrawn(&api);
    assert_eq!(
        stats.created,
        want.len(),
        "the desired slices were written first"
    );
    assert_eq!(stats.deleted, want.len() - 1, "then all but one deleted");
    assert_eq!(told.events().len(), 1);
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
    let (api, told) = fake(true, false);
    let mut p = publisher(&api, &told);
    let want = desired(Layout::Apart, true);
    let stats = p.publish(want.clone()).await.unwrap();
    assert!(!stats.withdrawn && stats.dropped_fields == 1, "{stats:?}");
    assert_full(&api, &want);
    let events = told.events();
    assert_eq!(events.len(), 1, "{events:?}");
    let (warning, reason, note) = &events[0];
    assert!(*warning && reason == "DeviceTaintsDropped" && note.contains("DRADeviceTaints"));
    assert_eq!(told.gate_off("DRADeviceTaints"), Some(true));
    // The taint changes (another fault): written again, dropped again, no second event.
    let mut again = want.clone();
    let first = again
        .iter_mut()
        .flat_map(|s| s.devices.iter_mut().flatten())
        .next()
        .unwrap();
    first.taints.as_mut().unwrap()[0].value = Some("fault-48".into());
    p.publish(again).await.unwrap();
    assert_eq!(told.events().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_run_loop_probes_with_backoff_and_republishes_when_the_gate_is_turned_on() {
    let (api, told) = fake(false, true);
    let want = desired(Layout::Apart, false);
    let (_tx, rx) = watch::channel(want.clone());
    let stop = CancellationToken::new();
    let config = RunConfig {
        resync: Duration::from_secs(3600),
        ..RunConfig::default()
    };
    let start = Instant::now();
    let task = tokio::spawn(publisher(&api, &told).run(rx, stop.clone(), config));
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
    let warnings = told.events().iter().filter(|e| e.0).count();
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
async fn run_with_publishes_what_the_driver_makes_of_each_input() {
    let (api, told) = fake(true, true);
    // The input: how many of the card's devices to publish.
    let (tx, rx) = watch::channel(3usize);
    let first_n = |n: &usize| {
        let mut specs = desired(Layout::Apart, false);
        specs[1].devices.as_mut().unwrap().truncate(*n);
        specs
    };
    let stop = CancellationToken::new();
    let task = tokio::spawn(publisher(&api, &told).run_with(
        rx,
        first_n,
        stop.clone(),
        RunConfig::default(),
    ));
    let published = |api: &FakeSliceApi| -> usize {
        api.stored()
            .iter()
            .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
            .sum()
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(published(&api), 3);
    tx.send(5).unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(published(&api), 5);
    stop.cancel();
    let p = task.await.unwrap();
    assert_eq!(p.totals().publishes, 2, "{:?}", p.totals());
}

#[tokio::test(start_paused = true)]
async fn an_api_server_restarted_with_the_gate_off_is_found_at_the_next_recheck() {
    let (api, told) = fake(true, true);
    let mut p = Publisher::with_api(api.clone(), pool()).with_gauge(told.clone());
    let want = desired(Layout::Apart, false);
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
    assert!(told.events().is_empty(), "no events without NodeEvents");
    assert_eq!(told.gate_off("DRAPartitionableDevices"), Some(true));
}

/// [`NodeEvents`] in a driver's own words.
struct OwnWords(Recorded);

#[tonic::async_trait]
impl NodeEvents for OwnWords {
    fn note(&self, notice: &Notice, pool: &Pool) -> String {
        format!("{} on {}: {}", notice.reason(), pool.node, notice.gate())
    }

    async fn post(&self, notice: &Notice, note: String) {
        self.0.post(notice, note).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_driver_words_the_notes_its_own_way() {
    let api = Arc::new(FakeSliceApi::new(false, true));
    let words = Arc::new(OwnWords(Recorded::default()));
    let mut p = Publisher::with_api(api.clone(), pool()).with_events(words.clone());
    p.publish(desired(Layout::Together, false)).await.unwrap();
    let events = words.0.events();
    assert_eq!(
        events,
        [(
            true,
            "SharedCountersDropped".to_string(),
            "SharedCountersDropped on n0: DRAPartitionableDevices".to_string()
        )]
    );
}

mod binding;
mod shares;
