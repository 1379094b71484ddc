//! Whole GPUs on the request path (issue 32, docs/design.md §7, "Whole GPUs"): a prepare
//! creates no MIG instance, records the device (profile `gpu`, every memory slice), writes a CDI
//! spec with the GPU's device node and `DAS_GPU_UUID_…`, and its status entry says
//! `GpuPrepared`; an unprepare destroys nothing; the isolation rule holds between a whole GPU
//! and the MIG instances of its GPU; start-up keeps a completed record and rolls back a half-done one.
//! GPU 0 has MIG mode off ([`MigOff`]) and is published whole ([`serve_whole`]), as the plugin
//! does under `--whole-gpus`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;

use super::handler::ClaimRef;
use super::orphans::{DEFAULT_ORPHAN_DELAY, OrphanPolicy};
use super::testing::{
    MemoryApi, MemoryRuntime, MigOff, NODE, UID_A, UID_B, inline, preparer_with, serve_whole,
};
use super::{PrepareError, Preparer};
use crate::claims::cdi;
use crate::claims::checkpoint::{DeviceKind, PrepareState};
use crate::gpu::{EmulatedBackend, GpuBackend, GpuInfo};

struct Setup {
    dir: tempfile::TempDir,
    emu: Arc<EmulatedBackend>,
    gpus: Arc<MigOff>,
    api: Arc<MemoryApi>,
    runtime: Arc<MemoryRuntime>,
    /// GPU 0 as the plugin found it at start (MIG mode off).
    gpu0: GpuInfo,
    /// GPU 0's MIG devices stay published beside it whole (the isolation rule's tests).
    keep_slices: bool,
    p: Arc<Preparer>,
}

/// Two A100-40GB: GPU 0 with MIG mode off, published whole as `gpu-0`; GPU 1 with MIG on.
fn setup(keep_slices: bool) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let emu =
        Arc::new(EmulatedBackend::open("A100-SXM4-40GB:2", NODE, &dir.path().join("emu")).unwrap());
    let gpus = Arc::new(MigOff::new(emu.clone(), &[0]));
    let gpu0 = gpus.inventory().unwrap().remove(0);
    let api = Arc::new(MemoryApi::default());
    let runtime = Arc::new(MemoryRuntime::default());
    let p = start(&dir, &gpus, &api, &runtime, &gpu0, keep_slices);
    Setup {
        dir,
        emu,
        gpus,
        api,
        runtime,
        gpu0,
        keep_slices,
        p,
    }
}

/// A plugin process over this node's GPUs, checkpoint and CDI dir (a restart when one ran),
/// with the orphan rule's runtime and GPU 0 published whole.
fn start(
    dir: &tempfile::TempDir,
    gpus: &Arc<MigOff>,
    api: &Arc<MemoryApi>,
    runtime: &Arc<MemoryRuntime>,
    gpu0: &GpuInfo,
    keep_slices: bool,
) -> Arc<Preparer> {
    let policy = OrphanPolicy {
        delay: DEFAULT_ORPHAN_DELAY,
        runtime: Some(runtime.clone()),
    };
    let mut p = preparer_with(dir.path(), gpus.clone(), api.clone(), inline(), policy);
    serve_whole(&mut p, gpu0, keep_slices);
    Arc::new(p)
}

impl Setup {
    /// [`start`] over this setup's node.
    fn start(&self) -> Arc<Preparer> {
        start(
            &self.dir,
            &self.gpus,
            &self.api,
            &self.runtime,
            &self.gpu0,
            self.keep_slices,
        )
    }

    fn claim(&self, name: &str, uid: &str, device: &str) -> ClaimRef {
        self.api.allocate("ns", name, uid, &[("gpu", device)])
    }

    fn spec_path(&self, claim: &ClaimRef) -> std::path::PathBuf {
        cdi::spec_path(&self.dir.path().join("cdi"), &claim.uid)
    }

    fn spec(&self, claim: &ClaimRef) -> serde_json::Value {
        serde_json::to_value(cdi::read_spec(&self.spec_path(claim)).unwrap()).unwrap()
    }

    fn no_instances(&self) {
        assert!(self.emu.all_instances().unwrap().is_empty());
        assert_eq!(self.gpus.creates_refused.load(Ordering::SeqCst), 0);
    }
}

