//! The watch of carve before bind ([`super::carve`]): every ResourceClaim of the cluster (a watch of all
//! namespaces; the API server cannot select claims by node), filtered here to those with a DAS
//! result in this node's pool; run only with `--carve-before-bind`. Each claim seen is decided
//! by [`super::carve::on_claim_seen`]: a claim that waits for its carve is carved, a carved claim no
//! longer allocated here as recorded is released; a claim deleted, or missing from a fresh
//! listing, releases its carved record. The carves and releases run as tasks (one per claim at
//! a time), so a slow create never holds up the watch; the [`Preparer`]'s calls decide again
//! under the claim's lock with a fresh read of the claim, so a stale event does no harm. A call
//! whose claim cannot be read is retried with backoff ([`READ_RETRY`] doubling to
//! [`READ_RETRY_MAX`]) until the read works or the watch stops: a carved MIG instance is never left
//! behind because the API server was away for a while. And the record of a claim the kubelet
//! holds learns the pods the claim is reserved for from every event of it (a pod that reserves
//! a prepared claim never reaches a prepare; docs/design.md §7, "A slice leaves its claim").
//!
//! A cheaper way to learn of allocations, a watch of the controller's AllocationClaims selected
//! by node (docs/benchmarks.md, "Learning of allocations"), would make every carve wait for the
//! controller and fail with it; the ResourceClaim watch needs nothing but the API server.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::carve::{OnClaimSeen, claim_ref, on_claim_seen};
use crate::claims::checkpoint::{ClaimRecord, PrepareState};
use crate::claims::claim_api::allocated_to;
use crate::claims::handler::ClaimRef;
use crate::claims::plan;
use crate::claims::preparer::carve::Carved;
use crate::claims::spans::claim_span;
use crate::claims::{PrepareError, Preparer};

/// Items per page of the watch's listings.
const PAGE_SIZE: u32 = 500;
/// The first pause before a carve (or a carve's release) whose claim could not be read is tried
/// again; doubled after each failed read, up to [`READ_RETRY_MAX`].
pub(crate) const READ_RETRY: Duration = Duration::from_secs(1);
/// The longest pause between two tries of a call whose claim cannot be read.
pub(crate) const READ_RETRY_MAX: Duration = Duration::from_secs(30);

/// What the watch does with the claims it sees; see the module docs.
pub struct CarveWatch {
    preparer: Arc<Preparer>,
    node: String,
    /// Carves and releases running, by claim UID.
    running: HashSet<String>,
    tasks: JoinSet<String>,
    /// Claims to look at again once their running call ends (a release asked for meanwhile).
    again: HashMap<String, ClaimRef>,
    /// The UIDs of this node's claims seen since a (re)listing began, until it is done.
    listing: Option<HashSet<String>>,
    /// Ends the retries of the calls it started when the watch stops.
    stop: CancellationToken,
}

impl CarveWatch {
    /// A watch for `preparer`'s node `node`.
    pub fn new(preparer: Arc<Preparer>, node: &str) -> Self {
        Self {
            preparer,
            node: node.to_string(),
            running: HashSet::new(),
            tasks: JoinSet::new(),
            again: HashMap::new(),
            listing: None,
            stop: CancellationToken::new(),
        }
    }

