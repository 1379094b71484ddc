//! The sweep: every few seconds, deletes AllocationClaims whose ResourceClaim is gone (the
//! garbage collector does too, through the owner reference; the sweep covers a cluster without
//! it and makes a restarted controller converge at once) or no longer has that device allocated
//! (a claim deallocated while no controller ran starts no reconcile: its fingerprint is
//! "nothing to mirror" from the first sight). It also sets the per-state gauge and lets the
//! trigger filters forget deleted objects.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use das_api::allocation::{AllocationClaim, AllocationState};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};

use crate::metrics::Metrics;
use crate::mirror::desired_names;
use crate::reconcile::delete_allocation_claim;
use crate::triggers::{Triggers, allocation_claim_key};

/// What the sweep reads and writes.
pub struct Sweep {
    /// Deletes go through it.
    pub client: Client,
    /// The controller's ResourceClaim store.
    pub claims: Store<ResourceClaim>,
    /// Every AllocationClaim.
    pub allocs: Store<AllocationClaim>,
    /// Pods (for the pod fingerprints to keep).
    pub pods: Store<Pod>,
    /// Deletes and the per-state gauge are counted here.
    pub metrics: Arc<Metrics>,
    /// The trigger filters, told which objects are gone.
    pub triggers: Arc<Triggers>,
}

/// Every few seconds, once the caches are synced: deletes AllocationClaims no live allocation
/// wants, updates the per-state gauge and forgets the fingerprints of deleted objects.
pub async fn sweep_loop(s: Sweep) {
    let _ = tokio::join!(
        s.claims.wait_until_ready(),
        s.allocs.wait_until_ready(),
        s.pods.wait_until_ready()
    );
    loop {
        sweep(&s).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Whether `a` mirrors a device `claims` still has allocated: its owner is live and allocated
/// that device.
fn still_wanted(a: &AllocationClaim, claims: &HashMap<String, Arc<ResourceClaim>>) -> bool {
    a.owner_references()
        .iter()
        .filter_map(|o| claims.get(&o.uid))
        .any(|c| desired_names(c).contains(&a.name_any()))
}

/// One pass; a failed delete is logged and tried again on the next pass.
pub async fn sweep(s: &Sweep) {
    // AllocationClaims first: each was written from a claim the claim cache held before, so the
    // claims read after them are at least that new, and a just-mirrored allocation is wanted.
    let allocs = s.allocs.state();
    let live: HashMap<String, Arc<ResourceClaim>> = s
        .claims
        .state()
        .into_iter()
        .filter_map(|c| Some((c.uid()?, c)))
        .collect();
    let mut counts: HashMap<AllocationState, i64> = HashMap::new();
    for a in &allocs {
        if let Some(st) = a.status.as_ref() {
            *counts.entry(st.state).or_default() += 1;
        }
        if still_wanted(a, &live) {
            continue;
        }
        let api: Api<AllocationClaim> =
            Api::namespaced(s.client.clone(), &a.namespace().unwrap_or_default());
        s.triggers
            .own_writes
            .forget_latest(&allocation_claim_key(a));
        match delete_allocation_claim(&api, &a.name_any(), &s.metrics).await {
            Ok(true) => {
                tracing::info!(allocation_claim = %a.name_any(), "deleted: no live allocation of its ResourceClaim wants it");
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "sweep"),
        }
    }
    let counts: Vec<_> = counts.into_iter().collect();
    s.metrics.set_claims(&counts);
    let t = &s.triggers;
    t.claims.retain(|uid| live.contains_key(uid));
    let pods: HashSet<String> = s.pods.state().iter().filter_map(|p| p.uid()).collect();
    t.pods.retain(|uid| pods.contains(uid));
    let cached: HashMap<String, Option<String>> = allocs
        .iter()
        .map(|a| (allocation_claim_key(a), a.metadata.resource_version.clone()))
        .collect();
    t.own_writes.retain(&cached);
}
