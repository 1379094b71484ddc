//! Unit tests of [`super`] (`monitor.rs`). What is published is observed as the publisher
//! computes it: [`desired_slices`] of the inventory's slices and the facts the monitor sent.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::ResourceSliceSpec;

use super::*;
use crate::blocking::BlockingCalls;
use crate::events::{EventKind, EventTarget};
use crate::gpu::EmulatedBackend;
use crate::gpu::GpuBackend;
use crate::health::book::{HealthPolicy, TaintEffect};
use crate::publish::desired::desired_slices;
use crate::publish::resource_slices::{ResourceSliceLayout, desired_resource_slices};
use das_api::health_taints;

/// Node name the tests' monitors serve.
const NODE: &str = "n0";

/// The Node events posted, in memory: (reason, note).
#[derive(Default)]
struct MemoryEvents {
    events: Mutex<Vec<(String, String)>>,
}

#[tonic::async_trait]
impl EventSink for MemoryEvents {
    async fn event(&self, _about: &EventTarget, _kind: EventKind, reason: &str, note: String) {
        self.events.lock().unwrap().push((reason.into(), note));
    }
}

struct Setup {
    monitor: HealthMonitor,
    emu: Arc<EmulatedBackend>,
    api: Arc<MemoryEvents>,
    metrics: Arc<Metrics>,
    /// The inventory's slices, without taints.
    base: Vec<ResourceSliceSpec>,
    /// What the monitor last sent.
    facts: watch::Receiver<HealthFacts>,
    _dir: tempfile::TempDir,
}

fn setup(effect: TaintEffect) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let emu = Arc::new(EmulatedBackend::open("A30:2", NODE, dir.path()).unwrap());
    let inventory = emu.inventory().unwrap();
    let base: Vec<ResourceSliceSpec> =
        desired_resource_slices(NODE, &inventory, ResourceSliceLayout::SeparateCounterSlices)
            .unwrap()
            .into_iter()
            .map(|d| d.slice.spec)
            .collect();
    let (tx, facts) = watch::channel(HealthFacts::default());
    let api = Arc::new(MemoryEvents::default());
    let metrics = Arc::new(Metrics::new());
    let policy = HealthPolicy {
        quiet_period: Duration::ZERO,
        effect,
        ..HealthPolicy::default()
    };
    let monitor = HealthMonitor::new(
        HealthBook::new(policy, inventory.iter().map(|g| g.index)),
        GpuCalls::new(emu.clone(), BlockingCalls::Threads),
        NODE,
        &inventory,
        tx,
        api.clone(),
        metrics.clone(),
    );
    Setup {
        monitor,
        emu,
        api,
        metrics,
        base,
        facts,
        _dir: dir,
    }
}

/// The specs the publisher publishes for the facts the monitor last sent.
fn published(s: &Setup) -> Vec<ResourceSliceSpec> {
    desired_slices(&s.base, &s.facts.borrow())
}

/// Taints of the published devices, by device name (untainted ones left out).
fn published_taints(s: &Setup) -> BTreeMap<String, Vec<(String, String, String)>> {
    published(s)
        .iter()
        .flat_map(|spec| spec.devices.iter().flatten())
        .filter_map(|d| {
            let t = d.taints.as_ref()?;
            Some((
                d.name.clone(),
                t.iter()
                    .map(|t| {
                        (
                            t.key.clone(),
                            t.value.clone().unwrap_or_default(),
                            t.effect.clone(),
                        )
                    })
                    .collect(),
            ))
        })
        .collect()
}

fn events(s: &Setup) -> Vec<String> {
    s.api
        .events
        .lock()
        .unwrap()
        .iter()
        .map(|(r, _)| r.clone())
        .collect()
}

