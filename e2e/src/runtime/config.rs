//! The configuration files of a real-runtime node: containerd's, the CNI network's and the
//! kubelet's (why the kubelet is configured as it is: see [`kubelet_config`]).

use std::path::Path;

use anyhow::{Context, Result};

use super::{PAUSE_IMAGE, RUNC, RuntimeFiles, TAINT_KEY, binaries_dir, network_of};

/// containerd's configuration (config version 3, containerd v2): CRI with CDI from
/// [`RuntimeFiles::cdi_dir`], runc from Debian with per-node state, the CNI bridge, network
/// namespaces under the state dir, the local pause image.
pub fn containerd_config(files: &RuntimeFiles) -> String {
    let d = files.containerd_dir();
    let bin = binaries_dir();
    format!(
        r#"version = 3
root = "{root}"
state = "{state}"

[grpc]
  address = "{socket}"

[plugins."io.containerd.cri.v1.runtime"]
  enable_cdi = true
  cdi_spec_dirs = ["{cdi}"]
  # root here lacks CAP_SYS_RESOURCE: runc may not lower oom_score_adj below containerd's own.
  restrict_oom_score_adj = true
  # Network namespaces below the state dir, so teardown finds every one of this node's.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
      BinaryName = "{runc}"
      Root = "{runc_root}"
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{bin}"]
    conf_dir = "{cni}"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{pause}"
"#,
        root = d.join("root").display(),
        state = d.join("state").display(),
        socket = files.socket().display(),
        cdi = files.cdi_dir().display(),
        runc = RUNC,
        runc_root = files.runc_root().display(),
        bin = bin.display(),
        cni = files.cni_conf_dir().display(),
        pause = PAUSE_IMAGE,
    )
}

/// The CNI network of a node: a bridge with host-local addresses (stored below the node's
/// directory), loopback, and portmap for `hostPort`s.
pub fn cni_config(files: &RuntimeFiles) -> String {
    let (bridge, subnet) = network_of(&files.root);
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "das-e2e",
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "dataDir": files.containerd_dir().join("ipam").display().to_string(),
                    "ranges": [[{"subnet": subnet}]],
                    "routes": [{"dst": "0.0.0.0/0"}]
                }
            },
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    })
    .to_string()
}

/// The kubelet's configuration for the real-runtime node.
///
/// - `failCgroupV1: false`: this machine has cgroup v1 (kubelet ≥ 1.35 refuses it otherwise);
///   `cgroupsPerQOS: false` and no node-allocatable enforcement: the kubelet creates no cgroup
///   hierarchy of its own (containerd and runc still put each container in a cgroup).
/// - no hard eviction and no image garbage collection: the local images cannot be pulled again
///   and a full CI disk must not evict test pods.
/// - x509 client certificates of the cluster CA and webhook authorization: the API server's
///   `kubectl logs`/`exec` requests come with its kubelet-client certificate.
/// - `port`: the kubelet's HTTPS server on all addresses (the API server dials the node's
///   InternalIP); no read-only or healthz port, no DNS.
/// - registered with the [`TAINT_KEY`] taint.
pub fn kubelet_config(files: &RuntimeFiles, ca: &Path, port: u16) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://{socket}
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
address: 0.0.0.0
port: {port}
readOnlyPort: 0
healthzPort: 0
staticPodPath: ""
podLogsDir: {logs}
resolvConf: ""
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: Webhook}}
evictionHard: {{}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
syncFrequency: 5s
nodeStatusUpdateFrequency: 5s
registerWithTaints:
- {{key: {taint}, value: "true", effect: NoSchedule}}
"#,
        taint = TAINT_KEY,
        socket = files.socket().display(),
        logs = files.pod_logs_dir().display(),
        ca = ca.display(),
    )
}

/// Writes containerd's and the CNI configuration of a node.
pub fn write_configs(files: &RuntimeFiles) -> Result<()> {
    for d in [
        files.containerd_dir(),
        files.cni_conf_dir(),
        files.cdi_dir(),
        files.images_dir(),
    ] {
        std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
    }
    std::fs::write(files.containerd_config(), containerd_config(files))?;
    std::fs::write(
        files.cni_conf_dir().join("10-das-e2e.conflist"),
        cni_config(files),
    )?;
    Ok(())
}
