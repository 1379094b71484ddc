//! Shares of a shared slice with MPS protocol 3 (docs/design.md §7, "MPS on a slice", limits per
//! protocol), through the preparer with the stand-in daemon: the slice's daemon runs `-p 3` with
//! one server allowed the slice alone, each share gets a namespace with the tighter of the
//! slice's limits and its own part, its containers mount only that namespace's directory
//! (read-only) and get no limit variables, a share that leaves takes its namespace with it, and
//! a restart creates the others again.

use super::shares::SHARED;
use super::*;

impl Node {
    /// The mounts of claim `uid`'s CDI spec: (host path, container path, options).
    fn cdi_mounts(&self, uid: &str) -> Vec<(String, String, Vec<String>)> {
        let dir = self.dir.path().join("cdi");
        let spec = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().contains(uid))
            .map(|e| std::fs::read_to_string(e.path()).unwrap())
            .unwrap_or_else(|| panic!("no CDI spec of {uid} in {}", dir.display()));
        let v: serde_json::Value = serde_json::from_str(&spec).unwrap();
        v["devices"][0]["containerEdits"]["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let s = |k: &str| m[k].as_str().unwrap().to_string();
                let options = m["options"].as_array().unwrap();
                let options = options.iter().map(|o| o.as_str().unwrap().to_string());
                (s("hostPath"), s("containerPath"), options.collect())
            })
            .collect()
    }
}

/// The namespace of a share of claim `uid`.
fn ns(uid: &str) -> String {
    das_driver::mps::commands::namespace_name(uid, SHARED)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_share_gets_its_own_namespace_with_its_limits_and_mounts_only_it() {
    let node = Node::new();
    let mps = node.daemons_with(Node::stand_in(), Protocol::V3);
    let p = node.preparer(mps.clone());
    // The slice's config: 30 % and 2Gi; a takes 1 of 4 shares (25 %), b 2 of 4 (50 %), each
    // with 2560Mi.
    let (a, b) = (
        node.api.allocate_share("a", "uid-a", 1, 30),
        node.api.allocate_share("b", "uid-b", 2, 30),
    );
    p.prepare_claim(&a).await.unwrap();
    p.prepare_claim(&b).await.unwrap();
    let dirs = node.slice_dirs();
    let mig = node.slices()[0].mig_uuid.clone();
    let run = Record::read(&dirs.log).unwrap().runs.pop().unwrap();
    assert_eq!(run.protocol, 3);
    let server = &run.servers["slice"];
    assert_eq!(server.allowed_devices, mig, "the slice alone");
    assert!(server.running);
    assert_eq!(
        server.limits.active_thread_percentage.as_deref(),
        Some("30")
    );
    assert_eq!(server.limits.pinned_memory_limit.as_deref(), Some("2048M"));
    // The tighter of the slice's limits and each share's part: a namespace's limits replace
    // the server's, they do not narrow them.
    let limits = |uid: &str| {
        let l = &server.namespaces[&ns(uid)];
        (
            l.active_thread_percentage.clone().unwrap(),
            l.pinned_memory_limit.clone().unwrap(),
        )
    };
    assert_eq!(limits("uid-a"), ("25".to_string(), "2048M".to_string()));
    assert_eq!(limits("uid-b"), ("30".to_string(), "2048M".to_string()));
    // Each claim's containers mount only their namespace, read-only, and get no limits in
    // their environment (the namespace's are the server's to apply).
    for uid in ["uid-a", "uid-b"] {
        let mounts = node.cdi_mounts(uid);
        let pipe = mounts.iter().find(|m| m.1 == "/tmp/nvidia-mps").unwrap();
        assert_eq!(
            PathBuf::from(&pipe.0),
            dirs.namespace_dir(&ns(uid)),
            "{mounts:?}"
        );
        assert_eq!(pipe.2[0], "ro");
        assert!(dirs.namespace_dir(&ns(uid)).join("control").exists());
        let env = node.cdi_env(uid);
        assert!(
            !env.iter().any(
                |e| e.starts_with("CUDA_MPS_ACTIVE_THREAD") || e.starts_with("CUDA_MPS_PINNED")
            ),
            "{env:?}"
        );
    }

    // a leaves: its namespace goes, b's stays.
    p.unprepare_claim(&a).await.unwrap();
    let run = Record::read(&dirs.log).unwrap().runs.pop().unwrap();
    let names: Vec<&String> = run.servers["slice"].namespaces.keys().collect();
    assert_eq!(names, [&ns("uid-b")]);
    assert!(!dirs.namespace_dir(&ns("uid-a")).join("control").exists());

    // The daemon is killed: started again with its server and b's namespace only.
    let pid = mps.pid(&dirs).unwrap();
    sigkill(pid);
    let again = until("the daemon started again with b's namespace", || {
        let run = Record::read(&dirs.log)?.runs.pop()?;
        let server = run.servers.get("slice")?;
        (run.pid != pid && server.namespaces.contains_key(&ns("uid-b"))).then_some(run)
    })
    .await;
    assert_eq!(again.servers["slice"].namespaces.len(), 1);
    p.unprepare_claim(&b).await.unwrap();
    assert!(node.slices().is_empty() && !dirs.root.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_brings_back_every_shares_namespace() {
    let node = Node::new();
    let mps = node.daemons_with(Node::stand_in(), Protocol::V3);
    let p = node.preparer(mps.clone());
    let (a, b) = (
        node.api.allocate_share("a", "uid-a", 1, 30),
        node.api.allocate_share("b", "uid-b", 1, 30),
    );
    p.prepare_claim(&a).await.unwrap();
    p.prepare_claim(&b).await.unwrap();
    let dirs = node.slice_dirs();
    let old = mps.pid(&dirs).unwrap();
    // The plugin restarts and its daemon died with it (a containerized plugin's do).
    mps.let_go().await;
    drop(p);
    drop(mps);
    sigkill(old);
    until("the old daemon to die", || (!running(old)).then_some(())).await;
    let mps = node.daemons_with(Node::stand_in(), Protocol::V3);
    let p = node.preparer(mps.clone());
    p.reconcile_at_startup(false, true).await.unwrap();
    let run = Record::read(&dirs.log).unwrap().runs.pop().unwrap();
    assert_ne!(run.pid, old);
    let names: Vec<&String> = run.servers["slice"].namespaces.keys().collect();
    let mut want = [ns("uid-a"), ns("uid-b")];
    want.sort();
    assert_eq!(names, want.iter().collect::<Vec<_>>());
    p.unprepare_claim(&a).await.unwrap();
    p.unprepare_claim(&b).await.unwrap();
    assert!(node.slices().is_empty());
}