#[tokio::test]
async fn a_fatal_xid_taints_its_gpu_reports_it_and_recovery_clears_it() {
    let s = setup(TaintEffect::NoSchedule);
    let mut changes = s.monitor.changes().unwrap();
    let t = s
        .monitor
        .observe(&[HealthEvent::Xid {
            gpu: 0,
            xid: 79,
            gpu_instance: None,
        }])
        .await;
    s.monitor.act(&t).await;
    assert!(changes.has_changed().unwrap(), "the health stream is woken");
    changes.mark_unchanged();
    let taints = published_taints(&s);
    assert!(!taints.is_empty());
    for (device, t) in &taints {
        assert!(device.starts_with("gpu-0-"), "{device}");
        assert_eq!(
            t,
            &[(health_taints::XID.into(), "79".into(), "NoSchedule".into())]
        );
    }
    let health = s.monitor.device_health().await;
    for h in &health {
        assert_eq!(h.healthy, h.device.starts_with("gpu-1-"), "{}", h.device);
        if !h.healthy {
            assert!(
                h.message.contains("XID 79 (GPU has fallen off the bus)"),
                "{}",
                h.message
            );
        }
    }
    assert_eq!(events(&s), ["GpuUnhealthy"]);
    let note = s.api.events.lock().unwrap()[0].1.clone();
    assert!(
        note.contains("GPU 0 (GPU-") && note.contains("mig.das.com/xid=79:NoSchedule"),
        "{note}"
    );
    let text = s.metrics.probe.encode();
    assert!(
        text.contains(r#"das_kubelet_plugin_gpu_healthy{gpu="0"} 0"#),
        "{text}"
    );
    assert!(
        text.contains(r#"das_kubelet_plugin_gpu_healthy{gpu="1"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"xid_events_total{gpu="0",xid="79",fatal="true"} 1"#),
        "{text}"
    );

    // Quiet period 0: the next expiry recovers it.
    let t = s.monitor.book().expire(SystemTime::now());
    assert_eq!(t, [Transition::Recovered { gpu: 0 }]);
    s.monitor.act(&t).await;
    assert!(published_taints(&s).is_empty());
    assert!(s.monitor.device_health().await.iter().all(|h| h.healthy));
    assert_eq!(events(&s), ["GpuUnhealthy", "GpuRecovered"]);
}

#[tokio::test]
async fn a_non_fatal_xid_changes_nothing_but_a_metric_and_an_event() {
    let s = setup(TaintEffect::NoSchedule);
    let t = s
        .monitor
        .observe(&[HealthEvent::Xid {
            gpu: 1,
            xid: 13,
            gpu_instance: Some(2),
        }])
        .await;
    assert_eq!(t, [Transition::NonFatalXid { gpu: 1, xid: 13 }]);
    s.monitor.act(&t).await;
    assert!(published_taints(&s).is_empty());
    assert!(s.monitor.device_health().await.iter().all(|h| h.healthy));
    assert_eq!(events(&s), ["GpuXid"]);
    assert!(
        s.metrics
            .probe
            .encode()
            .contains(r#"xid_events_total{gpu="1",xid="13",fatal="false"} 1"#)
    );
}

#[tokio::test]
async fn a_lost_gpu_is_tainted_no_execute_when_asked_and_clears_once_back() {
    let s = setup(TaintEffect::NoExecute);
    s.emu.set_gpu_lost(1, true);
    let t = s.monitor.check_inventory().await;
    assert_eq!(
        t,
        [Transition::Unhealthy {
            gpu: 1,
            cause: crate::health::Cause::Lost
        }]
    );
    s.monitor.act(&t).await;
    let taints = published_taints(&s);
    assert!(taints.keys().all(|d| d.starts_with("gpu-1-")) && !taints.is_empty());
    assert!(taints.values().all(|t| t
        == &[(
            health_taints::GPU_LOST.into(),
            "true".into(),
            "NoExecute".into()
        )]));
    assert!(
        s.monitor.book().expire(SystemTime::now()).is_empty(),
        "not while lost"
    );
    s.emu.set_gpu_lost(1, false);
    assert!(s.monitor.check_inventory().await.is_empty());
    let t = s.monitor.book().expire(SystemTime::now());
    assert_eq!(t, [Transition::Recovered { gpu: 1 }]);
    s.monitor.act(&t).await;
    assert!(published_taints(&s).is_empty());
}

struct Fixed(Mutex<Vec<MigInstance>>);

#[tonic::async_trait]
impl UnclaimedInstances for Fixed {
    async fn unclaimed_instances(&self) -> Vec<MigInstance> {
        self.0.lock().unwrap().clone()
    }
}

fn device_names(s: &Setup) -> Vec<String> {
    published(s)
        .iter()
        .flat_map(|spec| spec.devices.iter().flatten())
        .map(|d| d.name.clone())
        .collect()
}

/// `s` with its monitor asking `source` (and `at_start` withdrawn).
fn with_source(s: Setup, source: Arc<Fixed>, at_start: Vec<MigInstance>) -> Setup {
    Setup {
        monitor: s.monitor.with_unclaimed_instances(source, at_start),
        ..s
    }
}

#[tokio::test]
async fn an_unclaimed_instance_seen_twice_withdraws_its_devices_until_it_is_gone() {
    let s = setup(TaintEffect::NoSchedule);
    let foreign = s.emu.create_foreign_instance(1, "1g.6gb", 0).unwrap();
    let source = Arc::new(Fixed(Mutex::new(vec![foreign])));
    let s = with_source(s, source.clone(), Vec::new());
    let all = device_names(&s);
    assert!(!s.monitor.check_unclaimed().await, "once is not enough");
    assert!(s.monitor.check_unclaimed().await, "twice in a row is");
    s.monitor.send_facts();
    let left = device_names(&s);
    assert!(
        !left.contains(&"gpu-1-mig-1g-6gb-0".to_string()),
        "{left:?}"
    );
    assert!(left.contains(&"gpu-1-mig-1g-6gb-1".to_string()));
    assert!(left.contains(&"gpu-0-mig-1g-6gb-0".to_string()));
    assert_eq!(events(&s), ["UnclaimedMigInstance"]);
    assert!(
        !s.monitor.check_unclaimed().await,
        "no change while it stays"
    );

    source.0.lock().unwrap().clear();
    assert!(s.monitor.check_unclaimed().await);
    s.monitor.send_facts();
    assert_eq!(device_names(&s), all);
    assert_eq!(
        events(&s),
        ["UnclaimedMigInstance", "UnclaimedMigInstanceGone"]
    );
}

#[tokio::test]
async fn instances_found_at_start_are_withdrawn_at_once() {
    let s = setup(TaintEffect::NoSchedule);
    let foreign = s.emu.create_foreign_instance(0, "4g.24gb", 0).unwrap();
    let source = Arc::new(Fixed(Mutex::new(vec![foreign.clone()])));
    let s = with_source(s, source, vec![foreign]);
    let specs = desired_slices(&s.base, &s.monitor.facts());
    let names: Vec<&str> = specs
        .iter()
        .flat_map(|x| x.devices.iter().flatten())
        .map(|d| d.name.as_str())
        .collect();
    assert!(names.iter().all(|n| !n.starts_with("gpu-0-")), "{names:?}");
    assert!(names.iter().any(|n| n.starts_with("gpu-1-")));
    assert!(!s.monitor.check_unclaimed().await, "already withdrawn");
}

/// Device names of `s`'s GPU 0 whose placement overlaps `placement`.
fn gpu0_devices_overlapping(s: &Setup, placement: Placement) -> BTreeSet<String> {
    let inventory = s.emu.inventory().unwrap();
    device_index(&inventory)
        .into_iter()
        .filter(|(_, d)| {
            let p = Placement {
                start: d.start,
                size: d.size,
            };
            // The shareable twins are tainted too, but not published here.
            d.gpu_index == 0 && !d.shared && p.mask() & placement.mask() != 0
        })
        .map(|(name, _)| name)
        .collect()
}

fn xid_on(gpu: u32, xid: u32, gpu_instance: u32) -> HealthEvent {
    HealthEvent::Xid {
        gpu,
        xid,
        gpu_instance: Some(gpu_instance),
    }
}

#[tokio::test]
async fn an_xid_naming_a_gpu_instance_taints_and_reports_only_its_devices() {
    let s = setup(TaintEffect::NoSchedule);
    let x = s.emu.create_instance(0, "1g.6gb", 0).unwrap();
    let y = s.emu.create_instance(0, "1g.6gb", 1).unwrap();
    let t = s.monitor.observe(&[xid_on(0, 94, x.gi_id)]).await;
    assert!(
        matches!(&t[..], [Transition::InstanceUnhealthy { gpu: 0, instance, cause: crate::health::Cause::Xid(94) }]
            if instance.id == x.gi_id && instance.placement == x.placement),
        "{t:?}"
    );
    s.monitor.act(&t).await;

    let x_devices = gpu0_devices_overlapping(&s, x.placement);
    for d in [
        "gpu-0-mig-1g-6gb-0",
        "gpu-0-mig-2g-12gb-0",
        "gpu-0-mig-4g-24gb-0",
    ] {
        assert!(x_devices.contains(d), "{d} overlaps X: {x_devices:?}");
    }
    let taints = published_taints(&s);
    assert_eq!(taints.keys().cloned().collect::<BTreeSet<_>>(), x_devices);
    assert!(
        taints
            .values()
            .all(|t| t == &[(health_taints::XID.into(), "94".into(), "NoSchedule".into())])
    );
    let y_device = format!("gpu-0-mig-1g-6gb-{}", y.placement.start);
    assert!(!taints.contains_key(&y_device), "Y's slice is untouched");

    let unhealthy: BTreeSet<String> = s
        .monitor
        .device_health()
        .await
        .into_iter()
        .filter(|h| !h.healthy && !h.device.ends_with("-shared"))
        .inspect(|h| assert!(h.message.contains("GPU instance"), "{}", h.message))
        .map(|h| h.device)
        .collect();
    assert_eq!(unhealthy, x_devices);
    assert_eq!(events(&s), ["GpuUnhealthy"]);
    let note = s.api.events.lock().unwrap()[0].1.clone();
    assert!(
        note.contains(&format!(
            "GPU instance {} (1g.6gb at memory slices 0:1)",
            x.gi_id
        )) && note.contains("mig.das.com/xid=94:NoSchedule")
            && note.contains("other devices stay in service"),
        "{note}"
    );
    let gauge = r#"das_kubelet_plugin_gpu_healthy{gpu="0"} 0"#;
    assert!(s.metrics.probe.encode().contains(gauge));

    // Quiet period 0: the next expiry recovers the instance.
    let t = s.monitor.book().expire(SystemTime::now());
    assert!(
        matches!(&t[..], [Transition::InstanceRecovered { gpu: 0, .. }]),
        "{t:?}"
    );
    s.monitor.act(&t).await;
    assert!(published_taints(&s).is_empty());
    assert_eq!(events(&s), ["GpuUnhealthy", "GpuRecovered"]);
    let gauge = r#"das_kubelet_plugin_gpu_healthy{gpu="0"} 1"#;
    assert!(s.metrics.probe.encode().contains(gauge));
}

/// The pods kube-controller-manager's device taint eviction controller evicts: those whose
/// claim is allocated a device carrying a `NoExecute` taint (no claim here tolerates one).
/// `pods`: (pod, the device its claim is allocated).
fn evicted<'a>(s: &Setup, pods: &[(&'a str, &str)]) -> Vec<&'a str> {
    let taints = published_taints(s);
    pods.iter()
        .filter(|(_, device)| {
            taints
                .get(*device)
                .is_some_and(|ts| ts.iter().any(|(_, _, effect)| effect == "NoExecute"))
        })
        .map(|(pod, _)| *pod)
        .collect()
}