/// The CDI spec of claim `uid` holding GPU 0 whole, as the plugin writes it.
fn whole_gpu_spec(uid: &str, gpu: &GpuInfo) -> serde_json::Value {
    let var = cdi::gpu_uuid_env_key(uid, "gpu", 0);
    // No char device with a file mode (a MIG device's capability nodes): CDI 0.3.0 suffices.
    json!({
        "cdiVersion": "0.3.0",
        "kind": "das.com/mig",
        "devices": [{
            "name": format!("{uid}-gpu-0"),
            "containerEdits": {
                "env": [format!("{var}={}", gpu.uuid)],
                "deviceNodes": [{"path": format!("/dev/nvidia{}", gpu.minor)}]
            }
        }],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [
                {"path": "/dev/nvidiactl"},
                {"path": "/dev/nvidia-uvm"},
                {"path": "/dev/nvidia-uvm-tools"}
            ]
        }
    })
}

/// Prepare, retried prepare and unprepare of a whole GPU: no MIG instance at any point; the
/// record, the CDI spec and the status entry of the contract; the retry answers from the
/// record (writing a lost spec again); the unprepare removes spec and record.
#[tokio::test(start_paused = true)]
async fn a_whole_gpu_is_prepared_and_unprepared_without_any_mig_instance() {
    let s = setup(false);
    let a = s.claim("a", UID_A, "gpu-0");
    let answer = s.p.prepare_claim(&a).await.unwrap();
    s.no_instances();
    assert_eq!(answer.len(), 1);
    assert_eq!(answer[0].device, "gpu-0");
    assert_eq!(
        answer[0].cdi_device_ids,
        [format!("das.com/mig={UID_A}-gpu-0")]
    );
    // The record: profile `gpu`, every memory slice, no instance.
    let record = s.p.record_of(UID_A).unwrap();
    assert_eq!(record.state, PrepareState::PrepareCompleted);
    let d = &record.devices[0];
    assert_eq!(d.kind, DeviceKind::WholeGpu);
    assert_eq!(d.profile, das_api::WHOLE_GPU_PROFILE);
    assert_eq!(
        (d.placement_start, d.placement_size),
        (0, s.gpu0.model.memory_slices)
    );
    assert_eq!(
        (d.instance.as_ref(), d.gpu_uuid.as_str()),
        (None, s.gpu0.uuid.as_str())
    );
    // The CDI spec: the GPU's node, its UUID, no capability nodes.
    let spec = s.spec(&a);
    eprintln!("{}", serde_json::to_string_pretty(&spec).unwrap());
    assert_eq!(spec, whole_gpu_spec(UID_A, &s.gpu0));
    // The status entry.
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap(),
    );
    let body = super::claim_api::status_apply_body(&a, &record.devices, now);
    let entry = &body["status"]["devices"][0];
    assert_eq!(entry["conditions"][0]["reason"], "GpuPrepared");
    assert_eq!(entry["conditions"][0]["status"], "True");
    assert_eq!(
        entry["data"],
        json!({"migUUID": "", "gpuUUID": s.gpu0.uuid, "profile": "gpu",
            "placement": {"start": 0, "size": 8}, "readyTime": "2023-11-14T22:13:20.000Z"})
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        s.api.statuses.lock().unwrap().get(UID_A),
        Some(&vec![String::new()])
    );
    // The gauges: the GPU's every memory slice is in use, by no MIG instance.
    let gauges = s.p.metrics.probe.encode();
    assert!(
        gauges.contains(r#"das_kubelet_plugin_gpu_memory_slices_in_use{gpu="0"} 8"#)
            && gauges.contains(r#"das_kubelet_plugin_prepared_slices{gpu="0"} 0"#),
        "{gauges}"
    );
    // A retried prepare answers from the record; a lost spec is written again.
    std::fs::remove_file(s.spec_path(&a)).unwrap();
    assert_eq!(s.p.prepare_claim(&a).await.unwrap(), answer);
    assert_eq!(s.spec(&a), whole_gpu_spec(UID_A, &s.gpu0));
    assert_eq!(
        s.p.record_of(UID_A).unwrap(),
        record,
        "the record is untouched"
    );
    s.no_instances();
    // The unprepare destroys nothing and forgets the claim.
    s.p.unprepare_claim(&a).await.unwrap();
    assert!(!s.spec_path(&a).exists());
    assert!(s.p.record_of(UID_A).is_none());
    s.no_instances();
    let gauges = s.p.metrics.probe.encode();
    assert!(
        gauges.contains(r#"das_kubelet_plugin_gpu_memory_slices_in_use{gpu="0"} 0"#),
        "{gauges}"
    );
}

/// A GPU whose MIG mode is on now, that does not answer, or that this node does not publish
/// whole fails the prepare with `whole_gpu_unavailable`, saying why; nothing is recorded.
#[tokio::test(start_paused = true)]
async fn a_whole_gpu_that_cannot_serve_fails_with_whole_gpu_unavailable() {
    let s = setup(false);
    let a = s.claim("a", UID_A, "gpu-0");
    s.gpus.set_mig(0, true);
    let e = s.p.prepare_claim(&a).await.unwrap_err();
    assert_eq!(e.metric_label(), "whole_gpu_unavailable", "{e}");
    let text = e.to_string();
    assert!(
        text.starts_with("device gpu-0 (a whole GPU) cannot be prepared: GPU 0")
            && text.contains("MIG mode on")
            && text.contains("nvidia-smi -i 0 -mig 0"),
        "{text}"
    );
    assert!(s.p.record_of(UID_A).is_none() && !s.spec_path(&a).exists());
    // A lost GPU.
    s.gpus.set_mig(0, false);
    s.emu.set_gpu_lost(0, true);
    let e = s.p.prepare_claim(&a).await.unwrap_err();
    assert!(
        matches!(&e, PrepareError::WholeGpuUnavailable { reason, .. } if reason.contains("not in this node's inventory")),
        "{e}"
    );
    s.emu.set_gpu_lost(0, false);
    s.p.prepare_claim(&a).await.unwrap();
    // A whole GPU this node does not publish (GPU 1 has MIG on): told what to do.
    let b = s.claim("b", UID_B, "gpu-1");
    let e = s.p.prepare_claim(&b).await.unwrap_err();
    assert_eq!(e.metric_label(), "whole_gpu_unavailable", "{e}");
    assert!(e.to_string().contains("--whole-gpus"), "{e}");
    let c = s.claim("c", "cccccccc-0000-0000-0000-000000000003", "gpu-9-mig-x");
    assert_eq!(
        s.p.prepare_claim(&c).await.unwrap_err().metric_label(),
        "unknown_device"
    );
    s.no_instances();
}

/// The isolation rule: a MIG instance whose GPU is held whole by another claim's record waits for
/// the kubelet's unprepare of that claim and otherwise fails with `placement_held`, creating
/// nothing; and a whole GPU waits the same way for a MIG instance of its GPU.
#[tokio::test(start_paused = true)]
async fn a_slice_and_a_whole_gpu_of_one_gpu_wait_for_each_other() {
    let s = setup(true);
    let whole = s.claim("whole", UID_A, "gpu-0");
    s.p.prepare_claim(&whole).await.unwrap();
    let slice = s.claim("slice", UID_B, "gpu-0-mig-1g-5gb-6");
    let t0 = tokio::time::Instant::now();
    let e = s.p.prepare_claim(&slice).await.unwrap_err();
    assert_eq!(t0.elapsed(), super::preparer::PLACEMENT_WAIT);
    assert_eq!(e.metric_label(), "placement_held", "{e}");
    assert!(
        e.to_string().contains(&format!("claim ns/whole ({UID_A})")),
        "{e}"
    );
    s.no_instances();
    assert!(s.p.record_of(UID_B).is_none());
    // The kubelet unprepares the whole GPU while the MIG instance's prepare waits: it goes on.
    let p = s.p.clone();
    let waiting = tokio::spawn({
        let slice = slice.clone();
        async move { p.prepare_claim(&slice).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!waiting.is_finished());
    s.gpus.set_mig(0, true); // (MIG mode switched on in between: not in this phase's scope)
    s.p.unprepare_claim(&whole).await.unwrap();
    waiting.await.unwrap().unwrap();
    assert_eq!(s.emu.all_instances().unwrap().len(), 1);
    // The other way round: a whole GPU waits for the MIG instance of its GPU.
    s.gpus.set_mig(0, false);
    let again = s.claim("again", "cccccccc-0000-0000-0000-000000000003", "gpu-0");
    let e = s.p.prepare_claim(&again).await.unwrap_err();
    assert_eq!(e.metric_label(), "placement_held", "{e}");
    assert!(
        e.to_string().contains(&format!("claim ns/slice ({UID_B})")),
        "{e}"
    );
    assert_eq!(
        s.emu.all_instances().unwrap().len(),
        1,
        "the slice is untouched"
    );
}

/// The force-delete race on a whole GPU: the new claim's prepare waits for the kubelet's
/// unprepare of the old one, then goes on.
#[tokio::test(start_paused = true)]
async fn a_whole_gpu_waits_for_the_unprepare_of_its_force_deleted_holder() {
    let s = setup(false);
    let old = s.claim("old", UID_A, "gpu-0");
    s.p.prepare_claim(&old).await.unwrap();
    s.api.delete(&old);
    let new = s.claim("new", UID_B, "gpu-0");
    let p = s.p.clone();
    let n = new.clone();
    let prepare = tokio::spawn(async move { p.prepare_claim(&n).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!prepare.is_finished(), "the new prepare waits");
    s.p.unprepare_claim(&old).await.unwrap();
    prepare.await.unwrap().unwrap();
    assert_eq!(s.spec(&new), whole_gpu_spec(UID_B, &s.gpu0));
    assert!(!s.spec_path(&old).exists());
    s.no_instances();
}

/// A restart keeps a completed whole-GPU record whatever the API server says (writing its lost
/// spec again), rolls back a half-done one (spec removed, record dropped), and leaves a MIG
/// instance on the GPU that DAS did not create alone.
#[tokio::test(start_paused = true)]
async fn start_up_keeps_a_completed_whole_gpu_and_rolls_back_a_half_done_one() {
    let s = setup(false);
    let a = s.claim("a", UID_A, "gpu-0");
    s.p.prepare_claim(&a).await.unwrap();
    let kept = s.p.record_of(UID_A).unwrap();
    s.api.delete(&a);
    std::fs::remove_file(s.spec_path(&a)).unwrap();
    let restarted = s.start();
    let report = restarted.reconcile_at_startup(false, false).await.unwrap();
    assert_eq!(report.kept, [a.to_string()], "{report:?}");
    assert!(report.missing_instances.is_empty(), "{report:?}");
    assert_eq!(report.cdi_specs_rewritten, 1, "{report:?}");
    assert_eq!(restarted.record_of(UID_A), Some(kept.clone()));
    assert_eq!(s.spec(&a), whole_gpu_spec(UID_A, &s.gpu0));
    s.no_instances();
    // A prepare that crashed after recording its start and writing its spec.
    restarted.unprepare_claim(&a).await.unwrap();
    restarted
        .checkpoint()
        .commit(|cp| cp.set_started(UID_A, "ns", "a", kept.devices.clone()))
        .await
        .unwrap();
    std::fs::create_dir_all(s.dir.path().join("cdi")).unwrap();
    std::fs::write(
        s.spec_path(&a),
        serde_json::to_vec(&whole_gpu_spec(UID_A, &s.gpu0)).unwrap(),
    )
    .unwrap();
    drop(restarted);
    let again = s.start();
    let report = again.reconcile_at_startup(false, false).await.unwrap();
    assert_eq!(report.rolled_back, [a.to_string()], "{report:?}");
    assert!(again.record_of(UID_A).is_none());
    assert!(!s.spec_path(&a).exists());
    s.no_instances();
}

/// A lost checkpoint: a claim the API server allocates a whole GPU is rebuilt only when its CDI
/// spec is still on disk (the kubelet prepared it and has not unprepared it).
#[tokio::test(start_paused = true)]
async fn a_lost_checkpoint_rebuilds_a_whole_gpu_only_from_its_spec() {
    let s = setup(false);
    let a = s.claim("a", UID_A, "gpu-0");
    s.p.prepare_claim(&a).await.unwrap();
    let record = s.p.record_of(UID_A).unwrap();
    std::fs::remove_file(s.dir.path().join("checkpoint.json")).unwrap();
    let restarted = s.start();
    let report = restarted.reconcile_at_startup(true, false).await.unwrap();
    assert_eq!(report.rebuilt, [a.to_string()], "{report:?}");
    let rebuilt = restarted.record_of(UID_A).unwrap();
    assert_eq!(rebuilt.devices, record.devices);
    assert_eq!(rebuilt.cdi_device_ids, record.cdi_device_ids);
    // Without its spec the kubelet never prepared it here (or unprepared it): no record.
    std::fs::remove_file(s.dir.path().join("checkpoint.json")).unwrap();
    std::fs::remove_file(s.spec_path(&a)).unwrap();
    drop(restarted);
    let again = s.start();
    let report = again.reconcile_at_startup(true, false).await.unwrap();
    assert!(report.rebuilt.is_empty(), "{report:?}");
    assert!(again.record_of(UID_A).is_none());
}

/// The orphan rule releases a whole GPU whose claim is gone and whose pod has no container
/// left, as it does a MIG instance: spec and record go, nothing is destroyed.
#[tokio::test(start_paused = true)]
async fn the_orphan_rule_releases_a_whole_gpu_like_a_slice() {
    let s = setup(false);
    let old = s.claim("old", UID_A, "gpu-0");
    s.p.prepare_claim(&old).await.unwrap();
    s.api.delete(&old);
    let report = s.p.reconcile_at_startup(false, false).await.unwrap();
    assert_eq!(report.kept, [old.to_string()]);
    tokio::time::advance(DEFAULT_ORPHAN_DELAY).await;
    assert_eq!(s.p.check_orphans().await.released, [UID_A]);
    assert!(s.p.record_of(UID_A).is_none() && !s.spec_path(&old).exists());
    s.no_instances();
}

/// End to end on the emulated backend (`MODEL:COUNT:mig-off`, `--whole-gpus`): one claim holds
/// GPU 1 whole and a MIG instance of GPU 0 in one request; only the MIG instance is created, the CDI spec
/// numbers the two in allocation order, a restart keeps the claim (reading GPU 1's instances:
/// none), and the unprepare destroys the MIG instance only.
#[tokio::test(start_paused = true)]
async fn on_the_emulated_backend_a_gpu_with_mig_mode_off_is_served_whole() {
    let dir = tempfile::tempdir().unwrap();
    let emu = Arc::new(
        EmulatedBackend::open(
            "A100-SXM4-40GB:1,A100-SXM4-40GB:1:mig-off",
            NODE,
            &dir.path().join("emu"),
        )
        .unwrap()
        .with_whole_gpus(true),
    );
    let gpu1 = emu.inventory().unwrap().remove(1);
    assert!(!gpu1.mig_enabled);
    let api = Arc::new(MemoryApi::default());
    let p = super::testing::preparer(dir.path(), emu.clone(), api.clone(), inline());
    let a = api.allocate(
        "ns",
        "a",
        UID_A,
        &[("gpu", "gpu-1"), ("gpu", "gpu-0-mig-1g-5gb-6")],
    );
    p.prepare_claim(&a).await.unwrap();
    let live = emu.all_instances().unwrap();
    assert_eq!(live.len(), 1);
    assert_eq!(live[0].gpu_index, 0);
    let spec = cdi::read_spec(&cdi::spec_path(&dir.path().join("cdi"), UID_A)).unwrap();
    let env: Vec<&String> = spec
        .devices
        .iter()
        .flat_map(|d| &d.container_edits.env)
        .collect();
    assert_eq!(
        env,
        [
            &format!("{}={}", cdi::gpu_uuid_env_key(UID_A, "gpu", 0), gpu1.uuid),
            &format!(
                "{}={}",
                cdi::mig_uuid_env_key(UID_A, "gpu", 1),
                live[0].mig_uuid
            ),
        ]
    );
    assert_eq!(
        spec.devices[0].container_edits.device_nodes[0].path,
        format!("/dev/nvidia{}", gpu1.minor)
    );
    drop(p);
    let restarted = super::testing::preparer(dir.path(), emu.clone(), api.clone(), inline());
    let report = restarted.reconcile_at_startup(false, false).await.unwrap();
    assert_eq!(report.kept, [a.to_string()], "{report:?}");
    assert!(
        report.unavailable_gpus.is_empty() && report.missing_instances.is_empty(),
        "{report:?}"
    );
    assert_eq!(report.cdi_specs_rewritten, 0, "{report:?}");
    restarted.unprepare_claim(&a).await.unwrap();
    assert!(emu.all_instances().unwrap().is_empty());
    assert!(restarted.record_of(UID_A).is_none());
}

/// The emulated GPU 0's time slice level, as the state file has it (0 when absent).
fn time_slice_level(s: &Setup) -> u64 {
    let path = s
        .dir
        .path()
        .join("emu")
        .join(crate::gpu::emulated::STATE_FILE);
    let state: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    state["gpus"][0]["timeSlice"].as_u64().unwrap_or(0)
}

/// Time-slicing (docs/design.md §7, "Time-slicing"): a whole GPU whose claim asks for
/// `TimeSlicing` gets its time slice set at prepare (recorded with the device), set again at
/// start-up, and back to the default at unprepare; a GPU that refuses fails the prepare with
/// `time_slice` and nothing is left.
#[tokio::test(start_paused = true)]
async fn a_time_sliced_whole_gpu_gets_its_slice_and_gives_it_back() {
    use das_api::device_config::TimeSliceInterval;
    let s = setup(false);
    let a = s.claim("a", UID_A, "gpu-0");
    let config = |interval: &str| {
        json!({"apiVersion": "mig.das.com/v1alpha1", "kind": "MigDeviceConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicing": {"interval": interval}}})
    };
    s.api.configure(&a, config("Short"));
    s.p.prepare_claim(&a).await.unwrap();
    s.no_instances();
    let record = s.p.record_of(UID_A).unwrap();
    assert_eq!(record.devices[0].time_slice, Some(TimeSliceInterval::Short));
    assert_eq!(time_slice_level(&s), 1);
    assert_eq!(
        s.spec(&a),
        whole_gpu_spec(UID_A, &s.gpu0),
        "nothing in the spec"
    );
    // A GPU reset (level lost) and a restart: start-up sets it again.
    s.emu.set_time_slice(0, TimeSliceInterval::Default).unwrap();
    let restarted = s.start();
    restarted.reconcile_at_startup(false, false).await.unwrap();
    assert_eq!(time_slice_level(&s), 1);
    restarted.unprepare_claim(&a).await.unwrap();
    assert_eq!(time_slice_level(&s), 0, "back to the driver's default");

    // A GPU that refuses (as `nvidia-smi compute-policy` may): the prepare fails, rolled back.
    let control = s
        .dir
        .path()
        .join("emu")
        .join(crate::gpu::emulated::CONTROL_FILE);
    std::fs::write(
        &control,
        r#"{"setTimeSliceFaults": [{"gpu": 0, "count": 1, "kind": "NotSupported"}]}"#,
    )
    .unwrap();
    let b = s.claim("b", UID_B, "gpu-0");
    s.api.configure(&b, config("Long"));
    let e = restarted.prepare_claim(&b).await.unwrap_err();
    assert_eq!(e.metric_label(), "time_slice", "{e}");
    assert!(
        e.to_string()
            .starts_with("device gpu-0: GPU 0's time slice could not be set: "),
        "{e}"
    );
    assert!(restarted.record_of(UID_B).is_none() && !s.spec_path(&b).exists());
    assert_eq!(time_slice_level(&s), 0);
    // The kubelet's retry gets it.
    restarted.prepare_claim(&b).await.unwrap();
    assert_eq!(time_slice_level(&s), 3);
    // Time-slicing a MIG slice is the claim's mistake, said before anything is done.
    let c = s.claim(
        "c",
        "cccccccc-0000-0000-0000-000000000003",
        "gpu-1-mig-1g-5gb-0",
    );
    s.api.configure(&c, config("Short"));
    let e = restarted.prepare_claim(&c).await.unwrap_err();
    assert_eq!(e.metric_label(), "invalid_config", "{e}");
    assert!(e.to_string().contains("applies to whole GPUs only"), "{e}");
}
