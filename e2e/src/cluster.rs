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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::{Api, Client};
use serde::{Deserialize, Serialize};

use crate::kubeconfig;
use crate::pki::{self, CertFiles, Pki, Usage};
use crate::process::{self, Lifetime, Process};
use crate::runtime;
use crate::workload::free_port;

/// The default Kubernetes version, the one `e2e/k8s/go.mod` pins and `make k8s` builds into
/// `.local/bin` (kept in step with the Makefile's `K8S_DEFAULT_VERSION`). Older supported
/// versions build from `e2e/k8s/versions/` (`K8S_VERSION=... make k8s`).
pub const KUBERNETES_VERSION: &str = "v1.37.2";

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
        }
    }
}

/// A KubeSchedulerConfiguration (JSON, which kube-scheduler reads as YAML) with `profiles` and the
/// settings the harness's scheduler flags give without one.
fn scheduler_config(kubeconfig: &str, profiles: &serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig, "qps": 100, "burst": 200},
        "leaderElection": {"leaderElect": false},
        "profiles": profiles,
    })
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
    pub fn runtime_files(&self) -> Option<crate::runtime::RuntimeFiles> {
        (self.kind == NodeKind::Runtime).then(|| crate::runtime::RuntimeFiles {
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

/// `<workspace>/.local/bin/k8s`, or `$DAS_K8S_BIN` (the Makefile sets it to the build of
/// `K8S_VERSION`, e.g. `.local/k8s/v1.35.4/k8s`).
/// A relative `$DAS_K8S_BIN` is taken from the repository root (cargo runs tests in `e2e/`).
pub fn k8s_binary() -> PathBuf {
    let root = workspace_root();
    std::env::var_os("DAS_K8S_BIN")
        .map(|p| root.join(p))
        .unwrap_or_else(|| root.join(".local/bin/k8s"))
}

/// The repository root (parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ has a parent")
        .to_path_buf()
}

impl Cluster {
    /// Starts the cluster and waits until every node is Ready. A start that failed because a
    /// port picked as free was taken in the meantime (tests run in parallel and each picks its
    /// own ports) is tried again with new ports, up to three times in all.
    pub async fn start(cfg: ClusterConfig) -> Result<Self> {
        let mut attempt = 1;
        loop {
            match Self::start_once(&cfg).await {
                Err(e) if attempt < 3 && format!("{e:#}").contains("address already in use") => {
                    eprintln!("cluster start lost a port race; trying again: {e:#}");
                    attempt += 1;
                }
                r => return r,
            }
        }
    }

    async fn start_once(cfg: &ClusterConfig) -> Result<Self> {
        if !cfg.k8s_bin.exists() {
            bail!("{} not found: run `make k8s` first", cfg.k8s_bin.display());
        }
        let (dir, remove_dir_on_drop) = match &cfg.dir {
            Some(d) => {
                std::fs::create_dir_all(d)?;
                (d.canonicalize()?, false)
            }
            None => {
                // Short on purpose: kubelet sockets live below it (108-byte unix path limit).
                let d = std::env::temp_dir().join(format!("das-{:08x}", rand::random::<u32>()));
                std::fs::create_dir_all(&d)?;
                (d, std::env::var("DAS_E2E_KEEP").is_err())
            }
        };
        for sub in ["logs", "pki", "etcd", "n"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let mut cluster = Cluster {
            kubeconfig: dir.join("admin.kubeconfig"),
            pki_dir: dir.join("pki"),
            nodes: Vec::new(),
            client: None,
            processes: Vec::new(),
            remove_dir_on_drop,
            lifetime: cfg.lifetime,
            timings: Vec::new(),
            service_network: None,
            dir,
        };
        match cluster.boot(cfg).await {
            Ok(()) => Ok(cluster),
            Err(e) => {
                cluster.print_log_tails(40);
                cluster.remove_dir_on_drop = false;
                Err(e.context(format!(
                    "cluster start failed; logs in {}",
                    cluster.dir.join("logs").display()
                )))
            }
        }
    }

    async fn boot(&mut self, cfg: &ClusterConfig) -> Result<()> {
        let t0 = Instant::now();
        let gates = feature_gates(k8s_minor_version(&cfg.k8s_bin)?);
        let pki = Pki::create(&self.pki_dir)?;
        let host_ip = if cfg.service_network {
            Some(runtime::host_ip()?)
        } else {
            None
        };
        let mut sans = pki::apiserver_sans();
        sans.extend(host_ip.map(|ip| ip.to_string()));
        let serving = pki.issue("apiserver", "kube-apiserver", Usage::Server { sans })?;
        let admin = pki.issue(
            "admin",
            "das-e2e-admin",
            Usage::Client {
                groups: vec!["system:masters".into()],
            },
        )?;
        let sa = pki.service_account_keys()?;
        // The API server's identity towards kubelets (`kubectl logs`/`exec` on real-runtime
        // nodes, whose kubelets authenticate x509 clients of the cluster CA).
        let kubelet_client = pki.issue(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            Usage::Client {
                groups: vec!["system:masters".into()],
            },
        )?;
        let etcd_port = free_port();
        let etcd_peer_port = free_port();
        let api_port = free_port();
        let server = format!("https://127.0.0.1:{api_port}");
        kubeconfig::write(
            &self.kubeconfig,
            &server,
            &pki.ca.cert,
            &admin,
            "das-e2e-admin",
        )?;

        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer_port}");
        self.spawn(
            cfg,
            "etcd",
            vec![
                "etcd".into(),
                "--name=node0".into(),
                format!("--data-dir={}", self.dir.join("etcd").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=node0={peer_url}"),
                "--unsafe-no-fsync=true".into(),
                "--auto-compaction-retention=1".into(),
                "--quota-backend-bytes=4294967296".into(),
                "--log-level=warn".into(),
            ],
        )?;
        self.wait_tcp("etcd", etcd_port, Duration::from_secs(30))
            .await?;
        self.mark("etcd", t0);

        self.spawn(
            cfg,
            "kube-apiserver",
            [
                apiserver_args(&etcd_url, api_port, &pki.ca, &serving, &sa, host_ip),
                kubelet_client_args(&kubelet_client),
                gates.clone(),
            ]
            .concat(),
        )?;
        self.client = Some(kubeconfig::client(&self.kubeconfig).await?);
        self.wait_readyz(Duration::from_secs(90)).await?;
        self.mark("kube-apiserver ready", t0);

        let admin_kc = self.kubeconfig.display().to_string();
        self.spawn(
            cfg,
            "kube-controller-manager",
            vec![
                "kube-controller-manager".into(),
                format!("--kubeconfig={admin_kc}"),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
                "--controllers=*".into(),
                format!("--root-ca-file={}", pki.ca.cert.display()),
                format!("--service-account-private-key-file={}", sa.key.display()),
                format!("--cluster-signing-cert-file={}", pki.ca.cert.display()),
                format!("--cluster-signing-key-file={}", pki.ca.key.display()),
                "--use-service-account-credentials=false".into(),
                "--kube-api-qps=100".into(),
                "--kube-api-burst=200".into(),
            ]
            .into_iter()
            .chain(gates.clone())
            .collect(),
        )?;
        let scheduler_args = match &cfg.scheduler_profiles {
            None => vec![
                "kube-scheduler".into(),
                format!("--kubeconfig={admin_kc}"),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
                "--kube-api-qps=100".into(),
                "--kube-api-burst=200".into(),
            ],
            Some(profiles) => {
                let path = self.dir.join("kube-scheduler.yaml");
                std::fs::write(
                    &path,
                    serde_json::to_vec_pretty(&scheduler_config(&admin_kc, profiles))?,
                )?;
                vec![
                    "kube-scheduler".into(),
                    format!("--config={}", path.display()),
                    "--secure-port=0".into(),
                ]
            }
        };
        self.spawn(
            cfg,
            "kube-scheduler",
            scheduler_args.into_iter().chain(gates.clone()).collect(),
        )?;
        self.wait_default_service_account(Duration::from_secs(60))
            .await?;
        self.mark("controller-manager + scheduler", t0);

        let kinds = cfg
            .nodes
            .iter()
            .map(|n| (n, NodeKind::Hollow))
            .chain(cfg.runtime_nodes.iter().map(|n| (n, NodeKind::Runtime)));
        for (name, kind) in kinds {
            let node = NodeInfo {
                name: name.clone(),
                root_dir: self.dir.join("n").join(name),
                kind,
            };
            std::fs::create_dir_all(&node.root_dir)?;
            // Node identity: the Node authorizer and NodeRestriction apply, as on a real node.
            let creds = pki.issue(
                &format!("node-{name}"),
                &format!("system:node:{name}"),
                Usage::Client {
                    groups: vec!["system:nodes".into()],
                },
            )?;
            let kc = self.dir.join(format!("node-{name}.kubeconfig"));
            kubeconfig::write(
                &kc,
                &server,
                &pki.ca.cert,
                &creds,
                &format!("system:node:{name}"),
            )?;
            // Registered before its processes start, so a failed start still tears it down.
            self.nodes.push(node.clone());
            match kind {
                NodeKind::Hollow => self.spawn(
                    cfg,
                    &format!("kubelet-{name}"),
                    vec![
                        "dra-kubelet".into(),
                        format!("--kubeconfig={}", kc.display()),
                        format!("--name={name}"),
                        format!("--root-dir={}", node.root_dir.display()),
                        format!("--kubelet-port={}", free_port()),
                        "--v=2".into(),
                    ],
                )?,
                NodeKind::Runtime => self.start_runtime_node(cfg, &node, &kc, &pki.ca.cert)?,
            }
        }
        for name in cfg.nodes.iter().chain(&cfg.runtime_nodes) {
            self.wait_node_ready(name, Duration::from_secs(90)).await?;
        }
        self.mark("nodes ready", t0);
        if cfg.service_network {
            let kc = self.kubeconfig.clone();
            self.start_kube_proxy(cfg, &kc)?;
        }
        Ok(())
    }

    /// kube-proxy for the Service network ([`ClusterConfig::service_network`]), as the proxy of
    /// the first real-runtime node (it takes that node's address as its own).
    fn start_kube_proxy(&mut self, cfg: &ClusterConfig, kubeconfig: &Path) -> Result<()> {
        let node = cfg
            .runtime_nodes
            .first()
            .context("a Service network needs a real-runtime node")?;
        if let Some(pid) = process::find_component("kube-proxy") {
            bail!(
                "another local cluster with a Service network runs here (kube-proxy, pid {pid}): \
                 kube-proxy owns the KUBE-* iptables chains, so only one can run at a time; \
                 stop it first (`make cluster-down` for the demo's cluster)"
            );
        }
        self.service_network = Some(cfg.k8s_bin.clone());
        self.spawn(
            cfg,
            "kube-proxy",
            runtime::kube_proxy_args(kubeconfig, node),
        )
    }

    /// containerd (configs written, images imported), then the upstream kubelet against it.
    fn start_runtime_node(
        &mut self,
        cfg: &ClusterConfig,
        node: &NodeInfo,
        kubeconfig: &Path,
        ca: &Path,
    ) -> Result<()> {
        runtime::preflight()?;
        let files = node.runtime_files().expect("a runtime node");
        runtime::write_configs(&files)?;
        let bin = runtime::binaries_dir();
        // containerd finds its shim and the shim finds runc through PATH.
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        self.spawn_program_with_env(
            &format!("containerd-{}", node.name),
            &bin.join("containerd"),
            vec![format!("--config={}", files.containerd_config().display())],
            &[("PATH".into(), path)],
        )?;
        runtime::wait_containerd(&files, Duration::from_secs(30))?;
        runtime::import_images(&files)?;
        std::fs::write(
            files.kubelet_config(),
            runtime::kubelet_config(&files, ca, free_port()),
        )?;
        self.spawn(
            cfg,
            &format!("kubelet-{}", node.name),
            vec![
                "kubelet".into(),
                format!("--config={}", files.kubelet_config().display()),
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--root-dir={}", node.root_dir.display()),
                format!("--cert-dir={}", node.root_dir.join("pki").display()),
                format!("--hostname-override={}", node.name),
                format!("--node-labels={}=true", runtime::TAINT_KEY),
                "--v=2".into(),
            ],
        )
    }

    fn spawn(&mut self, cfg: &ClusterConfig, name: &str, args: Vec<String>) -> Result<()> {
        self.lifetime = cfg.lifetime;
        self.spawn_program(name, &cfg.k8s_bin, args)
    }

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

    fn mark(&mut self, what: &str, t0: Instant) {
        self.timings.push((what.to_string(), t0.elapsed()));
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

    async fn wait_tcp(&mut self, what: &str, port: u16, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{what} did not listen on port {port} within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn wait_readyz(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut last: String;
        loop {
            self.check_alive()?;
            let req = http::Request::get("/readyz").body(Vec::new())?;
            match self.client().request_text(req).await {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                Ok(body) => last = body,
                Err(e) => last = e.to_string(),
            }
            if Instant::now() > deadline {
                bail!("kube-apiserver not ready within {timeout:?}: {last}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn wait_default_service_account(&mut self, timeout: Duration) -> Result<()> {
        let api: Api<ServiceAccount> = Api::namespaced(self.client(), "default");
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            if api.get_opt("default").await?.is_some() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "kube-controller-manager did not create the default ServiceAccount within {timeout:?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn wait_node_ready(&mut self, name: &str, timeout: Duration) -> Result<()> {
        let api: Api<Node> = Api::all(self.client());
        let deadline = Instant::now() + timeout;
        loop {
            self.check_alive()?;
            if let Some(node) = api.get_opt(name).await? {
                let ready = node
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                if ready {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!("node {name} not Ready within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
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
        for files in self.nodes.iter().filter_map(NodeInfo::runtime_files) {
            runtime::teardown(&files);
        }
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
    for files in state.nodes.iter().filter_map(NodeInfo::runtime_files) {
        runtime::teardown(&files);
    }
    if state.service_network {
        runtime::cleanup_service_network(&k8s_binary());
    }
}

/// The version of the Kubernetes build in `bin`, e.g. `v1.35.4` (what `k8s version` prints).
/// Asked once per binary and process: every chart render and cluster start needs it.
pub fn k8s_version(bin: &Path) -> Result<String> {
    static SEEN: std::sync::Mutex<BTreeMap<PathBuf, String>> =
        std::sync::Mutex::new(BTreeMap::new());
    if let Some(v) = SEEN.lock().expect("version cache").get(bin) {
        return Ok(v.clone());
    }
    let out = std::process::Command::new(bin)
        .arg("version")
        .output()
        .with_context(|| format!("run {} version", bin.display()))?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    SEEN.lock()
        .expect("version cache")
        .insert(bin.to_path_buf(), version.clone());
    Ok(version)
}

/// The minor version of the Kubernetes build in `bin`.
pub fn k8s_minor_version(bin: &Path) -> Result<u32> {
    let version = k8s_version(bin)?;
    parse_minor(&version).with_context(|| {
        format!(
            "{} version printed {version:?}, not v1.MINOR.PATCH: build it with `make k8s`",
            bin.display()
        )
    })
}

fn parse_minor(version: &str) -> Option<u32> {
    let rest = version.strip_prefix("v1.")?;
    rest.split('.').next()?.parse().ok()
}

/// The feature gates the control plane of Kubernetes 1.`minor` needs for DAS, as the README's
/// compatibility table tells users: shared counters (`DRAPartitionableDevices`) are alpha and
/// off before 1.36.
fn feature_gates(minor: u32) -> Vec<String> {
    if minor < 36 {
        vec!["--feature-gates=DRAPartitionableDevices=true".into()]
    } else {
        Vec::new()
    }
}

/// How the API server reaches kubelets: with its kubelet-client certificate, at the node's
/// InternalIP (node names do not resolve here).
fn kubelet_client_args(creds: &CertFiles) -> Vec<String> {
    vec![
        format!("--kubelet-client-certificate={}", creds.cert.display()),
        format!("--kubelet-client-key={}", creds.key.display()),
        "--kubelet-preferred-address-types=InternalIP".into(),
    ]
}

fn apiserver_args(
    etcd_url: &str,
    port: u16,
    ca: &CertFiles,
    serving: &CertFiles,
    sa: &CertFiles,
    host_ip: Option<std::net::IpAddr>,
) -> Vec<String> {
    let address = match host_ip {
        // Pods reach the API server through the `kubernetes` Service, whose endpoint is the
        // advertised address (kept by the lease endpoint reconciler).
        Some(ip) => vec![
            "--bind-address=0.0.0.0".to_string(),
            format!("--advertise-address={ip}"),
        ],
        // No routable address here: loopback cannot go into Endpoints.
        None => vec![
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            "--endpoint-reconciler-type=none".into(),
        ],
    };
    let mut args = vec![
        "kube-apiserver".into(),
        format!("--etcd-servers={etcd_url}"),
        format!("--secure-port={port}"),
        format!("--tls-cert-file={}", serving.cert.display()),
        format!("--tls-private-key-file={}", serving.key.display()),
        format!("--client-ca-file={}", ca.cert.display()),
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
        format!("--service-account-key-file={}", sa.cert.display()),
        format!("--service-account-signing-key-file={}", sa.key.display()),
        "--service-cluster-ip-range=10.0.0.0/24".into(),
        "--authorization-mode=Node,RBAC".into(),
        "--enable-admission-plugins=NodeRestriction".into(),
        "--allow-privileged=true".into(),
        "--enable-priority-and-fairness=false".into(),
        "--profiling=false".into(),
    ];
    args.extend(address);
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduler_config_keeps_the_profiles_and_the_flags_settings() {
        let profiles = serde_json::json!([{"schedulerName": "default-scheduler",
            "pluginConfig": [{"name": "NodeResourcesFit", "args": {}}]}]);
        let c = scheduler_config("/tmp/a b/kubeconfig", &profiles);
        assert_eq!(c["kind"], "KubeSchedulerConfiguration");
        assert_eq!(c["clientConnection"]["kubeconfig"], "/tmp/a b/kubeconfig");
        assert_eq!(c["leaderElection"]["leaderElect"], false);
        assert_eq!(c["profiles"], profiles);
    }

    #[test]
    fn minor_version_and_gates_follow_the_build() {
        assert_eq!(parse_minor("v1.35.4"), Some(35));
        assert_eq!(parse_minor("v1.37.2"), Some(37));
        assert_eq!(parse_minor("v0.0.0-master+$Format:%H$"), None);
        assert_eq!(
            feature_gates(34),
            ["--feature-gates=DRAPartitionableDevices=true"]
        );
        assert!(feature_gates(36).is_empty());
    }
}
