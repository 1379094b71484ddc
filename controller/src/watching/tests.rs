use std::pin::pin;
use std::task::Poll;

use futures::poll;
use kube::runtime::watcher::Event;

use super::*;

/// Gives `writer`'s store its first complete list (empty).
fn first_list<K>(writer: &mut reflector::store::Writer<K>)
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash + Default,
{
    writer.apply_watcher_event(&Event::Init);
    writer.apply_watcher_event(&Event::InitDone);
}

/// The proof comes only once all four stores have their first list, the ResourceClaims' last
/// here as in a real start (their store fills only while the controller polls its stream).
#[tokio::test]
async fn synced_only_once_every_store_has_its_first_list() {
    let (pods, mut pod_writer) = reflector::store::<Pod>();
    let (allocs, mut alloc_writer) = reflector::store::<AllocationClaim>();
    let (slices, mut slice_writer) = reflector::store::<PublishedSlice>();
    let (claims, mut claim_writer) = reflector::store::<ResourceClaim>();
    let caches = Caches {
        pods,
        slices,
        allocs,
    };
    let mut synced = pin!(all_synced(caches, claims));
    assert!(poll!(synced.as_mut()).is_pending());
    first_list(&mut pod_writer);
    assert!(poll!(synced.as_mut()).is_pending());
    first_list(&mut alloc_writer);
    first_list(&mut slice_writer);
    assert!(
        poll!(synced.as_mut()).is_pending(),
        "synced without the ResourceClaims' first list"
    );
    first_list(&mut claim_writer);
    assert!(matches!(poll!(synced.as_mut()), Poll::Ready(Synced(()))));
}

/// A store whose watch ended before its first list never gives the proof: reconciles must not
/// write from a cache that was never complete.
#[tokio::test]
async fn no_proof_when_a_watch_ends_before_its_first_list() {
    let (pods, mut pod_writer) = reflector::store::<Pod>();
    let (allocs, mut alloc_writer) = reflector::store::<AllocationClaim>();
    let (slices, slice_writer) = reflector::store::<PublishedSlice>();
    let (claims, mut claim_writer) = reflector::store::<ResourceClaim>();
    let caches = Caches {
        pods,
        slices,
        allocs,
    };
    let mut synced = pin!(all_synced(caches, claims));
    first_list(&mut pod_writer);
    first_list(&mut alloc_writer);
    first_list(&mut claim_writer);
    drop(slice_writer);
    for _ in 0..3 {
        assert!(poll!(synced.as_mut()).is_pending());
        tokio::task::yield_now().await;
    }
}
