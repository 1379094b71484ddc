use super::*;
use crate::mirror::{DeviceIndex, desired_allocation_claims};
use das_api::allocation::AllocationState;
use k8s_openapi::api::resource::v1::ResourceSlice;

const NOW: &str = "2026-01-01T00:00:00Z";
const DEVICE: &str = "gpu-0-mig-1g-10gb-6";

/// The claim as the API server has it after each step of a pod's start, in order: created by
/// the resourceclaim controller, the scheduler's finalizer, allocated and reserved (one status
/// update), the node plugin's ready device.
pub(super) fn claim_versions() -> Vec<ResourceClaim> {
    let created = json!({
        "metadata": {"name": "p-mig-x", "namespace": "ns", "uid": "claim-uid"},
        "spec": {"devices": {"requests": []}}
    });
    let mut finalizer = created.clone();
    finalizer["metadata"]["finalizers"] = json!(["resource.kubernetes.io/delete-protection"]);
    let mut allocated = finalizer.clone();
    allocated["status"] = json!({
        "allocation": {"devices": {"results": [
            {"request": "mig", "driver": DRIVER_NAME, "pool": "n0", "device": DEVICE}]}},
        "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid"}]
    });
    let mut ready = allocated.clone();
    ready["status"]["devices"] = json!([{"driver": DRIVER_NAME, "pool": "n0", "device": DEVICE,
        "conditions": [{"type": "Ready", "status": "True", "reason": "SliceCreated",
            "message": "", "lastTransitionTime": NOW}],
        "data": {"migUUID": "MIG-1", "gpuUUID": "GPU-a", "profile": "1g.10gb",
            "placement": {"start": 6, "size": 1}, "readyTime": "2026-01-01T00:00:00.250Z"}}]);
    [created, finalizer, allocated, ready]
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect()
}

/// The pod after each step: created from a template, its generated claim recorded, bound, then
/// three kubelet status updates (nothing the mirror reads).
pub(super) fn pod_versions() -> Vec<Pod> {
    let created = json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "pod-uid"},
        "spec": {"containers": [{"name": "c", "resources": {"claims": [{"name": "mig"}]}}],
            "resourceClaims": [{"name": "mig", "resourceClaimTemplateName": "t"}]}
    });
    let mut with_claim = created.clone();
    with_claim["status"] =
        json!({"resourceClaimStatuses": [{"name": "mig", "resourceClaimName": "p-mig-x"}]});
    let mut bound = with_claim.clone();
    bound["spec"]["nodeName"] = json!("n0");
    let mut versions = vec![created, with_claim, bound.clone()];
    for phase in ["Pending", "Running", "Running"] {
        let mut v = versions.last().unwrap().clone();
        v["status"]["phase"] = json!(phase);
        v["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
        versions.push(v);
    }
    versions
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect()
}

fn index() -> DeviceIndex {
    let slice: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": "n0-slice"},
        "spec": {"driver": DRIVER_NAME, "nodeName": "n0",
            "pool": {"name": "n0", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": DEVICE, "attributes": {
                "profile": {"string": "1g.10gb"}, "parentUUID": {"string": "GPU-a"},
                "placementStart": {"int": 6}, "placementSize": {"int": 1}}}]}
    }))
    .unwrap();
    DeviceIndex::from_slices([&slice])
}

/// The one AllocationClaim the mirror wants for the cached `claim` and `pod`, if any.
pub(super) fn desired_one(
    claim: Option<&ResourceClaim>,
    pod: Option<&Pod>,
) -> Option<AllocationClaim> {
    let pods: Vec<Pod> = pod.into_iter().cloned().collect();
    desired_allocation_claims(claim?, &pods, &index(), NOW)
        .claims
        .into_iter()
        .next()
}

/// One delivered watch event: a claim or pod version, by index into the sequences above.
#[derive(Debug, Clone, Copy)]
enum Delivery {
    Claim(usize),
    Pod(usize),
}

/// The controller against one interleaving of the two watches, with a reconcile run at once on
/// every trigger, reading the caches as they are then (each cache is updated before its event
/// is delivered, as with kube's shared reflectors). Our writes come back as AllocationClaim
/// events right after the reconcile. Returns the number of reconciles, the AllocationClaim as
/// last written, and what the final caches want.
struct Model {
    triggers: Triggers,
    claims: Vec<ResourceClaim>,
    pods: Vec<Pod>,
    claim: Option<ResourceClaim>,
    pod: Option<Pod>,
    stored: Option<AllocationClaim>,
    rv: u64,
    reconciles: usize,
}

impl Model {
    fn new() -> Self {
        Self {
            triggers: Triggers::default(),
            claims: claim_versions(),
            pods: pod_versions(),
            claim: None,
            pod: None,
            stored: None,
            rv: 0,
            reconciles: 0,
        }
    }

    fn desired(&self) -> Option<AllocationClaim> {
        desired_one(self.claim.as_ref(), self.pod.as_ref())
    }