#[tokio::test]
async fn under_evict_on_fatal_only_the_pods_of_the_gpu_instances_claim_are_evicted() {
    let s = setup(TaintEffect::NoExecute);
    let x = s.emu.create_instance(0, "1g.6gb", 0).unwrap();
    s.emu.create_instance(0, "1g.6gb", 1).unwrap();
    let pods = [
        ("victim", "gpu-0-mig-1g-6gb-0"),
        ("bystander", "gpu-0-mig-1g-6gb-1"),
        ("elsewhere", "gpu-1-mig-1g-6gb-0"),
    ];
    // Raised through the emulated backend's event injection, as a running plugin gets it.
    s.emu.raise_health_event(xid_on(0, 94, x.gi_id));
    let raised = s.emu.wait_health_events(Duration::from_millis(10)).unwrap();
    let t = s.monitor.observe(&raised).await;
    s.monitor.act(&t).await;
    assert_eq!(evicted(&s, &pods), ["victim"]);

    // A GPU-wide fatal XID on the same GPU reaches the bystander too.
    let t = s.monitor.observe(&[xid_on(0, 79, x.gi_id)]).await;
    s.monitor.act(&t).await;
    assert_eq!(evicted(&s, &pods), ["victim", "bystander"]);
}

#[tokio::test]
async fn an_xid_naming_no_live_gpu_instance_taints_the_whole_gpu() {
    let s = setup(TaintEffect::NoSchedule);
    let x = s.emu.create_instance(0, "1g.6gb", 0).unwrap();
    let t = s.monitor.observe(&[xid_on(0, 94, x.gi_id + 1)]).await;
    assert_eq!(
        t,
        [Transition::Unhealthy {
            gpu: 0,
            cause: crate::health::Cause::Xid(94)
        }]
    );
    s.monitor.act(&t).await;
    let all_gpu0 = gpu0_devices_overlapping(&s, Placement { start: 0, size: 8 });
    let tainted: BTreeSet<String> = published_taints(&s).into_keys().collect();
    assert_eq!(tainted, all_gpu0);
}
