//! A shared slice serves one namespace (docs/design.md §7, "Shares are a tenant's own"),
//! through the preparer with the emulated GPUs and the stand-in daemon: a share from another
//! namespace is refused at prepare and at carve with a message that names the namespace the
//! slice serves, and touches nothing (the slice, its daemon, its limits, the other claims'
//! records); the publisher learns each shared slice's namespace after every change of the
//! records; an admin's opt-in lets namespaces share; and under random interleavings of
//! prepares, unprepares, restarts and crashes of claims of two namespaces, no slice is ever
//! held by both.

use std::collections::BTreeMap;

use das_api::attributes::SHARE_NAMESPACE_SEVERAL;
use das_driver::claims::ApiError;
use das_driver::claims::carve::SLICE_READY;
use das_driver::claims::{Carved, ClaimApi};
use das_driver::publish::desired::HealthFacts;
use tokio::sync::watch;

use super::shares::{Plugin, SHARED, SHARES, check, facts_of, steps};
use super::*;

impl ClaimStore {
    /// Claim `<ns>/<name>` with `uid`, allocated one share of [`SHARED`] with MPS at 30 %.
    async fn allocate_share_in(&self, ns: &str, name: &str, uid: &str) -> ClaimRef {
        self.allocate_share(name, uid, 1, 30);
        let mut rc = self.claim(name).await;
        rc.metadata.namespace = Some(ns.into());
        self.put(rc)
    }

    /// [`Self::allocate_share_in`], allocated with carve before bind's binding condition.
    async fn allocate_carved_share_in(&self, ns: &str, name: &str, uid: &str) -> ClaimRef {
        self.allocate_share_in(ns, name, uid).await;
        let mut rc = self.claim(name).await;
        let results = rc
            .status
            .as_mut()
            .and_then(|s| s.allocation.as_mut())
            .and_then(|a| a.devices.as_mut())
            .and_then(|d| d.results.as_mut())
            .expect("results");
        results[0].binding_conditions = Some(vec![SLICE_READY.to_string()]);
        self.put(rc)
    }

    async fn claim(&self, name: &str) -> ResourceClaim {
        let got: Result<_, ApiError> = self.get_claim("", name).await;
        got.unwrap().expect("the claim")
    }
}

/// What the publisher is told, `SHARED` → namespace, as `facts` last said.
pub(super) fn published(facts: &watch::Receiver<HealthFacts>) -> BTreeMap<String, String> {
    facts.borrow().share_namespaces.clone()
}