    fn reconcile(&mut self) {
        self.reconciles += 1;
        let Some(mut desired) = self.desired() else {
            return;
        };
        let same = self.stored.as_ref().is_some_and(|s| {
            s.spec == desired.spec
                && s.status.as_ref().map(|x| x.state) == desired.status.as_ref().map(|x| x.state)
        });
        if same {
            return;
        }
        self.rv += 1;
        desired.metadata.resource_version = Some(self.rv.to_string());
        self.triggers.own_writes.record(&desired);
        self.stored = Some(desired.clone());
        // The write comes back through the AllocationClaim watch.
        if self.triggers.on_allocation_claim(&desired) {
            self.reconcile();
        }
    }

    fn deliver(&mut self, d: Delivery) {
        match d {
            Delivery::Claim(i) => {
                let c = self.claims[i].clone();
                self.claim = Some(c.clone());
                if self.triggers.on_claim(&c) {
                    self.reconcile();
                }
            }
            Delivery::Pod(i) => {
                let p = self.pods[i].clone();
                self.pod = Some(p.clone());
                let cached = self.claim.clone();
                let targets = self.triggers.on_pod(&p, |r| {
                    cached.as_ref().is_some_and(|c| {
                        r.name == c.name_any() && !our_results(c).collect::<Vec<_>>().is_empty()
                    })
                });
                for _ in targets {
                    self.reconcile();
                }
            }
        }
    }

    fn stored_state(&self) -> Option<AllocationState> {
        self.stored.as_ref()?.status.as_ref().map(|s| s.state)
    }
}

/// Every interleaving of `a` and `b` that keeps each one's order.
fn interleavings(a: &[Delivery], b: &[Delivery]) -> Vec<Vec<Delivery>> {
    match (a.split_first(), b.split_first()) {
        (None, _) => vec![b.to_vec()],
        (_, None) => vec![a.to_vec()],
        (Some((x, ra)), Some((y, rb))) => {
            let mut out = Vec::new();
            for mut rest in interleavings(ra, b) {
                rest.insert(0, *x);
                out.push(rest);
            }
            for mut rest in interleavings(a, rb) {
                rest.insert(0, *y);
                out.push(rest);
            }
            out
        }
    }
}

#[test]
fn a_pod_start_in_real_order_takes_three_reconciles() {
    use Delivery::*;
    let mut m = Model::new();
    // As the API server sees it: pod created, claim created, claim recorded in the pod, the
    // scheduler's finalizer and allocation, bind, the plugin's ready device, kubelet updates.
    for d in [
        Pod(0),
        Claim(0),
        Pod(1),
        Claim(1),
        Claim(2),
        Pod(2),
        Pod(3),
        Claim(3),
        Pod(4),
        Pod(5),
    ] {
        m.deliver(d);
    }
    assert_eq!(m.reconciles, 3, "staged, created, inUse");
    assert_eq!(m.stored_state(), Some(AllocationState::InUse));
    assert_eq!(
        m.rv, 3,
        "one write per state (the model folds object and status)"
    );
}

#[test]
fn every_interleaving_of_the_two_watches_converges_with_at_most_three_reconciles() {
    use Delivery::*;
    let claims: Vec<_> = (0..4).map(Claim).collect();
    let pods: Vec<_> = (0..6).map(Pod).collect();
    let all = interleavings(&claims, &pods);
    assert_eq!(all.len(), 210, "C(10, 4)");
    let mut most = 0;
    for order in all {
        let mut m = Model::new();
        for d in &order {
            m.deliver(*d);
        }
        let want = m.desired().unwrap();
        let got = m
            .stored
            .as_ref()
            .unwrap_or_else(|| panic!("nothing written: {order:?}"));
        assert_eq!(got.spec, want.spec, "{order:?}");
        assert_eq!(
            m.stored_state(),
            Some(AllocationState::InUse),
            "the last reconcile saw the final caches: {order:?}"
        );
        assert!(got.spec.pod_ref.is_some(), "{order:?}");
        // At most one reconcile per change of the mirror's inputs: allocation, pod bound,
        // device ready (two when the binding is delivered before the allocation).
        assert!(
            m.reconciles <= 3,
            "{} reconciles for {order:?}",
            m.reconciles
        );
        most = most.max(m.reconciles);
    }
    assert_eq!(most, 3);
}

