//! The real-runtime node: the upstream kubelet (from the same `e2e/k8s` build as the control
//! plane) with containerd v2 as its CRI runtime, runc, CNI bridge networking and CDI on. Our
//! CDI specs are read by a runtime we did not write and containers really run.
//!
//! Built by `make containerd` (e2e/containerd: containerd, its runc shim, `ctr`, the CNI plugins
//! bridge, host-local, loopback and portmap, and the two programs of the test images); runc
//! comes from Debian's package. Everything a node keeps lives below its directory
//! ([`RuntimeFiles`]): containerd's root and state, runc's state, the network namespaces, the
//! CNI address store, the kubelet root, pod logs, the CDI specs and the stand-in device nodes.
//! [`teardown`] removes containers, shims, mounts and the bridge, so a stopped cluster leaves
//! nothing running and its directory can be deleted.
//!
//! Why the kubelet is configured as it is (see [`kubelet_config`]): this machine has cgroup v1,
//! which kubelet ≥ 1.35 refuses unless `failCgroupV1: false`; and the sandbox's root lacks
//! CAP_SYS_RESOURCE, so neither the kubelet nor runc may lower an `oom_score_adj`
//! (containerd's `restrict_oom_score_adj` keeps the kubelet's -998 for sandboxes from failing
//! every pod).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

pub use crate::binaries::containerd_bin_dir as binaries_dir;
use crate::container_view::ContainerView;
use crate::workload::free_port;

mod config;
mod teardown;

pub use config::{cni_config, containerd_config, kubelet_config, write_configs};
pub use teardown::{kill_mps_stand_ins, teardown, unmount_below};

/// The images every real-runtime node has (imported at start; pods use `imagePullPolicy: Never`).
pub const PROBE_IMAGE: &str = "das.local/probe:1";
/// The pod sandbox image (containerd's pinned `sandbox` image).
pub const PAUSE_IMAGE: &str = "das.local/pause:1";
/// Key of the NoSchedule taint a real-runtime node registers with: only pods that tolerate it
/// (whose images are the local ones) land there, never a pod meant for hollow nodes whose image
/// no registry here serves.
pub const TAINT_KEY: &str = "das.local/real-runtime";
/// The runc binary containerd runs (Debian's `runc` package).
pub const RUNC: &str = "/usr/sbin/runc";

/// Why this machine cannot run a real-runtime node, or `Ok` when it can: root (containers,
/// mknod, network namespaces), runc, and the binaries of `make containerd`.
pub fn preflight() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "a real-runtime node needs root (containerd, runc, network namespaces, mknod); run as root or use hollow nodes only"
        );
    }
    if !Path::new(RUNC).exists() {
        bail!("{RUNC} not found: install Debian's runc package (`apt-get install runc`)");
    }
    let bin = binaries_dir();
    for b in [
        "containerd",
        "containerd-shim-runc-v2",
        "ctr",
        "bridge",
        "host-local",
        "loopback",
        "probe",
        "ociimage",
    ] {
        if !bin.join(b).exists() {
            bail!("{} not found: run `make containerd`", bin.join(b).display());
        }
    }
    Ok(())
}

/// The files of one real-runtime node, below its directory.
#[derive(Clone, Debug)]
pub struct RuntimeFiles {
    /// The node's directory (also the kubelet's root dir).
    pub root: PathBuf,
}

impl RuntimeFiles {
    pub fn containerd_dir(&self) -> PathBuf {
        self.root.join("containerd")
    }
    /// containerd's CRI socket.
    pub fn socket(&self) -> PathBuf {
        self.containerd_dir().join("c.sock")
    }
    pub fn containerd_config(&self) -> PathBuf {
        self.containerd_dir().join("config.toml")
    }
    /// runc's state as configured in containerd (the shim's `Root` option).
    pub fn runc_root(&self) -> PathBuf {
        self.containerd_dir().join("runc")
    }
    /// The `runc --root` of the kubelet's containers: the shim adds the containerd namespace
    /// (`k8s.io`) to [`RuntimeFiles::runc_root`]. Only this node's containers are listed there.
    pub fn runc_containers(&self) -> PathBuf {
        self.runc_root().join("k8s.io")
    }
    pub fn cni_conf_dir(&self) -> PathBuf {
        self.containerd_dir().join("cni")
    }
    /// The CDI directory containerd reads; the DAS plugin of the node writes there (the same
    /// path as `das::PluginDirs::cdi`).
    pub fn cdi_dir(&self) -> PathBuf {
        self.root.join("cdi")
    }
    /// Stand-in device nodes of the emulated GPUs (`--emulated-device-dir`).
    pub fn device_dir(&self) -> PathBuf {
        self.root.join("dev")
    }
    pub fn pod_logs_dir(&self) -> PathBuf {
        self.root.join("pod-logs")
    }
    pub fn kubelet_config(&self) -> PathBuf {
        self.root.join("kubelet.yaml")
    }
    fn images_dir(&self) -> PathBuf {
        self.containerd_dir().join("images")
    }
}

