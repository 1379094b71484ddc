//! Shares of a shared slice through the preparer (docs/design.md §7, "Shared slices"), with the
//! emulated GPUs and the stand-in daemon: the first share creates the slice and its one MPS
//! daemon, a share with the same config joins them with its own limits in its CDI spec, one with
//! another config is refused, a restart keeps the slice and adopts its daemon, and only the last
//! share's unprepare stops the daemon and destroys the slice.

use super::*;

pub(super) const SHARED: &str = "gpu-0-mig-1g-10gb-6-shared";

impl ClaimStore {
    /// Claim `ns/<name>` with `uid`, allocated a share (`shares` of 4, `memory`) of [`SHARED`]
    /// with MPS at `percent`.
    pub(super) fn allocate_share(
        &self,
        name: &str,
        uid: &str,
        shares: u32,
        percent: u8,
    ) -> ClaimRef {
        let result = json!({"request": "gpu", "driver": das_api::DRIVER_NAME, "pool": NODE,
            "device": SHARED, "shareID": format!("share-{uid}"),
            "consumedCapacity": {"shares": shares.to_string(), "memory": "2560Mi"}});
        self.allocate_with(name, uid, result, percent)
    }
}

impl Node {
    /// The directories of the shared slice's daemon (keyed by its GPU, not by a claim).
    pub(super) fn slice_dirs(&self) -> MpsDirs {
        let gpu = self.gpus.inventory().unwrap()[0].uuid.clone();
        MpsDirs::new(self.dir.path(), &layout::daemon_id(&gpu, SHARED))
    }

