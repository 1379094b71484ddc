//! Starting the cluster in the start order of [`super`], each step waited for: the PKI, etcd, the
//! control plane (flags from [`super::args`]), the kubelets of hollow and real-runtime nodes, and
//! kube-proxy for a Service network.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::Api;

use super::args::{apiserver_args, feature_gates, kubelet_client_args, scheduler_config};
use super::{Cluster, ClusterConfig, NodeInfo, NodeKind};
use crate::binaries::k8s_minor_version;
use crate::kubeconfig;
use crate::pki::{self, CertFiles, Pki, Usage};
use crate::process;
use crate::runtime;
use crate::workload::free_port;

/// The control plane's credentials and address, made before anything starts.
struct Plane {
    /// The cluster's CA.
    pki: Pki,
    /// The API server's serving certificate.
    serving: CertFiles,
    /// The service-account signing keys.
    sa: CertFiles,
    /// The API server's client certificate towards kubelets.
    kubelet_client: CertFiles,
    /// The host's address, for a Service network.
    host_ip: Option<std::net::IpAddr>,
    /// The API server's port.
    api_port: u16,
    /// The API server's URL.
    server: String,
    /// The `--feature-gates` flag of every control-plane component (none, or one).
    gates: Vec<String>,
}

impl Cluster {
    fn spawn(&mut self, cfg: &ClusterConfig, name: &str, args: Vec<String>) -> Result<()> {
        self.lifetime = cfg.lifetime;
        self.spawn_program(name, &cfg.k8s_bin, args)
    }

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

    /// Starts every part in order, each waited for, marking when each is up.
    async fn boot(&mut self, cfg: &ClusterConfig) -> Result<()> {
        let t0 = Instant::now();
        let plane = self.credentials(cfg)?;
        let etcd_url = self.start_etcd(cfg).await?;
        self.mark("etcd", t0);
        self.start_apiserver(cfg, &plane, &etcd_url).await?;
        self.mark("kube-apiserver ready", t0);
        self.start_controllers(cfg, &plane)?;
        self.wait_default_service_account(Duration::from_secs(60))
            .await?;
        self.mark("controller-manager + scheduler", t0);
        self.start_nodes(cfg, &plane)?;
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

    /// The cluster's CA and the control plane's certificates, its API server's port, and the
    /// admin kubeconfig written for it.
    fn credentials(&mut self, cfg: &ClusterConfig) -> Result<Plane> {
        let gates = feature_gates(k8s_minor_version(&cfg.k8s_bin)?, &cfg.feature_gates);
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
        let api_port = free_port();
        let server = format!("https://127.0.0.1:{api_port}");
        kubeconfig::write(
            &self.kubeconfig,
            &server,
            &pki.ca.cert,
            &admin,
            "das-e2e-admin",
        )?;
        Ok(Plane {
            gates,
            pki,
            serving,
            sa,
            kubelet_client,
            host_ip,
            api_port,
            server,
        })
    }

    /// etcd, on free ports, waited for; its client URL.
    async fn start_etcd(&mut self, cfg: &ClusterConfig) -> Result<String> {
        let etcd_port = free_port();
        let etcd_peer_port = free_port();
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
        Ok(etcd_url)
    }

    /// kube-apiserver on etcd `etcd_url`, waited for until ready; the admin client.
    async fn start_apiserver(
        &mut self,
        cfg: &ClusterConfig,
        plane: &Plane,
        etcd_url: &str,
    ) -> Result<()> {
        let (pki, port) = (&plane.pki, plane.api_port);
        self.spawn(
            cfg,
            "kube-apiserver",
            [
                apiserver_args(
                    etcd_url,
                    port,
                    &pki.ca,
                    &plane.serving,
                    &plane.sa,
                    plane.host_ip,
                ),
                kubelet_client_args(&plane.kubelet_client),
                plane.gates.clone(),
            ]
            .concat(),
        )?;
        self.client = Some(kubeconfig::client(&self.kubeconfig).await?);
        self.wait_readyz(Duration::from_secs(90)).await
    }

    /// kube-controller-manager and kube-scheduler (with the configured profiles, if any).
    fn start_controllers(&mut self, cfg: &ClusterConfig, plane: &Plane) -> Result<()> {
        let (pki, sa) = (&plane.pki, &plane.sa);
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
            .chain(plane.gates.clone())
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
            scheduler_args
                .into_iter()
                .chain(plane.gates.clone())
                .collect(),
        )
    }

    /// The kubelets of the hollow nodes, then the real-runtime nodes, each with its node
    /// identity (not waited for).
    fn start_nodes(&mut self, cfg: &ClusterConfig, plane: &Plane) -> Result<()> {
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
            let kc = self.node_kubeconfig(plane, name)?;
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
                NodeKind::Runtime => {
                    self.start_runtime_node(cfg, &node, &kc, &plane.pki.ca.cert)?
                }
            }
        }
        Ok(())
    }

    /// The kubeconfig of node `name`'s kubelet: the node's identity, so that the Node
    /// authorizer and NodeRestriction apply, as on a real node.
    fn node_kubeconfig(&self, plane: &Plane, name: &str) -> Result<std::path::PathBuf> {
        let creds = plane.pki.issue(
            &format!("node-{name}"),
            &format!("system:node:{name}"),
            Usage::Client {
                groups: vec!["system:nodes".into()],
            },
        )?;
        let kc = self.dir.join(format!("node-{name}.kubeconfig"));
        kubeconfig::write(
            &kc,
            &plane.server,
            &plane.pki.ca.cert,
            &creds,
            &format!("system:node:{name}"),
        )?;
        Ok(kc)
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

    fn mark(&mut self, what: &str, t0: Instant) {
        self.timings.push((what.to_string(), t0.elapsed()));
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
}
