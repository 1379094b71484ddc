//! The controller loop: a kube-runtime [`Controller`] over ResourceClaims (all namespaces),
//! triggered also by the pods that use them, by their AllocationClaims and by our
//! ResourceSlices, that runs [`reconcile`] on each claim, beside the [`crate::sweep`].
//!
//! Each trigger source is filtered ([`crate::triggers`]): only a change of what the mirror reads
//! starts a reconcile, and the controller's own writes coming back do not. The triggers come
//! from the same shared streams as the caches ([`crate::cache`]), so a reconcile always sees the
//! change that caused it.

use std::future::Future;
use std::sync::Arc;

use das_api::allocation::AllocationClaim;
use das_runtime::client::Clients;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use kube::runtime::controller::Controller;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};

use crate::cache::{
    Caches, claims_in_pool, keep_what_the_mirror_needs, shared, slice_watch_config,
};
use crate::device_info::{DeviceInfo, cached_rows};
use crate::metrics::Metrics;
use crate::mirror::results_to_mirror;
use crate::published::PublishedSlice;
use crate::reconcile::{Context, FIELD_MANAGER, error_policy, reconcile};
use crate::sweep::{Sweep, sweep_loop};
use crate::triggers::Triggers;

/// Default of how many ResourceClaims are reconciled at once (`--concurrent-reconciles`).
///
/// A reconcile spends nearly all its time waiting for its writes, so the limit only queues
/// claims behind each other: in a 200-pod burst on a 2-core machine, the device-ready →
/// `inUse` p99 was 1.1–6.1 s with 16 and 0.4–1.8 s with 64 (docs/benchmarks.md,
/// "AllocationClaim controller"). Each in-flight reconcile holds at most one API request.
pub const DEFAULT_CONCURRENT_RECONCILES: u16 = 64;

/// Runs the controller until `shutdown` resolves, with at most `concurrent_reconciles`
/// reconciles at once (0 means no limit). Watches use `clients.watches`; reads and writes
/// (AllocationClaims, Events, the sweep) use `clients.calls`, whose timeouts bound them.
pub async fn run(
    clients: Clients,
    metrics: Arc<Metrics>,
    identity: String,
    concurrent_reconciles: u16,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let Clients {
        calls: client,
        watches,
    } = clients;
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
    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: Some(identity),
    };
    let caches = Caches {
        pods: pods.clone(),
        slices: slices.clone(),
        allocs: allocs.clone(),
    };
    let ctx = Arc::new(Context::new(
        client.clone(),
        caches,
        metrics.clone(),
        Recorder::new(client.clone(), reporter),
        triggers.clone(),
    ));
    let (info_claims, info_pods) = (claims.clone(), pods.clone());
    metrics.export_device_info(move || {
        cached_rows(&info_claims, &info_pods)
            .iter()
            .map(DeviceInfo::labels)
            .collect()
    });
    let (claims_of_pod, claims_of_slice) = (claims.clone(), claims.clone());
    let (pod_filter, alloc_filter) = (triggers.clone(), triggers.clone());
    let own_changes =
        alloc_events.filter(move |a| std::future::ready(alloc_filter.on_allocation_claim(a)));
    let controller = Controller::for_stream(claim_events, claims.clone())
        .with_config(
            kube::runtime::controller::Config::default().concurrency(concurrent_reconciles),
        )
        .owns_shared_stream(own_changes)
        .watches_shared_stream(pod_events, move |p: Arc<Pod>| {
            pod_filter.on_pod(&p, |r| {
                claims_of_pod
                    .get(r)
                    .is_some_and(|c| !results_to_mirror(&c).is_empty())
            })
        })
        .watches_shared_stream(slice_events, move |s: Arc<PublishedSlice>| {
            claims_in_pool(&s, &claims_of_slice)
        });
    let sweeper = sweep_loop(Sweep {
        client,
        claims: claims.clone(),
        allocs: allocs.clone(),
        pods: pods.clone(),
        metrics: metrics.clone(),
        triggers,
    });
    let synced = ctx.clone();
    let ready = async {
        let _ = tokio::join!(
            pods.wait_until_ready(),
            allocs.wait_until_ready(),
            slices.wait_until_ready(),
            claims.wait_until_ready()
        );
        synced.set_synced();
        metrics.probe.set_ready(true);
        tracing::info!("caches synced");
        std::future::pending::<()>().await
    };
    let run = controller
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {});
    tokio::select! {
        _ = run => {},
        _ = pod_drive => {},
        _ = alloc_drive => {},
        _ = slice_drive => {},
        _ = sweeper => {},
        _ = ready => {},
    }
}