fn serving(ns: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(SHARED.to_string(), ns.to_string())])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_from_another_namespace_is_refused_and_touches_nothing() {
    let node = Node::new();
    let mps = node.daemons(Node::stand_in());
    let p = node.preparer(mps.clone());
    let facts = facts_of(&p);
    assert!(published(&facts).is_empty());
    let a = node.api.allocate_share_in("team-a", "a", "uid-a").await;
    p.prepare_claim(&a).await.unwrap();
    // The record of the share is what the publisher puts on the device.
    assert_eq!(published(&facts), serving("team-a"));
    let (slices, dirs) = (node.slices(), node.slice_dirs());
    let pid = mps.pid(&dirs).unwrap();
    let record_a = p.checkpoint().read(|cp| cp.get("uid-a").cloned());

    let b = node.api.allocate_share_in("team-b", "b", "uid-b").await;
    let e = p.prepare_claim(&b).await.unwrap_err();
    assert_eq!(e.metric_label(), "share", "{e}");
    let text = e.to_string();
    for part in [
        SHARED,
        "serves namespace team-a",
        "claim team-a/a",
        "namespace team-b may not join",
    ] {
        assert!(text.contains(part), "{part:?} missing: {text}");
    }
    // Nothing touched: no record, no CDI spec, the same slice, daemon, limits and record of a.
    assert!(!node.recorded("uid-b") && node.recorded("uid-a"));
    assert_eq!(node.slices(), slices);
    assert_eq!(mps.pid(&dirs), Some(pid));
    let runs = Record::read(&dirs.log).unwrap().runs;
    assert_eq!(runs.len(), 1, "the daemon was started again: {runs:?}");
    assert_eq!(runs[0].commands, limits(), "the daemon got other commands");
    assert_eq!(p.checkpoint().read(|cp| cp.get("uid-a").cloned()), record_a);
    let specs = std::fs::read_dir(node.dir.path().join("cdi")).unwrap();
    assert!(
        !specs
            .flatten()
            .any(|e| e.file_name().to_string_lossy().contains("uid-b")),
        "a CDI spec for the refused share"
    );
    assert_eq!(published(&facts), serving("team-a"));

    // A claim of the same namespace joins.
    let a2 = node.api.allocate_share_in("team-a", "a2", "uid-a2").await;
    p.prepare_claim(&a2).await.unwrap();
    assert_eq!(node.slices(), slices);
    // The last share leaves: the device serves nobody, and team-b's share gets a slice.
    p.unprepare_claim(&a).await.unwrap();
    assert_eq!(published(&facts), serving("team-a"));
    p.unprepare_claim(&a2).await.unwrap();
    assert!(published(&facts).is_empty());
    p.prepare_claim(&b).await.unwrap();
    assert_eq!(published(&facts), serving("team-b"));
    p.unprepare_claim(&b).await.unwrap();
    assert!(node.slices().is_empty() && published(&facts).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_carve_of_a_share_from_another_namespace_fails_the_carve_and_touches_nothing() {
    let node = Node::new();
    let mps = node.daemons(Node::stand_in());
    let p = node.preparer(mps.clone());
    let a = node
        .api
        .allocate_carved_share_in("team-a", "a", "uid-a")
        .await;
    assert_eq!(p.carve_claim(&a).await.unwrap(), Carved::Ready);
    let slices = node.slices();
    assert_eq!(slices.len(), 1);
    // The scheduler gave team-b's claim the same device before the attribute steered it away:
    // its carve fails (SliceFailed, so the scheduler allocates it again) and leaves nothing.
    let b = node
        .api
        .allocate_carved_share_in("team-b", "b", "uid-b")
        .await;
    match p.carve_claim(&b).await.unwrap() {
        Carved::Failed(message) => assert!(
            message.contains("serves namespace team-a") && message.contains("claim team-a/a"),
            "{message}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(!node.recorded("uid-b") && node.recorded("uid-a"));
    assert_eq!(node.slices(), slices);
    // The carved share is prepared as usual.
    p.prepare_claim(&a).await.unwrap();
    p.unprepare_claim(&a).await.unwrap();
    assert!(node.slices().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_cross_namespaces_only_where_the_admin_allows_it() {
    let node = Node::new();
    let mps = node.daemons(Node::stand_in());
    let across = SharePolicy {
        across_namespaces: true,
        ..SharePolicy::default()
    };
    let p = node.preparer_with(mps.clone(), across);
    let facts = facts_of(&p);
    let a = node.api.allocate_share_in("team-a", "a", "uid-a").await;
    let b = node.api.allocate_share_in("team-b", "b", "uid-b").await;
    p.prepare_claim(&a).await.unwrap();
    p.prepare_claim(&b).await.unwrap();
    assert_eq!(node.slices().len(), 1, "two slices for two namespaces");
    // No attribute to steer by: the publisher is told nothing.
    assert!(published(&facts).is_empty());

    // The admin turns the rule on again: the slice both hold serves neither any more (no
    // value a namespace has), and a new share of either is refused until they are gone.
    mps.let_go().await;
    drop(p);
    let mps = node.daemons(Node::stand_in());
    let p = node.preparer(mps.clone());
    let facts = facts_of(&p);
    p.reconcile_at_startup(false, true).await.unwrap();
    assert_eq!(published(&facts), serving(SHARE_NAMESPACE_SEVERAL));
    let a2 = node.api.allocate_share_in("team-a", "a2", "uid-a2").await;
    let e = p.prepare_claim(&a2).await.unwrap_err();
    assert!(
        e.to_string().contains("team-a and team-b"),
        "the holders' namespaces: {e}"
    );
    // A completed share answers a retried prepare as before.
    p.prepare_claim(&a).await.unwrap();
    p.unprepare_claim(&a).await.unwrap();
    p.unprepare_claim(&b).await.unwrap();
    assert!(node.slices().is_empty() && published(&facts).is_empty());
    mps.let_go().await;
}

/// The namespace of claim `i` of the random interleavings: two of each.
pub(super) fn namespace(i: usize) -> &'static str {
    if i < SHARES / 2 { "team-a" } else { "team-b" }
}

/// [`super::shares::shares_keep_one_slice_and_daemon_under_random_interleavings`] with the
/// claims in two namespaces: after every step, besides its invariants, the shares held are of
/// one namespace, and the publisher was told that namespace (nothing with no share held),
/// whichever path changed the records (prepare, refusal, unprepare, start-up after a crash).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_of_two_namespaces_never_hold_one_slice_under_random_interleavings() {
    for seed in 11..=18 {
        let node = Node::new();
        let mut plugin = Plugin::start(&node);
        let mut claims = Vec::new();
        for i in 0..SHARES {
            let (name, uid) = (format!("c{i}"), format!("uid-{i}"));
            claims.push(node.api.allocate_share_in(namespace(i), &name, &uid).await);
        }
        let mut held = [false; SHARES];
        let mut refusals = 0;
        for (n, step) in steps(seed, 60).into_iter().enumerate() {
            let at = format!("seed {seed} step {n} {step:?}");
            plugin
                .run(step, &claims, &mut held, &mut |e| {
                    assert_eq!(e.metric_label(), "share", "{at}: {e}");
                    refusals += usize::from(e.to_string().contains("serves namespace"));
                })
                .await;
            check(&node, &plugin.p, &plugin.mps, &held, &at);
            let namespaces: std::collections::BTreeSet<&str> =
                (0..SHARES).filter(|&i| held[i]).map(namespace).collect();
            assert!(namespaces.len() <= 1, "{at}: one slice, two namespaces");
            let want = namespaces.first().map(|ns| serving(ns)).unwrap_or_default();
            assert_eq!(
                published(&plugin.facts),
                want,
                "{at}: what the publisher was told"
            );
        }
        assert!(
            refusals > 0,
            "seed {seed}: no share was ever refused for its namespace"
        );
        plugin.finish(&claims).await;
        check(&node, &plugin.p, &plugin.mps, &[false; SHARES], "the end");
        assert!(published(&plugin.facts).is_empty());
    }
}
