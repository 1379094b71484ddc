//! [`OwnWrites`] as the freshest view: unit tests, and the controller against every delivery
//! order of the claim, pod and AllocationClaim watches, with the AllocationClaim cache lagging
//! behind the controller's own writes as it does in a burst.

use super::tests::{claim_versions, desired_one, pod_versions};
use super::*;
use crate::mirror::{carry_transition_time, object_apply, writes_needed};
use das_api::allocation::AllocationState;

const KEY: &str = "ns/x";

fn alloc(state: &str, rv: &str, owner: &str) -> AllocationClaim {
    let mut a: AllocationClaim = serde_json::from_value(json!({
        "apiVersion": "inference.redhat.com/v1alpha1",
        "kind": "AllocationClaim",
        "metadata": {"name": "x", "namespace": "ns", "ownerReferences": [{
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "name": "c",
            "uid": owner, "controller": true}]},
        "spec": {"profile": "1g.10gb", "gpuUUID": "GPU-a",
            "migPlacement": {"start": 0, "size": 1}, "nodename": "n0",
            "resourceClaimRef": {"name": "c", "uid": owner},
            "request": "mig", "pool": "n0", "device": "d"},
        "status": {"state": state, "conditions": []}}))
    .unwrap();
    a.metadata.resource_version = Some(rv.into());
    a
}

fn state(a: &Option<Arc<AllocationClaim>>) -> Option<(String, AllocationState)> {
    let a = a.as_ref()?;
    Some((
        a.metadata.resource_version.clone()?,
        a.status.as_ref()?.state,
    ))
}

#[test]
fn the_last_response_stands_in_until_the_cache_shows_it() {
    let own = OwnWrites::default();
    let cached = |s: &str, rv: &str| Some(Arc::new(alloc(s, rv, "u")));
    assert_eq!(state(&own.freshest(KEY, "u", None)), None, "nothing known");
    own.record(&alloc("staged", "", "u"));
    own.wrote(alloc("staged", "4", "u"));
    own.record(&alloc("created", "", "u"));
    own.wrote(alloc("created", "5", "u"));
    let created = Some(("5".to_string(), AllocationState::Created));
    assert_eq!(
        state(&own.freshest(KEY, "u", None)),
        created,
        "the cache has not seen the object yet"
    );
    assert_eq!(
        state(&own.freshest(KEY, "u", cached("staged", "4"))),
        created,
        "the cache shows an older write of ours"
    );
    assert_eq!(
        state(&own.freshest(KEY, "u", cached("created", "5"))),
        created
    );
    assert_eq!(
        state(&own.freshest(KEY, "u", cached("inUse", "6"))),
        Some(("6".to_string(), AllocationState::InUse)),
        "someone else's change wins: drift is put back from it"
    );
    assert_eq!(
        state(&own.freshest(KEY, "other-claim", None)),
        None,
        "a response about an earlier claim of the same name does not count"
    );

    // The sweep: the cache caught up, so the response is dropped; the echoes stay.
    own.retain(&HashMap::from([(KEY.to_string(), Some("5".to_string()))]));
    assert_eq!(state(&own.freshest(KEY, "u", None)), None);
    assert!(own.is_echo(&alloc("created", "5", "u")));

    own.wrote(alloc("inUse", "7", "u"));
    own.retain(&HashMap::new());
    assert_eq!(
        state(&own.freshest(KEY, "u", None)).map(|s| s.1),
        Some(AllocationState::InUse),
        "a young response the cache has not shown is kept"
    );
    own.forget_latest(KEY);
    assert_eq!(state(&own.freshest(KEY, "u", None)), None, "a failed write");
}

/// One step of a run: deliver the next claim version, the next pod version, or the oldest
/// undelivered AllocationClaim write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Step {
    Claim,
    Pod,
    Echo,
}

/// The controller (as `reconcile::mirror_claim` and `apply` do it) against an API server that
/// stores one AllocationClaim, with a reconcile run at once on every trigger. Each write is
/// delivered to the AllocationClaim cache only when a schedule says so, so the cache may lag
/// behind any number of writes.
struct Lagging {
    triggers: Triggers,
    claims: Vec<ResourceClaim>,
    pods: Vec<Pod>,
    next: (usize, usize),
    claim: Option<ResourceClaim>,
    pod: Option<Pod>,
    cache: Option<Arc<AllocationClaim>>,
    server: Option<AllocationClaim>,
    undelivered: VecDeque<AllocationClaim>,
    rv: u64,
    reconciles: usize,
    object_writes: usize,
    status_writes: usize,
}

impl Lagging {
    fn new(claims: Vec<ResourceClaim>, pods: Vec<Pod>) -> Self {
        Self {
            triggers: Triggers::default(),
            claims,
            pods,
            next: (0, 0),
            claim: None,
            pod: None,
            cache: None,
            server: None,
            undelivered: VecDeque::new(),
            rv: 0,
            reconciles: 0,
            object_writes: 0,
            status_writes: 0,
        }
    }

    fn desired(&self) -> Option<AllocationClaim> {
        desired_one(self.claim.as_ref(), self.pod.as_ref())
    }

    /// The API server stores `object` under a new resourceVersion and answers with it.
    fn store(&mut self, mut object: AllocationClaim) {
        self.rv += 1;
        object.metadata.resource_version = Some(self.rv.to_string());
        self.server = Some(object.clone());
        self.undelivered.push_back(object.clone());
        self.triggers.own_writes.wrote(object);
    }

