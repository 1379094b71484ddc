//! A real Kubernetes control plane plus hollow DRA kubelets, all on loopback.
//!
//! Start order: PKI → etcd → kube-apiserver
//! (wait `/readyz`) → kube-controller-manager + kube-scheduler (wait for the `default`
//! ServiceAccount, which proves the controller manager works) → one `dra-kubelet` per node (wait
//! `Ready`). Every component is the upstream code from the `e2e/k8s` multi-call binary.
//!
//! Nodes come in two kinds ([`NodeKind`]): hollow (a `dra-kubelet` with a fake runtime: cheap,
//! many per machine) and real-runtime (the upstream `kubelet` with containerd and runc, see
//! [`crate::runtime`]: containers really run, at most a few per machine, root only).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use kube::Client;
use serde::{Deserialize, Serialize};

// The Kubernetes build and the repository root, re-exported from the modules that own them
// (the tests name them here).
pub use crate::binaries::{KUBERNETES_VERSION, k8s_binary, k8s_minor_version, k8s_version};
pub use crate::paths::workspace_root;
use crate::process::{self, Lifetime, Process};
use crate::runtime;

mod args;
mod start;

/// What to start.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Node names; one hollow DRA kubelet each.
    pub nodes: Vec<String>,
    /// Names of real-runtime nodes (kubelet + containerd), started after the hollow ones.
    pub runtime_nodes: Vec<String>,
    /// Where PKI, etcd data, kubelet root dirs and logs go. `None`: a fresh short directory
    /// under the system temp dir (removed on success unless `DAS_E2E_KEEP=1`).
    pub dir: Option<PathBuf>,
    pub lifetime: Lifetime,
    /// The multi-call Kubernetes binary; default [`k8s_binary`].
    pub k8s_bin: PathBuf,
    /// A Service network for the real-runtime nodes' pods ([`runtime::host_ip`]): the API
    /// server listens on every address and advertises this machine's address (so the
    /// `kubernetes` Service has an endpoint pods can reach), and kube-proxy (iptables mode)
    /// routes ClusterIPs, for pods and for the API server's webhook calls. kube-proxy owns the
    /// machine's KUBE-* iptables chains: one such cluster per machine at a time.
    pub service_network: bool,
    /// The `profiles` of a KubeSchedulerConfiguration (`kubescheduler.config.k8s.io/v1`, a
    /// JSON list) for kube-scheduler; `None`: its defaults. The harness adds the client
    /// connection and turns leader election off, as its flags do without a config.
    pub scheduler_profiles: Option<serde_json::Value>,
    /// Feature gates (`Name=true|false`) for the control plane beyond those the Kubernetes
    /// version needs, e.g. `DRAResourceClaimGranularStatusAuthorization=false` to show what a
    /// 1.36+ server checks itself as a 1.34 or 1.35 server would leave it.
    pub feature_gates: Vec<String>,
}

impl ClusterConfig {
    /// A cluster with the given nodes, tied to this test.
    pub fn with_nodes(nodes: &[&str]) -> Self {
        Self {
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            runtime_nodes: Vec::new(),
            dir: None,
            lifetime: Lifetime::TiedToParent,
            k8s_bin: k8s_binary(),
            service_network: false,
            scheduler_profiles: None,
            feature_gates: Vec::new(),
        }
    }
}

/// Which kubelet a node runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NodeKind {
    /// `dra-kubelet`: the real kubelet DRA manager with a fake container runtime.
    #[default]
    Hollow,
    /// The upstream kubelet with containerd and runc ([`crate::runtime`]).
    Runtime,
}

/// A node of the cluster and where its kubelet keeps its files.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeInfo {
    pub name: String,
    /// Kubelet root dir: `plugins_registry/` and `plugins/` live below it.
    pub root_dir: PathBuf,
    #[serde(default)]
    pub kind: NodeKind,
}

