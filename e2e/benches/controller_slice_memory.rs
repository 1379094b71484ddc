//! Benchmark: memory of the controller's ResourceSlice cache, in process (no cluster).
//!
//! Each node is what das-kubelet-plugin publishes for 8 emulated H100-80GB (200 devices in 4
//! device slices, one counter slice; `das_e2e::das::printed_resource_slices`, metadata as the API
//! server adds it), renamed per node. For each cluster size, the slices are fed as JSON, one
//! object at a time as a watch delivers them, into a kube-runtime reflector store of
//! - `ResourceSlice`: the whole objects (the controller before this change);
//! - `ResourceSlice, trimmed`: whole objects decoded, then cut down to what the mirror reads by a
//!   `modify()` before the store (metadata, capacities, counters, other attributes and taints
//!   dropped), still as k8s-openapi types;
//! - `PublishedSlice`: decoded straight into the controller's kept form (the controller now).
//!
//! The heap bytes the store holds afterwards are counted with a counting global allocator
//! (`das_e2e::alloc_count`; requested sizes, not the allocator's own overhead or the process's
//! code and stacks), and so is the peak while one initial-list page is decoded: 500 slices
//! (kube-runtime's default page) of whole objects before, [`SLICE_PAGE_SIZE`] kept ones now,
//! the page's JSON text included.
//!
//! Needs the plugin binary (`cargo build -p das-driver --bin das-kubelet-plugin`, or
//! `--release`). Run: `make bench-memory`, or `cargo bench --profile dev -p das-e2e
//! --bench controller_slice_memory` (heap figures do not depend on the optimization level). Prints a
//! table; figures go into docs/benchmarks.md by hand. `DAS_BENCH_NODES=125,1000` sets the sizes.

use std::time::Instant;

use anyhow::{Context, Result, ensure};
use das_controller::mirror::DeviceIndex;
use das_controller::published::{self, PublishedSlice, SLICE_PAGE_SIZE};
use das_e2e::alloc_count::{Counting, measure};
use das_e2e::das::{
    bench_node_counts, devices_in, printed_resource_slices, slice_list_text, slices_for_nodes,
};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::core::ObjectList;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::Event;
use serde::de::DeserializeOwned;

#[global_allocator]
static ALLOC: Counting = Counting;

const GPUS: &str = "H100-80GB:8";
const TEMPLATE_NODE: &str = "das-bench-template-node";
/// kube-runtime's default page size of an initial list (`watcher::Config::default()`).
const DEFAULT_PAGE: usize = 500;

fn main() -> Result<()> {
    let sizes = bench_node_counts("125,1000")?;
    let template: Vec<String> = printed_resource_slices(GPUS, TEMPLATE_NODE)?
        .iter()
        .map(serde_json::to_string)
        .collect::<Result<_, _>>()?;
    let per_node_devices = devices_in(&template)?;
    println!(
        "one node ({GPUS}): {} slices, {per_node_devices} devices, {:.1} kB of JSON",
        template.len(),
        template.iter().map(String::len).sum::<usize>() as f64 / 1e3
    );
    println!();
    println!(
        "| nodes | GPUs | devices | JSON | ResourceSlice | ResourceSlice, trimmed | PublishedSlice | per device now | page before (500 whole) | page now ({SLICE_PAGE_SIZE} kept) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for nodes in sizes {
        let bodies = slices_for_nodes(&template, TEMPLATE_NODE, nodes);
        let json: usize = bodies.iter().map(String::len).sum();
        let devices = nodes * per_node_devices;

        let t = Instant::now();
        let (full, full_bytes, _) = measure(|| store_of::<ResourceSlice>(&bodies, |_| {}));
        let full_time = t.elapsed();
        let sample_full = full.state().first().cloned();
        drop(full);
        let (trimmed, trimmed_bytes, _) = measure(|| store_of(&bodies, trim));
        drop(trimmed);
        let t = Instant::now();
        let (kept, kept_bytes, _) = measure(|| store_of::<PublishedSlice>(&bodies, |_| {}));
        let kept_time = t.elapsed();
        ensure!(
            kept.state().iter().map(|s| s.devices.len()).sum::<usize>() == devices,
            "every device kept"
        );
        // The mirror reads the same facts from both forms.
        let full = sample_full.context("a slice")?;
        let same = kept
            .state()
            .into_iter()
            .find(|s| s.pool == full.spec.pool.name && s.devices.len() == full_devices(&full))
            .context("the kept slice")?;
        let (a, b) = (
            DeviceIndex::from_slices([full.as_ref()]),
            published::device_index([same.as_ref()]),
        );
        ensure!(a.len() == b.len(), "same index");
        drop(kept);

        let before = page_peak::<ResourceSlice>(&bodies[..DEFAULT_PAGE.min(bodies.len())]);
        let now =
            page_peak::<PublishedSlice>(&bodies[..(SLICE_PAGE_SIZE as usize).min(bodies.len())]);
        println!(
            "| {nodes} | {} | {devices} | {} | {} | {} | {} | {:.0} B | {} | {} |",
            nodes * 8,
            mib(json),
            mib(full_bytes),
            mib(trimmed_bytes),
            mib(kept_bytes),
            kept_bytes as f64 / devices as f64,
            mib(before),
            mib(now),
        );
        eprintln!(
            "  ({nodes} nodes: decoding into the store took {:.1} s whole, {:.1} s kept)",
            full_time.as_secs_f64(),
            kept_time.as_secs_f64()
        );
    }
    Ok(())
}

