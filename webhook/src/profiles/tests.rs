use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::FutureExt;
use serde_json::{Value, json};

fn device(gpu: i64, profile: &str, start: i64, size: i64) -> serde_json::Value {
    json!({"name": format!("gpu-{gpu}-{profile}-{start}"), "attributes": {
        "profile": {"string": profile}, "gpuIndex": {"int": gpu},
        "placementStart": {"int": start}, "placementSize": {"int": size}}})
}

fn slice(node: &str, devices: Vec<serde_json::Value>) -> ResourceSlice {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-x")},
        "spec": {"driver": "mig.das.com", "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices}
    }))
    .unwrap()
}

#[test]
fn capacity_is_the_most_non_overlapping_placements_per_gpu_summed_per_node() {
    // n0: two GPUs with 1g.10gb at 0..7 (size 1) and 2g.20gb at 0, 2, 4 (size 2).
    let mut d = Vec::new();
    for gpu in 0..2 {
        for start in 0..7 {
            d.push(device(gpu, "1g.10gb", start, 1));
        }
        for start in [0, 2, 4] {
            d.push(device(gpu, "2g.20gb", start, 2));
        }
        d.push(device(gpu, "1g.10gb+me", 0, 1));
    }
    // n1: one GPU, a 4g at 0 (size 4) and 4 (size 4 but overlapping 3..7 variant).
    let n1 = vec![device(0, "4g.40gb", 0, 4), device(0, "4g.40gb", 3, 4)];
    let m = max_per_node(&[slice("n0", d), slice("n1", n1)]);
    assert_eq!(m["1g.10gb"], 14);
    assert_eq!(m["2g.20gb"], 6);
    assert_eq!(m["1g.10gb.me"], 2, "keyed by NVIDIA's name");
    assert_eq!(m["4g.40gb"], 1);
}

/// The algorithm as it was before the summary (whole slices in memory): the reference the
/// summary must agree with.
fn reference_max_per_node(slices: &[ResourceSlice]) -> BTreeMap<String, u32> {
    let mut placements: BTreeMap<(String, String, i64), Vec<(i64, i64)>> = BTreeMap::new();
    for s in slices {
        let node = s.spec.node_name.clone().unwrap_or_default();
        for d in s.spec.devices.iter().flatten() {
            let Some(attrs) = d.attributes.as_ref() else {
                continue;
            };
            let int = |k: &str| attrs.get(k).and_then(|a| a.int);
            let (Some(profile), Some(gpu), Some(start), Some(size)) = (
                attrs.get("profile").and_then(|a| a.string.clone()),
                int("gpuIndex"),
                int("placementStart"),
                int("placementSize"),
            ) else {
                continue;
            };
            placements
                .entry((node.clone(), das_api::legacy_profile_name(&profile), gpu))
                .or_default()
                .push((start, start + size));
        }
    }
    let mut per_node: BTreeMap<(String, String), u32> = BTreeMap::new();
    for ((node, profile, _), mut v) in placements {
        v.sort_by_key(|&(start, end)| (end, start));
        let mut end_of_last = i64::MIN;
        let mut n = 0;
        for (start, end) in v {
            if start >= end_of_last {
                n += 1;
                end_of_last = end;
            }
        }
        *per_node.entry((node, profile)).or_default() += n;
    }
    let mut out: BTreeMap<String, u32> = BTreeMap::new();
    for ((_, profile), n) in per_node {
        let e = out.entry(profile).or_default();
        *e = (*e).max(n);
    }
    out
}

/// A device with everything das-kubelet-plugin publishes besides the four attributes read.
fn full_device(gpu: i64, profile: &str, start: i64, size: i64) -> Value {
    let mut d = device(gpu, profile, start, size);
    d["attributes"]["parentUUID"] = json!({"string": format!("GPU-{gpu:08x}")});
    d["attributes"]["productName"] = json!({"string": "NVIDIA H100 80GB HBM3"});
    d["attributes"]["driverVersion"] = json!({"version": "580.95.5"});
    d["capacity"] = json!({"memory": {"value": format!("{}Mi", 9984 * size)}, "multiprocessors": {"value": "16"}});
    d["consumesCounters"] = json!([{"counterSet": format!("gpu-{gpu}-counter-set"),
        "counters": {"memory": {"value": format!("{}Mi", 9984 * size)}}}]);
    d["taints"] = json!([{"key": "mig.das.com/xid", "value": "79", "effect": "NoSchedule"}]);
    d
}