impl NodeInfo {
    /// The containerd, CNI, CDI and device-node files of a real-runtime node.
    pub fn runtime_files(&self) -> Option<runtime::RuntimeFiles> {
        (self.kind == NodeKind::Runtime).then(|| runtime::RuntimeFiles {
            root: self.root_dir.clone(),
        })
    }
    /// The kubelet's plugin registration directory.
    pub fn registry_dir(&self) -> PathBuf {
        self.root_dir.join("plugins_registry")
    }
    /// The kubelet's plugins directory (DRA sockets live in `<plugins>/<driver>/`).
    pub fn plugins_dir(&self) -> PathBuf {
        self.root_dir.join("plugins")
    }
    /// CDI device IDs the kubelet passed for each container (see `e2e/k8s/drakubelet.go`;
    /// hollow nodes only).
    pub fn cdi_records_dir(&self) -> PathBuf {
        self.root_dir.join("cdi-devices")
    }
}

/// What `das-cluster down` needs to stop a detached cluster.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClusterState {
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub nodes: Vec<NodeInfo>,
    pub pids: Vec<u32>,
    /// kube-proxy ran ([`ClusterConfig::service_network`]): its iptables rules go at `down`.
    #[serde(default)]
    pub service_network: bool,
}

/// A running cluster. Dropping it stops every component (and, if the thread is panicking,
/// prints the tail of each component's log and keeps the directory).
pub struct Cluster {
    pub dir: PathBuf,
    /// Admin kubeconfig (group `system:masters`).
    pub kubeconfig: PathBuf,
    pub nodes: Vec<NodeInfo>,
    pub pki_dir: PathBuf,
    client: Option<Client>,
    processes: Vec<Process>,
    remove_dir_on_drop: bool,
    lifetime: Lifetime,
    timings: Vec<(String, Duration)>,
    /// The Kubernetes binary whose kube-proxy ran, when [`ClusterConfig::service_network`].
    service_network: Option<PathBuf>,
}

impl Cluster {
    /// Starts another component (e.g. the DAS node plugin) as part of the cluster: same log
    /// folder, same teardown. `name` must be unique among running components.
    pub fn spawn_program(&mut self, name: &str, program: &Path, args: Vec<String>) -> Result<()> {
        self.spawn_program_with_env(name, program, args, &[])
    }

    /// [`Cluster::spawn_program`] with extra environment variables (on top of this process's).
    pub fn spawn_program_with_env(
        &mut self,
        name: &str,
        program: &Path,
        args: Vec<String>,
        env: &[(String, String)],
    ) -> Result<()> {
        if self.processes.iter().any(|p| p.name == name) {
            bail!("a component named {name} already runs");
        }
        let log = self.dir.join("logs").join(format!("{name}.log"));
        let p = Process::spawn(name, program, &args, env, &log, self.lifetime)?;
        self.processes.push(p);
        Ok(())
    }

    /// Stops component `name`: gracefully (SIGTERM, then SIGKILL after 10 s) or abruptly
    /// (SIGKILL at once, as a crash would).
    pub fn stop_component(&mut self, name: &str, graceful: bool) -> Result<()> {
        let i = self
            .processes
            .iter()
            .position(|p| p.name == name)
            .with_context(|| format!("no component {name}"))?;
        let mut p = self.processes.remove(i);
        if graceful {
            p.stop(Duration::from_secs(10));
        } else {
            p.kill();
        }
        Ok(())
    }

    /// Kills component `name` at once (SIGKILL, a crash) and starts it again with the same
    /// arguments and environment, as the kubelet restarts a crashed container.
    pub fn crash_and_restart(&mut self, name: &str) -> Result<()> {
        let i = self
            .processes
            .iter()
            .position(|p| p.name == name)
            .with_context(|| format!("no component {name}"))?;
        self.processes[i].kill();
        let again = self.processes[i].respawn()?;
        self.processes[i] = again;
        Ok(())
    }

    /// Names of the running components.
    pub fn component_names(&self) -> Vec<String> {
        self.processes.iter().map(|p| p.name.clone()).collect()
    }

