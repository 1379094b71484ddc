//! The Helm chart's MPS values (docs/design.md §7, "MPS on a slice"), rendered without a
//! cluster: the node plugin gets `DAS_MPS_SHM_SIZE` (8Gi by default), `DAS_MPS_PIPE_MOUNT`
//! (`ro`) and `DAS_MPS_PROTOCOL` (`auto`); where it mounts the tmpfs it is privileged and its
//! state dir is mounted with `mountPropagation: Bidirectional` (else the tmpfs would not reach
//! the host, where the container runtime binds it into the MPS clients); with emulated GPUs it
//! stays unprivileged with plain directories unless `mps.shmOnEmulatedGpus`; bad values are
//! refused with what is valid.

use das_e2e::chart::{self, RenderOptions, Rendered, env_of};
use serde_json::Value;

fn plugin(opts: &RenderOptions) -> Value {
    let r = Rendered::new(opts).unwrap_or_else(|e| panic!("render: {e:#}"));
    r.container("DaemonSet", "das-kubelet-plugin")
        .unwrap()
        .clone()
}

/// The propagation of the plugin's state-dir mount, if any.
fn state_propagation(plugin: &Value) -> Option<String> {
    plugin["volumeMounts"]
        .as_array()?
        .iter()
        .find(|m| m["name"] == "state")?
        .get("mountPropagation")
        .and_then(Value::as_str)
        .map(str::to_string)
}

fn emulated() -> RenderOptions {
    RenderOptions::with_values(chart::ci_values("emulated-values.yaml"))
}

#[test]
fn gpu_nodes_get_an_8gi_tmpfs_a_read_only_pipe_and_a_bidirectional_state_dir() {
    let p = plugin(&RenderOptions::default());
    assert_eq!(env_of(&p, "DAS_MPS_SHM_SIZE").as_deref(), Some("8Gi"));
    assert_eq!(env_of(&p, "DAS_MPS_PIPE_MOUNT").as_deref(), Some("ro"));
    assert_eq!(env_of(&p, "DAS_MPS_PROTOCOL").as_deref(), Some("auto"));
    assert_eq!(p["securityContext"]["privileged"], true);
    assert_eq!(state_propagation(&p).as_deref(), Some("Bidirectional"));

    let opts = RenderOptions::default()
        .set("mps.shmSize=512Mi")
        .set("mps.pipeMount=rw")
        .set("mps.protocol=3");
    chart::lint(&opts).unwrap_or_else(|e| panic!("helm lint: {e:#}"));
    let p = plugin(&opts);
    assert_eq!(env_of(&p, "DAS_MPS_SHM_SIZE").as_deref(), Some("512Mi"));
    assert_eq!(env_of(&p, "DAS_MPS_PIPE_MOUNT").as_deref(), Some("rw"));
    assert_eq!(env_of(&p, "DAS_MPS_PROTOCOL").as_deref(), Some("3"));

    // "0": plain directories, nothing to propagate.
    let p = plugin(&RenderOptions::default().set("mps.shmSize=0"));
    assert_eq!(env_of(&p, "DAS_MPS_SHM_SIZE").as_deref(), Some("0"));
    assert_eq!(state_propagation(&p), None);
}

#[test]
fn emulated_gpus_stay_unprivileged_with_plain_directories_unless_asked() {
    let p = plugin(&emulated());
    assert_eq!(env_of(&p, "DAS_MPS_SHM_SIZE").as_deref(), Some("0"));
    assert_eq!(p["securityContext"]["privileged"], false);
    assert_eq!(state_propagation(&p), None);

    let opts = emulated()
        .set("mps.shmOnEmulatedGpus=true")
        .set("mps.shmSize=64Mi");
    let p = plugin(&opts);
    assert_eq!(env_of(&p, "DAS_MPS_SHM_SIZE").as_deref(), Some("64Mi"));
    assert_eq!(p["securityContext"]["privileged"], true);
    assert!(p["securityContext"].get("capabilities").is_none());
    assert_eq!(state_propagation(&p).as_deref(), Some("Bidirectional"));
}

#[test]
fn bad_mps_values_are_refused_with_what_is_valid() {
    let err = |set: &str| {
        chart::render_yaml(&RenderOptions::default().set(set))
            .unwrap_err()
            .to_string()
    };
    let e = err("mps.pipeMount=readonly");
    assert!(
        e.contains("/mps/pipeMount") && e.contains("'ro', 'rw'"),
        "{e}"
    );
    let e = err("mps.protocol=4");
    assert!(e.contains("/mps/protocol"), "{e}");
    let e = err("mps.protocol=v3");
    assert!(e.contains("/mps/protocol") && e.contains("auto|2|3"), "{e}");
    let e = err("mps.shmSize=lots");
    assert!(e.contains("/mps/shmSize"), "{e}");
}