/// The devices of one H100-like GPU: 1g.10gb at 0..7, 1g.10gb+me at 0..7, 1g.20gb at 0, 2, 4,
/// 6, 2g.20gb at 0, 2, 4, 3g.40gb at 0, 4, 4g.40gb at 0, 7g.80gb at 0.
fn gpu_devices(gpu: i64) -> Vec<Value> {
    let mut d = Vec::new();
    let layout: [(&str, i64, &[i64]); 7] = [
        ("1g.10gb", 1, &[0, 1, 2, 3, 4, 5, 6]),
        ("1g.10gb+me", 1, &[0, 1, 2, 3, 4, 5, 6]),
        ("1g.20gb", 2, &[0, 2, 4, 6]),
        ("2g.20gb", 2, &[0, 2, 4]),
        ("3g.40gb", 4, &[0, 4]),
        ("4g.40gb", 4, &[0]),
        ("7g.80gb", 8, &[0]),
    ];
    for (profile, size, starts) in layout {
        for &start in starts {
            d.push(full_device(gpu, profile, start, size));
        }
    }
    d
}

/// The slices of a cluster as the API server lists them (by name: `<index>-mig.das.com-<node>`,
/// so the nodes interleave): nodes with 1, 2 or 3 GPUs, devices in slices of 10 (a GPU spans
/// slices), some devices no summary takes, and a slice without `nodeName`.
fn cluster_slices() -> Vec<Value> {
    let mut per_node: Vec<(String, Vec<Vec<Value>>)> = Vec::new();
    for n in 0..5 {
        let mut devices: Vec<Value> = (0..1 + n % 3).flat_map(gpu_devices).collect();
        if n == 1 {
            // A used GPU: some placements gone from the second GPU.
            devices.retain(|d| {
                !(d["attributes"]["gpuIndex"]["int"] == 1
                    && d["attributes"]["placementStart"]["int"].as_i64() < Some(4))
            });
        }
        devices.push(json!({"name": "no-attributes"}));
        let mut partial = device(0, "1g.10gb", 6, 1);
        partial["attributes"]
            .as_object_mut()
            .unwrap()
            .remove("placementSize");
        devices.push(partial);
        let slices = devices.chunks(10).map(<[Value]>::to_vec).collect();
        per_node.push((format!("n{n}"), slices));
    }
    let mut out = Vec::new();
    for index in 0.. {
        let mut any = false;
        for (node, slices) in &per_node {
            if let Some(devices) = slices.get(index) {
                any = true;
                out.push(json!({
                    "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                    "metadata": {"name": format!("{index:05x}-mig.das.com-{node}"),
                        "managedFields": [{"manager": "das-kubelet-plugin"}]},
                    "spec": {"driver": "mig.das.com", "nodeName": node,
                        "pool": {"name": node, "generation": 1, "resourceSliceCount": slices.len()},
                        "devices": devices}}));
            }
        }
        if !any {
            break;
        }
    }
    out.push(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "all-nodes"},
        "spec": {"driver": "mig.das.com", "allNodes": true,
            "pool": {"name": "shared", "generation": 1, "resourceSliceCount": 1},
            "devices": [device(0, "1g.10gb", 0, 1)]}}));
    out
}

fn typed(slices: &[Value]) -> Vec<ResourceSlice> {
    slices
        .iter()
        .map(|s| serde_json::from_value(s.clone()).unwrap())
        .collect()
}

/// A list page as the API server sends it.
fn page_body(items: &[Value], cont: Option<&str>) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
        "metadata": {"resourceVersion": "100", "continue": cont.unwrap_or_default()},
        "items": items})
}

fn decode_page(body: &Value) -> ObjectList<SlicePlacements> {
    serde_json::from_slice(&serde_json::to_vec(body).unwrap()).unwrap()
}

#[test]
fn the_summary_agrees_with_whole_slices() {
    let slices = typed(&cluster_slices());
    let m = max_per_node(&slices);
    assert_eq!(m, reference_max_per_node(&slices));
    assert_eq!(m["1g.10gb"], 21, "3 GPUs × 7 (n2)");
    assert_eq!(m["1g.10gb.me"], 21);
    assert_eq!(m["7g.80gb"], 3);
    assert_eq!(m["3g.40gb"], 6);
}