fn full_devices(s: &ResourceSlice) -> usize {
    DeviceIndex::from_slices([s]).len()
}

/// A reflector store fed every body as a watch event, each object decoded as `K` and passed
/// through `modify` first (as `WatchStreamExt::modify` does before `reflect`).
fn store_of<K>(bodies: &[String], modify: fn(&mut K)) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + 'static,
{
    let (reader, mut writer) = reflector::store::<K>();
    writer.apply_watcher_event(&Event::Init);
    for b in bodies {
        let mut obj: K = serde_json::from_str(b).expect("a ResourceSlice");
        modify(&mut obj);
        writer.apply_watcher_event(&Event::InitApply(obj));
    }
    writer.apply_watcher_event(&Event::InitDone);
    reader
}

/// The most heap bytes live at once while one list page of `items` is read: its JSON text (the
/// client holds it whole) and the decoded `ObjectList<K>`.
fn page_peak<K: DeserializeOwned + Clone>(items: &[String]) -> usize {
    let (_, _, peak) = measure(|| {
        let text = slice_list_text(items);
        let page: ObjectList<K> = serde_json::from_str(&text).expect("a page");
        drop(text);
        page.items.len()
    });
    peak
}

/// What a `modify()` before the store could cut while keeping k8s-openapi's types: everything
/// but the names the store keys on, the pool, and of each device its name, the four attributes
/// the mirror reads (short or qualified names) and the DAS health taints.
fn trim(s: &mut ResourceSlice) {
    let meta = std::mem::take(&mut s.metadata);
    s.metadata.name = meta.name;
    s.metadata.uid = meta.uid;
    s.metadata.resource_version = meta.resource_version;
    s.spec.shared_counters = None;
    s.spec.node_name = None;
    let read = ["profile", "parentUUID", "placementStart", "placementSize"];
    for d in s.spec.devices.iter_mut().flatten() {
        d.capacity = None;
        d.consumes_counters = None;
        if let Some(a) = d.attributes.as_mut() {
            a.retain(|k, _| {
                let short = k.strip_prefix("mig.das.com/").unwrap_or(k);
                read.contains(&short)
            });
        }
        if let Some(t) = d.taints.as_mut() {
            t.retain(|t| t.key.starts_with("mig.das.com/"));
        }
    }
}

fn mib(bytes: usize) -> String {
    let m = bytes as f64 / (1024.0 * 1024.0);
    if m >= 10.0 {
        format!("{m:.0} MiB")
    } else {
        format!("{m:.1} MiB")
    }
}