    /// Watches the ResourceClaims through `client` until `stop`; then waits for the carves and
    /// releases it started.
    pub async fn run(mut self, client: Client, stop: CancellationToken) {
        self.stop = stop.clone();
        let api: Api<ResourceClaim> = Api::all(client);
        let config = watcher::Config::default().page_size(PAGE_SIZE);
        let mut events = watcher::watcher(api, config).default_backoff().boxed();
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                Some(done) = self.tasks.join_next(), if !self.tasks.is_empty() => {
                    if let Ok(uid) = done {
                        self.done(&uid);
                    }
                }
                event = events.next() => match event {
                    Some(Ok(e)) => self.handle(e),
                    Some(Err(e)) => tracing::warn!(error = %e, "the watch of ResourceClaims failed; it is retried"),
                    None => break,
                },
            }
        }
        self.finish().await;
    }

    /// Takes one event of the watch.
    pub fn handle(&mut self, event: Event<ResourceClaim>) {
        match event {
            Event::Init => self.listing = Some(HashSet::new()),
            Event::InitApply(rc) => {
                if allocated_to(&rc, &self.node)
                    && let (Some(seen), Some(uid)) =
                        (self.listing.as_mut(), rc.metadata.uid.clone())
                {
                    seen.insert(uid);
                }
                self.seen(&rc);
            }
            Event::InitDone => {
                let seen = self.listing.take().unwrap_or_default();
                for claim in self.carved_records() {
                    if !seen.contains(&claim.uid) {
                        self.release(claim);
                    }
                }
            }
            Event::Apply(rc) => self.seen(&rc),
            Event::Delete(rc) => {
                let claim = claim_ref(&rc);
                let carved = self
                    .preparer
                    .record_of(&claim.uid)
                    .is_some_and(|r| r.state == PrepareState::Carved);
                // A carve running now may record it yet: looked at again when it ends.
                if carved || self.running.contains(&claim.uid) {
                    self.release(claim);
                }
            }
        }
    }

    /// Waits for the carves and releases under way (and the releases asked for meanwhile).
    pub async fn finish(mut self) {
        while let Some(done) = self.tasks.join_next().await {
            if let Ok(uid) = done {
                self.done(&uid);
            }
        }
    }

    /// The call for claim `uid` ended: a release asked for meanwhile starts now.
    fn done(&mut self, uid: &str) {
        self.running.remove(uid);
        if let Some(claim) = self.again.remove(uid) {
            self.release(claim);
        }
    }

    /// A claim as the watch saw it now.
    fn seen(&mut self, rc: &ResourceClaim) {
        let claim = claim_ref(rc);
        let record = self.preparer.record_of(&claim.uid);
        if record.is_none() && !allocated_to(rc, &self.node) {
            return;
        }
        if let Some(r) = record.as_ref() {
            self.learn_pods(rc, &claim, r);
        }
        match on_claim_seen(rc, &self.node, record.as_ref()) {
            OnClaimSeen::Carve => self.carve(claim),
            OnClaimSeen::ReleaseCarved => self.release(claim),
            OnClaimSeen::Announce => self.announce(claim),
            OnClaimSeen::Nothing => {}
        }
    }

    /// The record of a claim the kubelet holds, allocated here as recorded, learns the pods the
    /// claim is reserved for that it does not know (a checkpoint write, off the watch's loop).
    fn learn_pods(&self, rc: &ResourceClaim, claim: &ClaimRef, record: &ClaimRecord) {
        let pods = plan::reserving_pods(rc);
        if !record.is_handed()
            || pods.iter().all(|p| record.pods.contains(p))
            || !plan::still_allocated(claim, record, Some(rc), &self.node)
        {
            return;
        }
        let preparer = self.preparer.clone();
        let claim = claim.clone();
        let span = claim_span!("learn_pods", &claim);
        tokio::spawn(async move { preparer.learn_pods(&claim, &pods).await }.instrument(span));
    }

    /// The claims whose records are `Carved`.
    fn carved_records(&self) -> Vec<ClaimRef> {
        self.preparer.checkpoint().read(|cp| {
            cp.claims
                .iter()
                .filter(|(_, r)| r.state == PrepareState::Carved)
                .map(|(uid, r)| ClaimRef {
                    namespace: r.namespace.clone(),
                    name: r.name.clone(),
                    uid: uid.clone(),
                })
                .collect()
        })
    }

    /// Starts the carve of `claim`, unless a call for it runs.
    fn carve(&mut self, claim: ClaimRef) {
        if !self.running.insert(claim.uid.clone()) {
            return;
        }
        let preparer = self.preparer.clone();
        let stop = self.stop.clone();
        let span = claim_span!("carve", &claim);
        let task = async move {
            let mut delay = READ_RETRY;
            loop {
                match preparer.carve_claim(&claim).await {
                    Err(PrepareError::ApiRead(e)) => {
                        tracing::warn!(error = %e, retry_in = ?delay, "cannot read a claim to carve; retrying");
                        if !pause(&stop, &mut delay).await {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "the claim could not be carved");
                        break;
                    }
                    Ok(Carved::Skipped) => {
                        tracing::debug!("nothing to carve");
                        break;
                    }
                    Ok(_) => break,
                }
            }
            claim.uid
        };
        self.tasks.spawn(task.instrument(span));
    }

    /// Starts the release of `claim`'s carved record; once the call running for it ends, if one
    /// does (a claim deleted while it is carved).
    fn release(&mut self, claim: ClaimRef) {
        if !self.running.insert(claim.uid.clone()) {
            self.again.insert(claim.uid.clone(), claim);
            return;
        }
        let preparer = self.preparer.clone();
        let stop = self.stop.clone();
        let span = claim_span!("release_carved", &claim);
        let task = async move {
            let mut delay = READ_RETRY;
            loop {
                match preparer.release_carved(&claim).await {
                    Err(PrepareError::ApiRead(e)) => {
                        tracing::warn!(error = %e, retry_in = ?delay, "cannot read a carved claim to release it; retrying");
                        if !pause(&stop, &mut delay).await {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the carved slices of a claim no longer allocated here are left for the reaper (or the next listing)");
                        break;
                    }
                    Ok(_) => break,
                }
            }
            claim.uid
        };
        self.tasks.spawn(task.instrument(span));
    }

    /// Starts writing `SliceReady` again for `claim`'s carved record, unless a call for it runs.
    fn announce(&mut self, claim: ClaimRef) {
        if !self.running.insert(claim.uid.clone()) {
            return;
        }
        let preparer = self.preparer.clone();
        let span = claim_span!("announce_carved", &claim);
        let task = async move {
            preparer.announce_carved(&claim).await;
            claim.uid
        };
        self.tasks.spawn(task.instrument(span));
    }
}

/// Waits `delay` (then doubles it, up to [`READ_RETRY_MAX`]); `false` when the watch stopped
/// meanwhile (its start-up and the next listing look at the claim again).
async fn pause(stop: &CancellationToken, delay: &mut Duration) -> bool {
    tokio::select! {
        _ = stop.cancelled() => return false,
        _ = tokio::time::sleep(*delay) => {}
    }
    *delay = (*delay * 2).min(READ_RETRY_MAX);
    true
}