#[test]
fn a_summary_from_pages_equals_one_from_one_list() {
    let slices = cluster_slices();
    let mut whole = PlacementSummary::default();
    whole.add_page(decode_page(&page_body(&slices, None)).items);
    let mut from_typed = PlacementSummary::default();
    for s in typed(&slices) {
        from_typed.add_slice(&s);
    }
    assert_eq!(
        whole, from_typed,
        "the trimmed decoding reads what the typed one does"
    );
    for size in [1, 2, 3, 7, slices.len() - 1] {
        let mut paged = PlacementSummary::default();
        for chunk in slices.chunks(size) {
            paged.add_page(decode_page(&page_body(chunk, Some("next"))).items);
        }
        assert_eq!(paged, whole, "pages of {size}");
    }
    let devices = whole.devices();
    assert_eq!(
        whole.clone().max_per_node(),
        reference_max_per_node(&typed(&slices))
    );
    assert_eq!(
        devices,
        9 * 25 - 15 + 1,
        "9 GPUs, 15 placements used, the all-nodes slice"
    );
}

#[test]
fn a_page_keeps_only_the_four_attributes_it_reads() {
    let page = decode_page(&page_body(&cluster_slices()[..1], None));
    let d = &page.items[0].spec.devices.as_ref().unwrap()[0];
    let a = d.attributes.as_ref().unwrap();
    assert_eq!(
        a.profile.as_ref().unwrap().string.as_deref(),
        Some("1g.10gb")
    );
    assert_eq!(a.gpu_index.as_ref().unwrap().int, Some(0));
    // Nothing else of the device is decoded: the type has no field for it.
    let debug = format!("{d:?}");
    for absent in ["GPU-", "H100", "Mi", "counter", "xid", "580"] {
        assert!(!debug.contains(absent), "{absent} in {debug}");
    }
}

/// An API server stand-in for ResourceSlice lists: answers `limit` items from the offset in the
/// continue token; records each request's query. `expire_once`: the first request with a
/// continue token gets 410 Gone.
fn fake_api(slices: Vec<Value>, expire_once: bool) -> (Client, Arc<Mutex<Vec<String>>>) {
    use axum::http::{Response, StatusCode};
    let queries = Arc::new(Mutex::new(Vec::new()));
    let seen = queries.clone();
    let expired = Arc::new(std::sync::atomic::AtomicBool::new(!expire_once));
    let svc = tower::service_fn(move |req: axum::http::Request<kube::client::Body>| {
        let query = req.uri().query().unwrap_or_default().to_string();
        seen.lock()
            .unwrap()
            .push(format!("{}?{query}", req.uri().path()));
        let params: HashMap<String, String> = query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let limit: usize = params["limit"].parse().unwrap();
        let from: usize = params.get("continue").map_or(0, |c| c.parse().unwrap());
        let (status, body) = if from > 0 && !expired.swap(true, Ordering::SeqCst) {
            (
                StatusCode::GONE,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "reason": "Expired", "code": 410, "message": "too old"}),
            )
        } else {
            let to = (from + limit).min(slices.len());
            let cont = (to < slices.len()).then(|| to.to_string());
            (
                StatusCode::OK,
                page_body(&slices[from..to], cont.as_deref()),
            )
        };
        let resp = Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(kube::client::Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap();
        std::future::ready(Ok::<_, std::convert::Infallible>(resp))
    });
    (Client::new(svc, "default"), queries)
}

#[tokio::test]
async fn the_api_source_lists_slices_in_pages() {
    let slices = cluster_slices();
    let mut whole = PlacementSummary::default();
    whole.add_page(decode_page(&page_body(&slices, None)).items);

    let (client, queries) = fake_api(slices.clone(), false);
    let mut source = ApiSource::new(client);
    source.page_size = 4;
    assert_eq!(source.placements().await.unwrap(), whole);
    let queries = queries.lock().unwrap().clone();
    assert_eq!(queries.len(), slices.len().div_ceil(4), "{queries:?}");
    assert!(
        queries.iter().all(|q| {
            q.starts_with(
        "/apis/resource.k8s.io/v1/resourceslices?&fieldSelector=spec.driver%3Dmig.das.com&limit=4"
    )
        }),
        "{queries:?}"
    );
    assert!(queries[1].contains("continue=4"), "{queries:?}");

    // A continue token that expired between pages: listed again from the start, once.
    let (client, queries) = fake_api(slices.clone(), true);
    let mut source = ApiSource::new(client);
    source.page_size = 4;
    assert_eq!(source.placements().await.unwrap(), whole);
    assert_eq!(
        queries.lock().unwrap().len(),
        slices.len().div_ceil(4) + 2,
        "one page, the expired one, then all pages"
    );
}

