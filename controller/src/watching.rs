//! The controller's watches, started: [`watch`] opens them (only with a [`Role`]: a standby
//! watches nothing) and returns a [`Watching`], which `crate::controller::run` consumes; its
//! [`Watching::synced`] gives the [`Synced`] proof that
//! [`crate::reconcile::Context::mark_synced`] requires before any reconcile writes.
//!
//! The order elected → watching → synced → writing is thus in the types: a [`Watching`] is
//! made only by [`watch`], a [`Synced`] only by [`Watching::synced`] (both have private
//! fields), so no edit can start the watches of a standby or let a reconcile write from
//! caches without their first complete list.

use std::future::Future;
use std::sync::Arc;

use das_api::allocation::AllocationClaim;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::runtime::reflector::{self, ReflectHandle, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

use crate::cache::{Caches, keep_what_the_mirror_needs, shared, slice_watch_config};
use crate::lease::Role;
use crate::published::PublishedSlice;
use crate::triggers::Triggers;

/// The trigger streams of the controller, each from the watch that also fills a store, so a
/// reconcile always sees the change that caused it.
pub(crate) struct Streams {
    /// ResourceClaims that changed what the mirror reads ([`Triggers::on_claim`]); polling it
    /// fills the claims' store.
    pub(crate) claims: BoxStream<'static, Result<ResourceClaim, watcher::Error>>,
    /// Every pod change (filtered where it is mapped to claims).
    pub(crate) pods: ReflectHandle<Pod>,
    /// AllocationClaims that are not the echo of our own writes.
    pub(crate) allocs: BoxStream<'static, Arc<AllocationClaim>>,
    /// Every change of our ResourceSlices.
    pub(crate) slices: ReflectHandle<PublishedSlice>,
}

/// The watches of a controller that leads (or runs alone), started: the stores the reconciles
/// read, the ResourceClaims' own store, the trigger filters, the trigger streams and the
/// future that drives the shared watches. Made only by [`watch`]; consumed by
/// `crate::controller::run`.
///
/// ```compile_fail,E0451
/// use das_controller::cache::Caches;
/// use das_controller::watching::Watching;
/// // Building a Watching (even from another) does not compile: its fields are private.
/// fn other_caches(w: Watching, caches: Caches) -> Watching {
///     Watching { caches, ..w }
/// }
/// ```
pub struct Watching {
    caches: Caches,
    claims: Store<ResourceClaim>,
    triggers: Arc<Triggers>,
    streams: Streams,
    /// Drives the shared pod, AllocationClaim and slice watches; ends when one of them does.
    drive: BoxFuture<'static, ()>,
}

/// Proof that every store of a [`Watching`] (pods, AllocationClaims, our ResourceSlices,
/// ResourceClaims) has had its first complete list: made only by [`Watching::synced`].
///
/// ```compile_fail,E0423
/// use das_controller::watching::Synced;
/// // Claiming synced caches without waiting for them does not compile: the field is private.
/// let synced = Synced(());
/// ```
#[derive(Debug)]
pub struct Synced(());

/// Starts the controller's watches through `watches` (the client without a read timeout), all
/// namespaces: pods (trimmed to what the mirror reads), AllocationClaims, our ResourceSlices
/// and the ResourceClaims, whose events pass the claim filter of fresh [`Triggers`]. Requires
/// the `_role` this replica runs by: a standby holds no caches.
pub fn watch(_role: &Role, watches: Client) -> Watching {
    let all = watcher::Config::default();
    let (pods, pod_events, pod_drive) = shared(
        Api::<Pod>::all(watches.clone()),
        all.clone(),
        keep_what_the_mirror_needs,
    );
    let (allocs, alloc_events, alloc_drive) = shared(
        Api::<AllocationClaim>::all(watches.clone()),
        all.clone(),
        |_| {},
    );
    let (slices, slice_events, slice_drive) = shared(
        Api::<PublishedSlice>::all(watches.clone()),
        slice_watch_config(),
        |_| {},
    );
    let triggers = Arc::new(Triggers::default());
    // The claims' own reflector: the controller's trigger stream, filtered by what changed.
    let (claims, claim_writer) = reflector::store();
    let claim_filter = triggers.clone();
    let claim_events = watcher(Api::<ResourceClaim>::all(watches), all)
        .default_backoff()
        .reflect(claim_writer)
        .applied_objects()
        .try_filter(move |c| std::future::ready(claim_filter.on_claim(c)));
    let alloc_filter = triggers.clone();
    let own_changes =
        alloc_events.filter(move |a| std::future::ready(alloc_filter.on_allocation_claim(a)));
    let drive = async {
        tokio::select! {
            _ = pod_drive => {},
            _ = alloc_drive => {},
            _ = slice_drive => {},
        }
    };
    Watching {
        caches: Caches {
            pods,
            slices,
            allocs,
        },
        claims,
        triggers,
        streams: Streams {
            claims: claim_events.boxed(),
            pods: pod_events,
            allocs: own_changes.boxed(),
            slices: slice_events,
        },
        drive: drive.boxed(),
    }
}

impl Watching {
    /// The stores a reconcile reads.
    pub fn caches(&self) -> &Caches {
        &self.caches
    }

    /// The ResourceClaims' store (filled while the claims' stream is polled).
    pub fn claims(&self) -> &Store<ResourceClaim> {
        &self.claims
    }

    /// The trigger filters, which the reconciles record their own writes in.
    pub fn triggers(&self) -> &Arc<Triggers> {
        &self.triggers
    }

    /// Resolves with the [`Synced`] proof once every store has its first complete list. The
    /// ResourceClaims' store fills only while the controller polls its stream, so this is
    /// awaited beside the controller. A store whose watch ended first (the controller is
    /// stopping) never gives the proof.
    pub fn synced(&self) -> impl Future<Output = Synced> + Send + 'static {
        all_synced(self.caches.clone(), self.claims.clone())
    }

    /// Takes the watches apart for the run.
    pub(crate) fn into_parts(self) -> Parts {
        Parts {
            caches: self.caches,
            claims: self.claims,
            triggers: self.triggers,
            streams: self.streams,
            drive: self.drive,
        }
    }
}

/// A [`Watching`] taken apart by `crate::controller::run` (its fields, by the same names).
pub(crate) struct Parts {
    pub(crate) caches: Caches,
    pub(crate) claims: Store<ResourceClaim>,
    pub(crate) triggers: Arc<Triggers>,
    pub(crate) streams: Streams,
    pub(crate) drive: BoxFuture<'static, ()>,
}

/// [`Watching::synced`] over the stores themselves.
async fn all_synced(caches: Caches, claims: Store<ResourceClaim>) -> Synced {
    let ready = tokio::try_join!(
        caches.pods.wait_until_ready(),
        caches.allocs.wait_until_ready(),
        caches.slices.wait_until_ready(),
        claims.wait_until_ready()
    );
    if ready.is_err() {
        // A writer is gone before its store was complete: no proof to give.
        std::future::pending::<()>().await;
    }
    Synced(())
}

#[cfg(test)]
mod tests;