    /// The environment of claim `uid`'s CDI spec.
    pub(super) fn cdi_env(&self, uid: &str) -> Vec<String> {
        let dir = self.dir.path().join("cdi");
        let spec = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().contains(uid))
            .map(|e| std::fs::read_to_string(e.path()).unwrap())
            .unwrap_or_else(|| panic!("no CDI spec of {uid} in {}", dir.display()));
        let v: serde_json::Value = serde_json::from_str(&spec).unwrap();
        v["devices"][0]["containerEdits"]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e.as_str().unwrap().to_string())
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_join_one_slice_and_daemon_and_the_last_unprepare_destroys_them() {
    let node = Node::new();
    let mps = node.daemons(Node::stand_in());
    let p = node.preparer(mps.clone());
    let (a, b) = (
        node.api.allocate_share("a", "uid-a", 1, 30),
        node.api.allocate_share("b", "uid-b", 2, 30),
    );
    // Concurrently: whichever comes first creates, the other joins.
    let (ra, rb) = tokio::join!(p.prepare_claim(&a), p.prepare_claim(&b));
    let (da, db) = (ra.unwrap(), rb.unwrap());
    assert_eq!(da[0].share_id.as_deref(), Some("share-uid-a"));
    assert_eq!(db[0].share_id.as_deref(), Some("share-uid-b"));
    let slices = node.slices();
    assert_eq!(slices.len(), 1, "one slice for both shares: {slices:?}");
    let dirs = node.slice_dirs();
    let runs = Record::read(&dirs.log).unwrap().runs;
    assert_eq!(runs.len(), 1, "one daemon start: {runs:?}");
    assert_eq!(runs[0].commands, limits());
    assert_eq!(runs[0].visible_devices, slices[0].mig_uuid);
    assert_eq!(mps.supervised(), 1);
    // Each share's limits reach its clients: 1 of 4 shares, 2 of 4; 2560Mi each.
    let (ea, eb) = (node.cdi_env("uid-a"), node.cdi_env("uid-b"));
    assert!(
        ea.contains(&"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25".to_string()),
        "{ea:?}"
    );
    assert!(
        eb.contains(&"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50".to_string()),
        "{eb:?}"
    );
    for env in [&ea, &eb] {
        assert!(
            env.contains(&"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2560M".to_string()),
            "{env:?}"
        );
        assert!(
            env.contains(&"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps".to_string()),
            "{env:?}"
        );
    }

    // The first share leaves: the slice and its daemon stay for the other.
    p.unprepare_claim(&a).await.unwrap();
    assert_eq!(node.slices(), slices);
    assert!(mps.pid(&dirs).is_some() && !node.recorded("uid-a"));
    // The last leaves: the daemon stops before the slice is destroyed.
    p.unprepare_claim(&b).await.unwrap();
    assert!(node.slices().is_empty() && !node.recorded("uid-b"));
    assert!(
        node.gpus.refused.lock().unwrap().is_empty(),
        "a destroy came while the daemon ran"
    );
    assert!(!dirs.root.exists() && mps.supervised() == 0);
    until("the daemon to be gone", || {
        (!running(runs[0].pid)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_with_another_config_is_refused_and_changes_nothing() {
    let node = Node::new();
    let mps = node.daemons(Node::stand_in());
    let p = node.preparer(mps.clone());
    let a = node.api.allocate_share("a", "uid-a", 1, 30);
    p.prepare_claim(&a).await.unwrap();
    let slices = node.slices();
    let b = node.api.allocate_share("b", "uid-b", 1, 60);
    let e = p.prepare_claim(&b).await.unwrap_err();
    assert_eq!(e.metric_label(), "share", "{e}");
    let text = e.to_string();
    assert!(
        text.contains("claim ns/a") && text.contains("activeThreadPercentage 60"),
        "{text}"
    );
    assert_eq!(node.slices(), slices);
    assert!(!node.recorded("uid-b") && node.recorded("uid-a"));
    assert!(
        mps.pid(&node.slice_dirs()).is_some(),
        "the slice's daemon runs on"
    );
    p.unprepare_claim(&a).await.unwrap();
    assert!(node.slices().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_the_shared_slice_and_adopts_its_one_daemon() {
    let node = Node::new();
    let mps = node.daemons(Node::stand_in());
    let p = node.preparer(mps.clone());
    let (a, b) = (
        node.api.allocate_share("a", "uid-a", 1, 30),
        node.api.allocate_share("b", "uid-b", 1, 30),
    );
    p.prepare_claim(&a).await.unwrap();
    p.prepare_claim(&b).await.unwrap();
    let (slices, dirs) = (node.slices(), node.slice_dirs());
    let pid = mps.pid(&dirs).unwrap();

    // The plugin restarts: its records are the shares' reference count.
    mps.let_go().await;
    drop(p);
    drop(mps);
    let mps = node.daemons(Node::stand_in());
    let p = node.preparer(mps.clone());
    let report = p.reconcile_at_startup(false, true).await.unwrap();
    assert_eq!(report.kept.len(), 2, "{report:?}");
    assert_eq!(node.slices(), slices, "{report:?}");
    assert_eq!(mps.pid(&dirs), Some(pid), "the running daemon is adopted");
    assert_eq!(mps.supervised(), 1);

    p.unprepare_claim(&b).await.unwrap();
    assert_eq!(node.slices(), slices);
    p.unprepare_claim(&a).await.unwrap();
    assert!(node.slices().is_empty() && !dirs.root.exists());
}

/// The interleaving that once lost a joined slice: a share decides to join (under the GPU's
/// lock) and, while it checks that the slice is live, the slice's last other share is
/// unprepared. The join is recorded in the same change that decides it, so the release sees a
/// holder and leaves the slice and its daemon; the joining share runs on them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_recorded_before_the_last_leave_keeps_the_slice() {
    let node = Node::new();
    let mps = node.daemons(Node::stand_in());
    let p = Arc::new(node.preparer(mps.clone()));
    let (a, b) = (
        node.api.allocate_share("a", "uid-a", 1, 30),
        node.api.allocate_share("b", "uid-b", 1, 30),
    );
    p.prepare_claim(&a).await.unwrap();
    let slices = node.slices();
    let pid = mps.pid(&node.slice_dirs()).unwrap();
    // b's join stops in its listing of the GPU's instances (after its decision).
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (go_on, go_on_rx) = std::sync::mpsc::channel();
    *node.gpus.gate.lock().unwrap() = Some((entered_tx, go_on_rx));
    let joining = tokio::spawn({
        let (p, b) = (p.clone(), b.clone());
        async move { p.prepare_claim(&b).await }
    });
    tokio::task::spawn_blocking(move || entered.recv_timeout(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("b's join reached the listing");
    // a leaves meanwhile: it gets as far as it can (its destroy would wait for the GPU's lock).
    let leaving = tokio::spawn({
        let (p, a) = (p.clone(), a.clone());
        async move { p.unprepare_claim(&a).await }
    });
    until("a's record marked Releasing (or dropped)", || {
        let state = p.checkpoint().read(|cp| cp.get("uid-a").map(|r| r.state));
        let releasing = Some(das_driver::claims::checkpoint::PrepareState::Releasing);
        (state.is_none() || state == releasing).then_some(())
    })
    .await;
    // Time for a wrong release to stop the daemon (it takes milliseconds).
    tokio::time::sleep(Duration::from_millis(300)).await;
    go_on.send(()).unwrap();
    joining.await.unwrap().expect("b joins");
    leaving.await.unwrap().expect("a leaves");
    assert_eq!(node.slices(), slices, "the slice b joined is kept");
    assert_eq!(mps.pid(&node.slice_dirs()), Some(pid), "its daemon ran on");
    assert!(!node.recorded("uid-a") && node.recorded("uid-b"));
    p.unprepare_claim(&b).await.unwrap();
    assert!(node.slices().is_empty());
}

/// One step of [`shares_keep_one_slice_and_daemon_under_random_interleavings`].
#[derive(Debug, Clone, Copy)]
pub(super) enum Step {
    Prepare(usize),
    Unprepare(usize),
    /// Two prepares at once (two shares joining, or a retried prepare beside another's first).
    PrepareBoth(usize, usize),
    /// A prepare beside another share's unprepare (a join racing the last leave).
    PrepareWhileLeaving(usize, usize),
    /// The plugin restarts (its daemons are let go and adopted).
    Restart,
    /// The plugin stops this many microseconds into a prepare (a crash mid-join or mid-create)
    /// and starts again from its checkpoint on disk.
    CrashMidPrepare(usize, u64),
}

/// Claims that may hold a share at once.
pub(super) const SHARES: usize = 4;

pub(super) fn steps(seed: u64, n: usize) -> Vec<Step> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let (i, j) = (rng.random_range(0..SHARES), rng.random_range(0..SHARES));
            match rng.random_range(0..12) {
                0..=2 => Step::Prepare(i),
                3..=5 => Step::Unprepare(i),
                6 => Step::PrepareBoth(i, j),
                7 | 8 => Step::PrepareWhileLeaving(i, j),
                9 => Step::Restart,
                _ => Step::CrashMidPrepare(i, rng.random_range(0..30_000)),
            }
        })
        .collect()
}

/// A seeded sequence of joins, leaves, concurrent joins, joins racing the last leave, restarts
/// and crashes mid-prepare (mid-join, mid-create, mid-daemon-start), on one shared slice; after every step: at most one slice at the placement; while
/// some record holds a share, exactly one slice, every share's record naming it, and one daemon
/// serving it; with none, no slice and no daemon; no destroy ever came while the daemon ran;
/// and the records are exactly the shares whose last call was a successful prepare (a join
/// refused while the last share leaves holds nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_keep_one_slice_and_daemon_under_random_interleavings() {
    for seed in 1..=8 {
        let node = Node::new();
        let mut plugin = Plugin::start(&node);
        let claims: Vec<ClaimRef> = (0..SHARES)
            .map(|i| {
                node.api
                    .allocate_share(&format!("c{i}"), &format!("uid-{i}"), 1, 30)
            })
            .collect();
        let mut held = [false; SHARES];
        for (n, step) in steps(seed, 60).into_iter().enumerate() {
            let at = format!("seed {seed} step {n} {step:?}");
            plugin
                .run(step, &claims, &mut held, &mut |e| {
                    // A join refused while the last share leaves is a share's refusal.
                    if matches!(step, Step::PrepareWhileLeaving(..)) {
                        assert_eq!(e.metric_label(), "share", "{at}: {e}");
                    }
                })
                .await;
            check(&node, &plugin.p, &plugin.mps, &held, &at);
        }
        plugin.finish(&claims).await;
        check(&node, &plugin.p, &plugin.mps, &[false; SHARES], "the end");
    }
}

/// A plugin on a [`Node`] that the random interleavings drive: its daemons, its preparer and
/// what its publisher is told; restarted (its daemons let go and adopted) and crashed by steps.
pub(super) struct Plugin<'a> {
    node: &'a Node,
    pub(super) mps: Arc<MpsDaemons>,
    pub(super) p: Preparer,
    pub(super) facts: tokio::sync::watch::Receiver<das_driver::publish::desired::HealthFacts>,
}

impl<'a> Plugin<'a> {
    /// A plugin's start on `node`.
    pub(super) fn start(node: &'a Node) -> Self {
        let mps = node.daemons(Node::stand_in());
        let p = node.preparer(mps.clone());
        let facts = facts_of(&p);
        Self {
            node,
            mps,
            p,
            facts,
        }
    }

    /// The plugin stops (its daemons let go) and starts again from its checkpoint on disk.
    async fn restart(&mut self) {
        self.mps.let_go().await;
        *self = Self::start(self.node);
        self.p.reconcile_at_startup(false, true).await.unwrap();
    }

    /// Runs `step` on `claims`, keeping in `held` which claims hold their share (a prepare
    /// that succeeded, a crash that kept it whole); each failed prepare is shown to `refused`.
    pub(super) async fn run(
        &mut self,
        step: Step,
        claims: &[ClaimRef],
        held: &mut [bool; SHARES],
        refused: &mut impl FnMut(&das_driver::claims::PrepareError),
    ) {
        let mut note = |r: &Result<_, das_driver::claims::PrepareError>| {
            if let Err(e) = r {
                refused(e);
            }
            r.is_ok()
        };
        match step {
            Step::Prepare(i) => held[i] = note(&self.p.prepare_claim(&claims[i]).await),
            Step::Unprepare(i) => {
                self.p.unprepare_claim(&claims[i]).await.unwrap();
                held[i] = false;
            }
            Step::PrepareBoth(i, j) => {
                let (a, b) = tokio::join!(
                    self.p.prepare_claim(&claims[i]),
                    self.p.prepare_claim(&claims[j])
                );
                held[i] = note(&a);
                held[j] = note(&b) || (i == j && held[i]);
            }
            Step::PrepareWhileLeaving(i, j) if i != j => {
                let (a, b) = tokio::join!(
                    self.p.prepare_claim(&claims[i]),
                    self.p.unprepare_claim(&claims[j])
                );
                b.unwrap();
                held[i] = note(&a);
                held[j] = false;
            }
            Step::PrepareWhileLeaving(..) => {}
            Step::Restart => self.restart().await,
            Step::CrashMidPrepare(i, after) => {
                let prepare = self.p.prepare_claim(&claims[i]);
                let _ = tokio::time::timeout(Duration::from_micros(after), prepare).await;
                // A crash stops everything at once; here the backend calls the dropped
                // prepare had handed to blocking threads finish first (they take well under a
                // millisecond on the emulated GPUs).
                tokio::time::sleep(Duration::from_millis(100)).await;
                self.restart().await;
                // Start-up rolled the prepare back, or kept it whole.
                let uid = format!("uid-{i}");
                held[i] = self.p.checkpoint().read(|cp| cp.get(&uid).is_some());
            }
        }
    }

    /// Unprepares every claim and lets the daemons go.
    pub(super) async fn finish(&mut self, claims: &[ClaimRef]) {
        for c in claims {
            self.p.unprepare_claim(c).await.unwrap();
        }
        self.mps.let_go().await;
    }
}

/// The publisher's facts of preparer `p`, as it reports them.
pub(super) fn facts_of(
    p: &Preparer,
) -> tokio::sync::watch::Receiver<das_driver::publish::desired::HealthFacts> {
    let (tx, rx) = tokio::sync::watch::channel(Default::default());
    p.report_share_namespaces_to(tx);
    rx
}

/// The invariants of [`shares_keep_one_slice_and_daemon_under_random_interleavings`].
pub(super) fn check(node: &Node, p: &Preparer, mps: &MpsDaemons, held: &[bool], at: &str) {
    let slices = node.slices();
    assert!(
        slices.len() <= 1,
        "{at}: two slices at one placement: {slices:?}"
    );
    let recorded: Vec<(String, Option<String>)> = p.checkpoint().read(|cp| {
        cp.claims
            .iter()
            .map(|(uid, r)| (uid.clone(), r.devices[0].mig_uuid().map(str::to_string)))
            .collect()
    });
    let want: Vec<String> = (0..held.len())
        .filter(|&i| held[i])
        .map(|i| format!("uid-{i}"))
        .collect();
    let have: Vec<String> = recorded.iter().map(|(u, _)| u.clone()).collect();
    assert_eq!(have, want, "{at}: the records are not the held shares");
    let dirs = node.slice_dirs();
    match slices.first() {
        Some(s) => {
            assert!(!recorded.is_empty(), "{at}: a slice no share holds");
            for (uid, mig) in &recorded {
                assert_eq!(mig.as_deref(), Some(s.mig_uuid.as_str()), "{at}: {uid}");
            }
            assert!(mps.pid(&dirs).is_some(), "{at}: the slice has no daemon");
            let run = Record::read(&dirs.log)
                .unwrap()
                .runs
                .last()
                .cloned()
                .unwrap();
            assert_eq!(run.visible_devices, s.mig_uuid, "{at}");
        }
        None => {
            assert!(
                recorded.is_empty(),
                "{at}: shares without their slice: {recorded:?}"
            );
            assert!(!dirs.root.exists(), "{at}: a daemon without its slice");
        }
    }
    assert!(
        node.gpus.refused.lock().unwrap().is_empty(),
        "{at}: a destroy came while the slice's daemon ran"
    );
}