/// The bridge and pod subnet of a node: unique per node directory, so two clusters on one
/// machine (parallel tests) never share a bridge, an address range or a route.
pub fn network_of(root: &Path) -> (String, String) {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new(); // fixed keys: the same path, the same net
    root.hash(&mut hasher);
    let h = hasher.finish();
    let bridge = format!("das{:06x}", h & 0xff_ffff); // at most 15 bytes (IFNAMSIZ)
    let subnet = format!("10.{}.{}.0/24", 200 + (h >> 24) % 50, (h >> 32) % 256);
    (bridge, subnet)
}

/// Builds the probe and pause images (no registry: [`PROBE_IMAGE`], [`PAUSE_IMAGE`]) and imports
/// them into containerd's `k8s.io` namespace, where the kubelet's CRI looks.
pub fn import_images(files: &RuntimeFiles) -> Result<()> {
    let bin = binaries_dir();
    let probe = bin.join("probe");
    for (name, entry, file) in [
        (PROBE_IMAGE, "/probe", "probe.tar"),
        (PAUSE_IMAGE, "/pause", "pause.tar"),
    ] {
        let out = files.images_dir().join(file);
        run(Command::new(bin.join("ociimage")).args([
            "--name",
            name,
            "--entrypoint",
            entry,
            "--file",
            &format!("{}:{entry}:0755", probe.display()),
            "--out",
            &out.display().to_string(),
        ]))?;
        run(ctr(files).args(["images", "import", &out.display().to_string()]))?;
    }
    Ok(())
}

/// `ctr` against the node's containerd, in the CRI namespace.
pub fn ctr(files: &RuntimeFiles) -> Command {
    let mut cmd = Command::new(binaries_dir().join("ctr"));
    cmd.args(["--address", &files.socket().display().to_string()])
        .args(["--namespace", "k8s.io"]);
    cmd
}