    /// The log file of component `name`.
    pub fn log_of(&self, name: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{name}.log"))
    }

    /// Milestones of the start, measured from its beginning.
    pub fn timings(&self) -> &[(String, Duration)] {
        &self.timings
    }

    /// An admin client.
    pub fn client(&self) -> Client {
        self.client
            .clone()
            .expect("the client exists once kube-apiserver started")
    }

    /// The node named `name`.
    pub fn node(&self, name: &str) -> &NodeInfo {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// Fails if a component has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        for p in &mut self.processes {
            if let Some(status) = p.exited() {
                bail!(
                    "{} exited ({status}); last lines:\n{}",
                    p.name,
                    p.log_tail(30)
                );
            }
        }
        Ok(())
    }

    /// Process ids of the running components.
    pub fn pids(&self) -> Vec<u32> {
        self.processes.iter().map(Process::pid).collect()
    }

    /// Ends a test: on `Err`, panics while the cluster still runs, so [`Drop`] prints every
    /// component's log tail and keeps the cluster directory for inspection.
    pub fn check(&self, result: Result<()>) {
        if let Err(e) = result {
            panic!("{e:?}");
        }
    }

    /// Prints the last `n` lines of every component's log to stderr.
    pub fn print_log_tails(&self, n: usize) {
        for p in &self.processes {
            eprintln!(
                "===== {} ({}) =====\n{}",
                p.name,
                p.log.display(),
                p.log_tail(n)
            );
        }
    }

    /// Leaves the components running (for `make cluster-up`) and returns what stops them.
    pub fn detach(mut self) -> ClusterState {
        let state = ClusterState {
            dir: self.dir.clone(),
            kubeconfig: self.kubeconfig.clone(),
            nodes: self.nodes.clone(),
            pids: self.processes.iter().map(Process::pid).collect(),
            // Its rules stay while the detached kube-proxy runs.
            service_network: self.service_network.take().is_some(),
        };
        // Forgetting a Child neither kills nor waits for it.
        for p in std::mem::take(&mut self.processes) {
            std::mem::forget(p);
        }
        // Nor may the drop tear down the real-runtime nodes' containers: they run on.
        self.nodes.clear();
        self.remove_dir_on_drop = false;
        state
    }

    /// Stops every component, last started first, then removes what real-runtime nodes left
    /// (containers, shims, mounts, bridges).
    pub fn stop(&mut self) {
        for p in self.processes.iter_mut().rev() {
            p.stop(Duration::from_secs(5));
        }
        self.processes.clear();
        // The plugins' MPS daemons, which outlive them (before the unmounts: they are found by
        // their working directory).
        runtime::kill_mps_stand_ins(&self.dir);
        for files in self.nodes.iter().filter_map(NodeInfo::runtime_files) {
            runtime::teardown(&files);
        }
        // The plugins' MPS shm tmpfs of claims never unprepared (hollow nodes' plugins run as
        // processes in this mount namespace).
        runtime::unmount_below(&self.dir);
        if let Some(bin) = self.service_network.take() {
            runtime::cleanup_service_network(&bin);
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() && !self.processes.is_empty() {
            self.print_log_tails(40);
            eprintln!("cluster files kept in {}", self.dir.display());
            self.remove_dir_on_drop = false;
        }
        self.stop();
        if self.remove_dir_on_drop {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Stops the components of a detached cluster (`make cluster-down`).
pub fn stop_detached(state: &ClusterState) {
    for pid in state.pids.iter().rev() {
        let pid = *pid as i32;
        if process::alive(pid) {
            process::stop_group(pid, Duration::from_secs(10));
        }
    }
    runtime::kill_mps_stand_ins(&state.dir);
    for files in state.nodes.iter().filter_map(NodeInfo::runtime_files) {
        runtime::teardown(&files);
    }
    runtime::unmount_below(&state.dir);
    if state.service_network {
        runtime::cleanup_service_network(&k8s_binary());
    }
}
