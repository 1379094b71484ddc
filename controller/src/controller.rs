//! The controller loop: a kube-runtime [`Controller`] over ResourceClaims (all namespaces),
//! triggered also by the pods that use them, by their AllocationClaims and by our
//! ResourceSlices, that runs [`reconcile`] on each claim, beside the [`crate::sweep`].
//!
//! Each trigger source is filtered ([`crate::triggers`]): only a change of what the mirror reads
//! starts a reconcile, and the controller's own writes coming back do not. The triggers come
//! from the same shared streams as the caches ([`crate::cache`]), so a reconcile always sees the
//! change that caused it.
//!
//! Start-up is in types, each phase making what the next requires: a [`Role`] (elected by
//! [`crate::lease::Elector::acquire`], or [`Role::Single`]) → [`watch`] → a [`Watching`] →
//! [`context`] and [`run`], where [`Watching::synced`] gives the
//! [`crate::watching::Synced`] proof that [`Context::mark_synced`] requires before any reconcile
//! writes. [`run`] ends when stopped or when the role is lost ([`Ended`]).

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Client;
use kube::runtime::controller::{Config, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::Store;

use crate::cache::claims_in_pool;
use crate::device_info::{DeviceInfo, cached_rows};
use crate::lease::Role;
use crate::metrics::Metrics;
use crate::mirror::results_to_mirror;
use crate::published::PublishedSlice;
use crate::reconcile::{Context, FIELD_MANAGER, error_policy, reconcile};
use crate::sweep::{Sweep, sweep_loop};
use crate::triggers::Triggers;
use crate::watching::{Parts, Streams};
pub use crate::watching::{Watching, watch};

/// Default of how many ResourceClaims are reconciled at once (`--concurrent-reconciles`).
///
/// A reconcile spends nearly all its time waiting for its writes, so the limit only queues
/// claims behind each other: in a 200-pod burst on a 2-core machine, the device-ready →
/// `inUse` p99 was 1.1–6.1 s with 16 and 0.4–1.8 s with 64 (docs/benchmarks.md,
/// "AllocationClaim controller"). Each in-flight reconcile holds at most one API request.
pub const DEFAULT_CONCURRENT_RECONCILES: u16 = 64;

/// The state of the reconciles over `watching`'s caches and trigger filters: writes (and the
/// Events of reporter `identity`, this replica) go through `client` (the one with read
/// timeouts), counts go to `metrics`. Reconciles write nothing until it is marked synced.
pub fn context(
    watching: &Watching,
    client: Client,
    metrics: Arc<Metrics>,
    identity: String,
) -> Arc<Context> {
    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: Some(identity),
    };
    Arc::new(Context::new(
        client.clone(),
        watching.caches().clone(),
        metrics,
        Recorder::new(client, reporter),
        watching.triggers().clone(),
    ))
}

/// How [`run`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// `shutdown` resolved (or a watch ended): the role may be released.
    Stopped,
    /// The role was lost (another replica leads): this replica must not write any more.
    Lost,
}

/// Runs the controller over `watching` with the reconciles' `ctx` (from [`context`] on the
/// same watches) while `role` holds, until `shutdown` resolves, with at most
/// `concurrent_reconciles` reconciles at once (0 means no limit); beside it the sweep, and the
/// wait for the caches' first lists that marks `ctx` synced and the controller ready. Reads
/// and writes (AllocationClaims, Events, the sweep) use `ctx`'s client, whose timeouts bound
/// them.
pub async fn run(
    watching: Watching,
    ctx: Arc<Context>,
    role: &Role,
    concurrent_reconciles: u16,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) -> Ended {
    let synced = watching.synced();
    let Parts {
        caches,
        claims,
        triggers,
        streams,
        drive,
    } = watching.into_parts();
    export_device_info(ctx.metrics(), &claims, &caches.pods);
    let sweeper = sweep_loop(Sweep {
        client: ctx.client().clone(),
        claims: claims.clone(),
        allocs: caches.allocs.clone(),
        pods: caches.pods.clone(),
        metrics: ctx.metrics().clone(),
        triggers: triggers.clone(),
    });
    let ready = {
        let ctx = ctx.clone();
        async move {
            ctx.mark_synced(synced.await);
            tracing::info!("caches synced");
            std::future::pending::<()>().await
        }
    };
    let run = controller(streams, claims, triggers, concurrent_reconciles)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {});
    tokio::select! {
        _ = run => Ended::Stopped,
        _ = drive => Ended::Stopped,
        _ = sweeper => Ended::Stopped,
        _ = ready => Ended::Stopped,
        _ = role.lost() => Ended::Lost,
    }
}

/// The kube-runtime controller over the ResourceClaims' stream and store, triggered also by
/// AllocationClaims (their owner), pods (the claims they use that have results to mirror) and
/// our ResourceSlices (the claims allocated in their pool), each filtered by `triggers`.
fn controller(
    streams: Streams,
    claims: Store<ResourceClaim>,
    triggers: Arc<Triggers>,
    concurrent_reconciles: u16,
) -> Controller<ResourceClaim> {
    let (claims_of_pod, claims_of_slice) = (claims.clone(), claims.clone());
    Controller::for_stream(streams.claims, claims)
        .with_config(Config::default().concurrency(concurrent_reconciles))
        .owns_shared_stream(streams.allocs)
        .watches_shared_stream(streams.pods, move |p: Arc<Pod>| {
            triggers.on_pod(&p, |r| {
                claims_of_pod
                    .get(r)
                    .is_some_and(|c| !results_to_mirror(&c).is_empty())
            })
        })
        .watches_shared_stream(streams.slices, move |s: Arc<PublishedSlice>| {
            claims_in_pool(&s, &claims_of_slice)
        })
}

/// Exports `das_mig_device_info` from the claims' and pods' stores, computed on each scrape.
fn export_device_info(metrics: &Metrics, claims: &Store<ResourceClaim>, pods: &Store<Pod>) {
    let (claims, pods) = (claims.clone(), pods.clone());
    metrics.export_device_info(move || {
        cached_rows(&claims, &pods)
            .iter()
            .map(DeviceInfo::labels)
            .collect()
    });
}