/// A source whose second and later fetches wait for `gate`; counts fetches.
struct Gated {
    fetches: AtomicUsize,
    gate: tokio::sync::Semaphore,
}

impl Source for Gated {
    async fn fetch(&self) -> Result<Offered> {
        let n = self.fetches.fetch_add(1, Ordering::SeqCst) + 1;
        let mut profiles = vec!["1g.10gb".to_string()];
        if n > 1 {
            self.gate.acquire().await.unwrap().forget();
            profiles.push("2g.20gb".into());
        }
        Ok(Offered::from(profiles))
    }
}

async fn until(mut done: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if done() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("never happened");
}

#[tokio::test]
async fn a_refresh_holds_no_lock_the_cached_answer_needs() {
    let profiles = Arc::new(Profiles::with_source(
        Gated {
            fetches: AtomicUsize::new(0),
            gate: tokio::sync::Semaphore::new(0),
        },
        Duration::from_secs(3600),
        Duration::ZERO,
    ));
    let known = |p: &str| vec![p.to_string()];
    let first = profiles.get(&known("1g.10gb")).await.unwrap();
    assert_eq!(first.profiles, ["1g.10gb"]);

    // A pod asks for a profile the cache does not know: a refresh starts and waits on the API.
    let p = profiles.clone();
    let refresh = tokio::spawn(async move { p.get(&known("2g.20gb")).await });
    until(|| profiles.source.fetches.load(Ordering::SeqCst) == 2).await;

    // Meanwhile the cached answer serves every call it covers, at once.
    let cached = profiles
        .get(&known("1g.10gb"))
        .now_or_never()
        .expect("answered without waiting for the refresh")
        .unwrap();
    assert!(Arc::ptr_eq(&cached, &first));
    profiles
        .check()
        .now_or_never()
        .expect("readiness does not wait either")
        .unwrap();

    // A second caller that needs the refresh waits for it instead of listing again.
    let p = profiles.clone();
    let waiter = tokio::spawn(async move { p.get(&known("2g.20gb")).await });
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!waiter.is_finished());

    profiles.source.gate.add_permits(1);
    let new = refresh.await.unwrap().unwrap();
    assert_eq!(new.profiles, ["1g.10gb", "2g.20gb"]);
    let waited = waiter.await.unwrap().unwrap();
    assert!(
        Arc::ptr_eq(&waited, &new),
        "the waiter took the refresh's answer"
    );
    assert_eq!(profiles.source.fetches.load(Ordering::SeqCst), 2);
    assert!(Arc::ptr_eq(
        &profiles.get(&known("2g.20gb")).await.unwrap(),
        &new
    ));
}

#[tokio::test]
async fn a_stale_answer_is_refreshed_and_a_failed_refresh_keeps_none() {
    struct Failing(AtomicUsize);
    impl Source for Failing {
        async fn fetch(&self) -> Result<Offered> {
            if self.0.fetch_add(1, Ordering::SeqCst) == 1 {
                return Err(Error::ListClasses(kube::Error::Api(Box::new(
                    kube::core::Status::failure("API server away", "ServiceUnavailable")
                        .with_code(503),
                ))));
            }
            Ok(Offered::from(vec!["1g.10gb".to_string()]))
        }
    }
    let profiles = Arc::new(Profiles::with_source(
        Failing(AtomicUsize::new(0)),
        Duration::ZERO,
        Duration::ZERO,
    ));
    profiles.get(&[]).await.unwrap();
    assert!(
        profiles.get(&[]).await.is_err(),
        "a TTL of 0 refreshes every time"
    );
    profiles.get(&[]).await.unwrap();
    assert_eq!(profiles.source.0.load(Ordering::SeqCst), 3);
}