/// Waits until containerd answers on its socket.
pub fn wait_containerd(files: &RuntimeFiles, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let out = ctr(files).arg("version").output()?;
        if out.status.success() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "containerd did not answer on {} within {timeout:?}: {}",
                files.socket().display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The host pid of a running container (`runc state`), from the CRI container ID
/// (`containerd://<id>` in a pod's container status, with or without the scheme).
pub fn container_pid(files: &RuntimeFiles, container_id: &str) -> Result<i32> {
    let id = container_id.trim_start_matches("containerd://");
    let out = run(Command::new(RUNC).args([
        "--root",
        &files.runc_containers().display().to_string(),
        "state",
        id,
    ]))?;
    let state: serde_json::Value = serde_json::from_str(&out)?;
    state["pid"]
        .as_i64()
        .filter(|p| *p > 0)
        .map(|p| p as i32)
        .with_context(|| format!("runc state of {id} has no pid: {out}"))
}

/// What the probe of a container reported (`das-probe:` lines of its log, see
/// e2e/containerd/probe): its DAS, NVIDIA and CUDA variables, its character devices, the
/// files below `/usr/local/nvidia` with their first lines, and with MPS what a client could do.
pub fn probe_view(log: &str) -> Result<ContainerView> {
    let mut view = ContainerView::default();
    let mut ready = false;
    for line in log.lines() {
        let Some(fact) = line.strip_prefix("das-probe: ") else {
            continue;
        };
        if let Some(kv) = fact.strip_prefix("env ") {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            view.env.insert(k.to_string(), v.to_string());
        } else if let Some(dev) = fact.strip_prefix("dev ") {
            view.device_nodes
                .push(dev.split(' ').next().unwrap_or_default().to_string());
        } else if let Some(file) = fact.strip_prefix("file ") {
            let (path, line) = file.split_once(' ').unwrap_or((file, ""));
            view.files.insert(path.to_string(), line.to_string());
        } else if let Some(mps) = fact.strip_prefix("mps ") {
            let (what, value) = mps.split_once(' ').unwrap_or((mps, ""));
            view.mps.insert(what.to_string(), value.to_string());
        } else if fact == "ready" {
            ready = true;
        }
    }
    if !ready {
        bail!("the probe's report is incomplete (no `das-probe: ready` line):\n{log}");
    }
    Ok(view)
}

/// Runs `cmd`; its stdout, or an error with its arguments, status and stderr.
pub fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("run {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{:?} {:?} failed ({}): {}",
            cmd.get_program(),
            cmd.get_args().collect::<Vec<_>>(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// This machine's address on its default route: the API server advertises it for the
/// Service network (pods reach it through the bridge's gateway, routed by the host). Found by
/// connecting a UDP socket, which sends nothing.
pub fn host_ip() -> Result<std::net::IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0")?;
    socket
        .connect("192.0.2.255:9")
        .or_else(|_| socket.connect("10.255.255.255:9"))
        .context("no route from this machine: the Service network needs a non-loopback address")?;
    let ip = socket.local_addr()?.ip();
    if ip.is_loopback() || ip.is_unspecified() {
        bail!("this machine's only address is {ip}: pods cannot reach the API server");
    }
    Ok(ip)
}

/// kube-proxy's flags: iptables mode as the proxy of `node`; it leaves the machine's conntrack
/// limits and timeouts alone, and its health and metrics servers on free loopback ports.
pub fn kube_proxy_args(kubeconfig: &Path, node: &str) -> Vec<String> {
    vec![
        "kube-proxy".into(),
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--hostname-override={node}"),
        "--proxy-mode=iptables".into(),
        "--conntrack-max-per-core=0".into(),
        "--conntrack-tcp-timeout-established=0".into(),
        "--conntrack-tcp-timeout-close-wait=0".into(),
        format!("--healthz-bind-address=127.0.0.1:{}", free_port()),
        format!("--metrics-bind-address=127.0.0.1:{}", free_port()),
        "--v=2".into(),
    ]
}

/// Removes kube-proxy's iptables rules (`kube-proxy --cleanup`); failures are printed, not
/// returned (teardown goes on).
pub fn cleanup_service_network(k8s_bin: &Path) {
    match Command::new(k8s_bin)
        .args(["kube-proxy", "--cleanup", "--proxy-mode=iptables"])
        .output()
    {
        Ok(out) if out.status.success() => {}
        Ok(out) => eprintln!(
            "kube-proxy --cleanup: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => eprintln!("kube-proxy --cleanup: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_differ_per_node_directory_and_fit_linux_names() {
        let (b1, s1) = network_of(Path::new("/tmp/das-0001/n/r0"));
        let (b2, s2) = network_of(Path::new("/tmp/das-0002/n/r0"));
        assert_ne!((&b1, &s1), (&b2, &s2));
        assert!(b1.len() <= 15, "{b1}");
        assert!(s1.starts_with("10.") && s1.ends_with(".0/24"), "{s1}");
    }

    #[test]
    fn the_probe_report_is_read_back() {
        let log = "das-probe: start pid=1 hostname=p\n\
                   das-probe: env DAS_MIG_UUID_a_mig_0=MIG-1\n\
                   das-probe: env NVIDIA_VISIBLE_DEVICES=void\n\
                   das-probe: dev /dev/nvidia0 c 195:0\n\
                   das-probe: file /usr/local/nvidia/lib64/libcuda.so.1 stand-in x (NVIDIA driver 1.2.3)\n\
                   das-probe: ready\n";
        let view = probe_view(log).unwrap();
        assert_eq!(view.mig_uuids(), ["MIG-1"]);
        assert_eq!(view.env["NVIDIA_VISIBLE_DEVICES"], "void");
        assert_eq!(view.device_nodes, ["/dev/nvidia0"]);
        assert_eq!(
            view.files["/usr/local/nvidia/lib64/libcuda.so.1"],
            "stand-in x (NVIDIA driver 1.2.3)"
        );
        assert!(probe_view("das-probe: start pid=1\n").is_err());
    }
}