#[test]
fn claim_fingerprint_sees_only_what_the_mirror_reads() {
    let v = claim_versions();
    assert_eq!(
        claim_fingerprint(&v[0]),
        None,
        "not allocated: nothing to mirror"
    );
    assert_eq!(
        claim_fingerprint(&v[1]),
        None,
        "a finalizer is not a change"
    );
    let allocated = claim_fingerprint(&v[2]).unwrap();
    let ready = claim_fingerprint(&v[3]).unwrap();
    assert_ne!(allocated, ready);

    let mut labelled = v[3].clone();
    labelled.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
    labelled.metadata.resource_version = Some("99".into());
    assert_eq!(claim_fingerprint(&labelled), Some(ready));

    let mut not_ready = v[3].clone();
    not_ready.status.as_mut().unwrap().devices.as_mut().unwrap()[0]
        .conditions
        .as_mut()
        .unwrap()[0]
        .status = "False".into();
    assert_ne!(claim_fingerprint(&not_ready), Some(ready));

    let mut released = v[3].clone();
    released.status.as_mut().unwrap().reserved_for = None;
    assert_ne!(claim_fingerprint(&released), Some(ready));

    let mut deleting = v[0].clone();
    deleting.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-01-01T00:00:00Z".parse().unwrap(),
        ));
    assert!(
        claim_fingerprint(&deleting).is_some(),
        "a deletion is a change"
    );

    let mut other_driver = v[2].clone();
    let alloc = other_driver
        .status
        .as_mut()
        .unwrap()
        .allocation
        .as_mut()
        .unwrap();
    alloc.devices.as_mut().unwrap().results.as_mut().unwrap()[0].driver = "gpu.example.com".into();
    assert_eq!(claim_fingerprint(&other_driver), None);
}

#[test]
fn pod_fingerprint_is_the_binding_of_a_pod_with_claims() {
    let v = pod_versions();
    assert_eq!(pod_fingerprint(&v[0]), None, "no claim resolved yet");
    assert_eq!(pod_fingerprint(&v[1]), None, "claims recorded, not bound");
    let bound = pod_fingerprint(&v[2]).unwrap();
    for later in &v[3..] {
        assert_eq!(
            pod_fingerprint(later),
            Some(bound),
            "kubelet status updates"
        );
    }
    let mut elsewhere = v[2].clone();
    elsewhere.spec.as_mut().unwrap().node_name = Some("n1".into());
    assert_ne!(pod_fingerprint(&elsewhere), Some(bound));
    let mut no_claims = v[2].clone();
    no_claims.spec.as_mut().unwrap().resource_claims = None;
    no_claims.status = None;
    assert_eq!(pod_fingerprint(&no_claims), None, "a pod without claims");
}

#[test]
fn fingerprints_report_changes_and_forget_deleted_objects() {
    let f = Fingerprints::default();
    assert!(!f.changed("a", None), "first sight with nothing to mirror");
    assert!(f.changed("a", Some(1)));
    assert!(!f.changed("a", Some(1)));
    assert!(f.changed("a", Some(2)));
    assert!(
        f.changed("a", None),
        "back to nothing to mirror is a change"
    );
    assert!(f.is_empty());
    assert!(f.changed("a", Some(1)) && f.changed("b", Some(1)));
    f.retain(|uid| uid == "b");
    assert_eq!(f.len(), 1);
    assert!(f.changed("a", Some(1)), "a forgotten object is new again");
}

#[test]
fn only_our_own_writes_are_echoes() {
    let own = OwnWrites::default();
    let at = |state: &str, rv: &str| {
        let mut a: AllocationClaim = serde_json::from_value(json!({
            "apiVersion": "inference.redhat.com/v1alpha1",
            "kind": "AllocationClaim", "metadata": {"name": "x", "namespace": "ns"},
            "spec": {"profile": "1g.10gb", "gpuUUID": "GPU-a",
                "migPlacement": {"start": 0, "size": 1}, "nodename": "n0",
                "resourceClaimRef": {"name": "c", "uid": "u"},
                "request": "mig", "pool": "n0", "device": "d"},
            "status": {"state": state, "conditions": []}}))
        .unwrap();
        a.metadata.resource_version = Some(rv.into());
        a
    };
    // Recorded before the write: the watch may deliver the event before the response.
    own.record(&at("staged", ""));
    own.record(&at("created", ""));
    assert!(own.is_echo(&at("staged", "10")) && own.is_echo(&at("created", "11")));
    assert!(
        !own.is_echo(&at("inUse", "12")),
        "someone else's write reconciles the owner"
    );
    for i in 0..OWN_WRITES_KEPT {
        let mut other = at("inUse", "");
        other.spec.profile = format!("{i}g.10gb");
        own.record(&other);
    }
    assert!(
        !own.is_echo(&at("staged", "13")),
        "only the last few writes are kept"
    );
    own.retain(&HashMap::new());
    assert!(!own.is_echo(&at("inUse", "14")));
}

#[test]
fn pods_map_to_their_claims() {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"containers": [], "resourceClaims": [
            {"name": "a", "resourceClaimName": "shared"},
            {"name": "b", "resourceClaimTemplateName": "t"}]},
        "status": {"resourceClaimStatuses": [{"name": "b", "resourceClaimName": "p-b-x1"}]}
    }))
    .unwrap();
    let names: Vec<_> = claims_of_pod(&pod)
        .into_iter()
        .map(|r| r.to_string())
        .collect();
    assert_eq!(names.len(), 2);
    assert!(
        names
            .iter()
            .any(|n| n.contains("ns") && n.contains("p-b-x1"))
    );
    assert!(names.iter().any(|n| n.contains("shared")));
}