/// At scale a listing takes seconds: an answer past the TTL but within twice the TTL serves
/// admissions and readiness at once while one refresh runs in the background; an answer older
/// than that makes the caller wait for a fresh one.
#[tokio::test]
async fn a_stale_answer_serves_at_once_while_it_is_refreshed_in_the_background() {
    let ttl = Duration::from_millis(200);
    let profiles = Arc::new(Profiles::with_source(
        Gated {
            fetches: AtomicUsize::new(0),
            gate: tokio::sync::Semaphore::new(0),
        },
        ttl,
        Duration::ZERO,
    ));
    let known = vec!["1g.10gb".to_string()];
    let first = profiles.get(&known).await.unwrap();
    tokio::time::sleep(ttl + ttl / 4).await;
    // Stale: served at once, one background refresh started (and blocked on the API).
    for _ in 0..3 {
        let served = profiles
            .get(&known)
            .now_or_never()
            .expect("a stale answer is served without waiting")
            .unwrap();
        assert!(Arc::ptr_eq(&served, &first));
    }
    profiles
        .check()
        .now_or_never()
        .expect("readiness too")
        .unwrap();
    until(|| profiles.source.fetches.load(Ordering::SeqCst) == 2).await;
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        profiles.source.fetches.load(Ordering::SeqCst),
        2,
        "one refresh"
    );
    profiles.source.gate.add_permits(1);
    until(|| {
        profiles
            .get(&known)
            .now_or_never()
            .is_some_and(|r| r.unwrap().profiles.len() == 2)
    })
    .await;
    // Older than twice the TTL: the caller waits for a fresh answer.
    tokio::time::sleep(ttl * 2 + ttl / 4).await;
    let p = profiles.clone();
    let k = known.clone();
    let waiting = tokio::spawn(async move { p.get(&k).await });
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(
        !waiting.is_finished(),
        "an answer past twice the TTL is not served"
    );
    profiles.source.gate.add_permits(1);
    waiting.await.unwrap().unwrap();
    assert_eq!(profiles.source.fetches.load(Ordering::SeqCst), 3);
}

/// A whole-GPU device as the node plugin publishes it with `--whole-gpus`: `type: gpu`, no
/// profile and no placement attributes.
fn whole_gpu(gpu: i64) -> Value {
    json!({"name": format!("gpu-{gpu}"), "attributes": {
        "type": {"string": "gpu"}, "gpuIndex": {"int": gpu}, "uuid": {"string": "GPU-x"}}})
}

#[test]
fn whole_gpus_are_counted_per_node_beside_the_placements() {
    let mig = |gpu, start| {
        let mut d = device(gpu, "1g.10gb", start, 1);
        d["attributes"]["type"] = json!({"string": "mig"});
        d
    };
    let slices = vec![
        serde_json::to_value(slice("n0", vec![whole_gpu(0), whole_gpu(1), mig(2, 0)])).unwrap(),
        serde_json::to_value(slice("n1", vec![whole_gpu(0)])).unwrap(),
        serde_json::to_value(slice("n2", vec![mig(0, 0), mig(0, 1)])).unwrap(),
    ];
    let mut paged = PlacementSummary::default();
    paged.add_page(decode_page(&page_body(&slices, None)).items);
    let mut from_typed = PlacementSummary::default();
    for s in typed(&slices) {
        from_typed.add_slice(&s);
    }
    assert_eq!(paged, from_typed);
    assert_eq!(paged.devices(), 6);
    assert_eq!(paged.max_whole_gpus_per_node(), Some(2), "n0 has two");
    assert_eq!(
        paged.max_per_node()["1g.10gb"],
        2,
        "whole GPUs are no profile"
    );
    assert_eq!(PlacementSummary::default().max_whole_gpus_per_node(), None);
}

#[tokio::test]
async fn whole_gpus_are_offered_only_when_translated() {
    struct WithGpus;
    impl Source for WithGpus {
        async fn fetch(&self) -> Result<Offered> {
            Ok(Offered {
                whole_gpus: Some(crate::translate::WholeGpus {
                    class: true,
                    max_per_node: Some(4),
                }),
                ..Offered::from(vec!["1g.10gb".to_string()])
            })
        }
    }
    let gpu = vec![das_api::LEGACY_WHOLE_GPU_RESOURCE.to_string()];
    let off = Arc::new(Profiles::with_source(
        WithGpus,
        Duration::from_secs(60),
        Duration::ZERO,
    ));
    assert!(!off.translates_whole_gpus());
    assert_eq!(off.get(&gpu).await.unwrap().whole_gpus, None);
    let on = Arc::new(
        Profiles::with_source(WithGpus, Duration::from_secs(60), Duration::ZERO)
            .translating_whole_gpus(true),
    );
    let first = on.get(&gpu).await.unwrap();
    assert_eq!(first.whole_gpus.as_ref().unwrap().max_per_node, Some(4));
    let cached = on
        .get(&gpu)
        .now_or_never()
        .expect("the cached answer covers whole GPUs")
        .unwrap();
    assert!(Arc::ptr_eq(&first, &cached));
}