    fn reconcile(&mut self) {
        self.reconciles += 1;
        let Some(mut desired) = self.desired() else {
            return;
        };
        let key = allocation_claim_key(&desired);
        let current = self
            .triggers
            .own_writes
            .freshest(&key, "claim-uid", self.cache.clone());
        if let Some(c) = &current {
            carry_transition_time(&mut desired, c);
        }
        let w = writes_needed(&desired, current.as_deref());
        if w.object {
            let (_, intended) = object_apply(&desired, current.as_deref());
            self.triggers.own_writes.record(&intended);
            // The server keeps the status it has, whatever the controller thought it was.
            let (_, object) = object_apply(&desired, self.server.as_ref());
            self.object_writes += 1;
            self.store(object);
        }
        if w.status {
            self.triggers.own_writes.record(&desired);
            let mut object = self
                .server
                .clone()
                .expect("status written after the object");
            object.status = desired.status.clone();
            self.status_writes += 1;
            self.store(object);
        }
    }

    fn steps(&self) -> Vec<Step> {
        let mut s = Vec::new();
        if self.next.0 < self.claims.len() {
            s.push(Step::Claim);
        }
        if self.next.1 < self.pods.len() {
            s.push(Step::Pod);
        }
        if !self.undelivered.is_empty() {
            s.push(Step::Echo);
        }
        s
    }

    fn run(&mut self, step: Step) {
        match step {
            Step::Claim => {
                let c = self.claims[self.next.0].clone();
                self.next.0 += 1;
                self.claim = Some(c.clone());
                if self.triggers.on_claim(&c) {
                    self.reconcile();
                }
            }
            Step::Pod => {
                let p = self.pods[self.next.1].clone();
                self.next.1 += 1;
                self.pod = Some(p.clone());
                let mirrored = self
                    .claim
                    .as_ref()
                    .is_some_and(|c| crate::mirror::results_to_mirror(c).len() == 1);
                for _ in self.triggers.on_pod(&p, |_| mirrored) {
                    self.reconcile();
                }
            }
            Step::Echo => {
                let a = self.undelivered.pop_front().expect("a write to deliver");
                self.cache = Some(Arc::new(a.clone()));
                if self.triggers.on_allocation_claim(&a) {
                    self.reconcile();
                }
            }
        }
    }
}

/// Runs `check` on the end state of every schedule of `Lagging` (stateless search: each
/// schedule is replayed from the start, following a prefix of choices, then the first choice).
fn every_schedule(
    claims: &[ResourceClaim],
    pods: &[Pod],
    mut check: impl FnMut(&Lagging, &[Step]),
) -> usize {
    // (choice, options) per step of the last run.
    let mut prefix: Vec<(usize, usize)> = Vec::new();
    let mut runs = 0;
    loop {
        let mut m = Lagging::new(claims.to_vec(), pods.to_vec());
        let mut taken = Vec::new();
        let mut choices = Vec::new();
        loop {
            let options = m.steps();
            if options.is_empty() {
                break;
            }
            let choice = prefix.get(choices.len()).map_or(0, |c| c.0);
            choices.push((choice, options.len()));
            taken.push(options[choice]);
            m.run(options[choice]);
        }
        check(&m, &taken);
        runs += 1;
        prefix = choices;
        // The next schedule: the last step with an untried option takes the next one.
        while let Some((choice, options)) = prefix.pop() {
            if choice + 1 < options {
                prefix.push((choice + 1, options));
                break;
            }
        }
        if prefix.is_empty() {
            return runs;
        }
    }
}

/// Writes and reconciles for the claim and pod deliveries of `order` when the cache shows each
/// write at once: what the controller costs with no lag.
fn without_lag(claims: &[ResourceClaim], pods: &[Pod], order: &[Step]) -> (usize, usize, usize) {
    let mut m = Lagging::new(claims.to_vec(), pods.to_vec());
    for step in order.iter().filter(|s| **s != Step::Echo) {
        m.run(*step);
        while !m.undelivered.is_empty() {
            m.run(Step::Echo);
        }
    }
    (m.object_writes, m.status_writes, m.reconciles)
}

#[test]
fn a_cache_behind_our_writes_costs_no_extra_write_or_reconcile() {
    // The pod: created, its claim recorded, bound, one kubelet update (the others change
    // nothing more the mirror reads).
    let pods: Vec<Pod> = pod_versions().into_iter().take(4).collect();
    let claims = claim_versions();
    let mut no_lag = HashMap::new();
    let mut most = (0, 0, 0);
    let runs = every_schedule(&claims, &pods, |m, order| {
        let server = m.server.as_ref().unwrap_or_else(|| panic!("{order:?}"));
        let want = m.desired().unwrap();
        assert_eq!(server.spec, want.spec, "{order:?}");
        assert_eq!(
            server.status.as_ref().map(|s| s.state),
            Some(AllocationState::InUse),
            "{order:?}"
        );
        let key: Vec<Step> = order.iter().copied().filter(|s| *s != Step::Echo).collect();
        let expected = *no_lag
            .entry(key)
            .or_insert_with_key(|k| without_lag(&claims, &pods, k));
        let got = (m.object_writes, m.status_writes, m.reconciles);
        assert_eq!(
            got, expected,
            "(object writes, status writes, reconciles) as without lag: {order:?}"
        );
        assert!(got.2 <= 3, "{order:?}");
        most = most.max(got);
    });
    assert!(runs > 1000, "{runs} schedules");
    // The podRef is known only once the pod is cached: when the claim is allocated and ready
    // before that, the object is written again with it.
    assert_eq!(most, (2, 3, 3));
}
