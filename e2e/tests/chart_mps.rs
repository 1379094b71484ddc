//! The Helm chart's MPS values (docs/design.md §7, "MPS on a slice"), rendered without a
//! cluster: the node plugin gets `DAS_MPS_SHM_SIZE` (8Gi by default), `DAS_MPS_PIPE_MOUNT`
//! (`ro`) and `DAS_MPS_PROTOCOL` (`auto`); where it mounts the tmpfs it is privileged and its
//! state dir is mounted with `mountPropagation: Bidirectional` (else the tmpfs would not reach
//! the host, where the container runtime binds it into the MPS clients); with emulated GPUs it
//! stays unprivileged with plain directories unless `mps.shmOnEmulatedGpus`; bad values are
//! refused with what is valid. With `mps.host.enabled` the DaemonSet `das-mps-host` runs the
//! daemons (docs/design.md §7, "Who runs the daemons"): `mps-host` of the same image on the
//! plugin's nodes, `OnDelete`, hostPID, the state dir and driver files as the plugin mounts
//! them, no API token; the plugin gets `DAS_MPS_HOST_SOCKET` and hostPID.

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

/// The volume mount `name` of `container`.
fn mount<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    container["volumeMounts"]
        .as_array()?
        .iter()
        .find(|m| m["name"] == name)
}

#[test]
fn the_mps_host_runs_the_daemons_only_when_enabled() {
    let r = Rendered::new(&RenderOptions::default()).unwrap();
    assert!(
        r.find("DaemonSet", "das-mps-host").is_none(),
        "off by default"
    );
    let plugin_ds = r.get("DaemonSet", "das-kubelet-plugin").unwrap();
    assert!(
        plugin_ds["spec"]["template"]["spec"]
            .get("hostPID")
            .is_none()
    );
    let p = r.container("DaemonSet", "das-kubelet-plugin").unwrap();
    assert_eq!(env_of(p, "DAS_MPS_HOST_SOCKET"), None);

    let opts = RenderOptions::default().set("mps.host.enabled=true");
    chart::lint(&opts).unwrap_or_else(|e| panic!("helm lint: {e:#}"));
    let r = Rendered::new(&opts).unwrap();
    let ds = r.get("DaemonSet", "das-mps-host").unwrap();
    assert_eq!(ds["spec"]["updateStrategy"]["type"], "OnDelete");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true);
    assert_eq!(pod["automountServiceAccountToken"], false);
    let plugin_pod = &r.get("DaemonSet", "das-kubelet-plugin").unwrap()["spec"]["template"]["spec"];
    assert_eq!(plugin_pod["hostPID"], true);
    for same in [
        "nodeSelector",
        "tolerations",
        "runtimeClassName",
        "priorityClassName",
    ] {
        assert_eq!(pod[same], plugin_pod[same], "{same}");
    }
    let h = r.container("DaemonSet", "das-mps-host").unwrap();
    let p = r.container("DaemonSet", "das-kubelet-plugin").unwrap();
    assert_eq!(
        h["command"],
        serde_json::json!(["das-kubelet-plugin", "mps-host"])
    );
    assert_eq!(h["image"], p["image"]);
    assert_eq!(env_of(h, "DAS_STATE_DIR").as_deref(), Some("/var/lib/das"));
    assert_eq!(
        env_of(p, "DAS_MPS_HOST_SOCKET").as_deref(),
        Some("/var/lib/das/mps/host.sock")
    );
    assert_eq!(h["securityContext"]["privileged"], true);
    let state = mount(h, "state").unwrap();
    assert_eq!(state["mountPath"], "/var/lib/das");
    assert_eq!(
        state["mountPropagation"], "HostToContainer",
        "sees the plugin's tmpfs"
    );
    assert_eq!(mount(h, "driver-root"), mount(p, "driver-root"));
    assert_eq!(h["resources"]["limits"]["memory"], "1Gi");

    // Emulated GPUs: as unprivileged as the plugin, no driver files.
    let r = Rendered::new(&emulated().set("mps.host.enabled=true")).unwrap();
    let h = r.container("DaemonSet", "das-mps-host").unwrap();
    assert_eq!(h["securityContext"]["privileged"], false);
    assert!(mount(h, "driver-root").is_none());
    assert!(mount(h, "state").unwrap().get("mountPropagation").is_none());
}

#[test]
fn bad_mps_host_values_are_refused() {
    let e = chart::render_yaml(&RenderOptions::default().set("mps.host.enabled=yes"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("/mps/host/enabled"), "{e}");
    let e = chart::render_yaml(&RenderOptions::default().set("mps.host.image=x"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("image"), "{e}");
}
