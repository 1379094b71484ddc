//! Benchmark: the heap `kubectl das gpus|free` needs to read a cluster's DAS ResourceSlices, in
//! process (no cluster; issue 30 item 7).
//!
//! Each node is what das-kubelet-plugin publishes for 8 emulated H100-80GB (200 devices in 4
//! device slices and a counter slice; `das_e2e::das::printed_resource_slices`, metadata as the
//! API server adds it), renamed per node. For each size, the JSON the API server would send is
//! read into `kubectl_das::inventory::Inventory`:
//! - one list: every slice in one response, decoded whole into `ResourceSlice`s (how
//!   `kubectl das` read them before pages);
//! - pages: [`SLICE_PAGE_SIZE`] slices a response, each decoded into `SliceFields` (only what the
//!   inventory reads) and cut down to `PublishedSlice`s before the next (`fetch::published_slices`).
//!
//! Printed: the peak of heap bytes live while reading (the response text included) and what the
//! inventory keeps. Counted with a counting global allocator (`das_e2e::alloc_count`; requested
//! sizes, not the allocator's overhead, code or stacks). Both inventories are checked equal.
//!
//! Needs the plugin binary (`cargo build -p das-driver --bin das-kubelet-plugin`). Run:
//! `cargo bench --profile dev -p das-e2e --bench kubectl_das_memory` (heap figures do not depend
//! on the optimization level). `DAS_BENCH_NODES=250,1000` sets the sizes.

use anyhow::{Result, ensure};
use das_e2e::alloc_count::{Counting, measure};
use das_e2e::das::{bench_node_counts, printed_resource_slices, slice_list_text, slices_for_nodes};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::core::ObjectList;
use kubectl_das::fetch::SLICE_PAGE_SIZE;
use kubectl_das::fields::SliceFields;
use kubectl_das::inventory::{Inventory, PublishedSlice};

#[global_allocator]
static ALLOC: Counting = Counting;

const GPUS: &str = "H100-80GB:8";
const TEMPLATE_NODE: &str = "das-bench-template-node";

/// What the picture shows of `inv`, to check two reads agree.
fn shown(inv: &Inventory) -> String {
    format!("{:?} {:?} {:?}", inv.gpus, inv.devices, inv.capacity)
}

fn main() -> Result<()> {
    let sizes = bench_node_counts("250,1000")?;
    let template: Vec<String> = printed_resource_slices(GPUS, TEMPLATE_NODE)?
        .iter()
        .map(serde_json::to_string)
        .collect::<Result<_, _>>()?;
    println!(
        "| nodes | devices | JSON | one list, whole: peak | pages of {SLICE_PAGE_SIZE}, fields read: peak | inventory kept | per device |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    for nodes in sizes {
        let items = slices_for_nodes(&template, TEMPLATE_NODE, nodes);
        let json: usize = items.iter().map(String::len).sum();
        let whole = slice_list_text(&items);
        let pages: Vec<String> = items
            .chunks(SLICE_PAGE_SIZE as usize)
            .map(slice_list_text)
            .collect();
        drop(items);

        // Before: the response text and every slice decoded whole, then the inventory.
        let (before, _, before_peak) = measure(|| {
            let text = whole.clone();
            let l: ObjectList<ResourceSlice> = serde_json::from_str(&text).expect("a list");
            Inventory::new(&l.items, &[]).expect("an inventory")
        });
        drop(whole);

        // Now: one page's text and fields at a time.
        let (now, kept, now_peak) = measure(|| {
            let mut published = Vec::new();
            for p in &pages {
                let text = p.clone();
                let l: ObjectList<SliceFields> = serde_json::from_str(&text).expect("a page");
                for s in l.items {
                    published.extend(PublishedSlice::from_fields(s).expect("a slice"));
                }
            }
            Inventory::from_published(published, &[])
        });
        ensure!(
            shown(&before) == shown(&now),
            "the two reads disagree at {nodes} nodes"
        );
        let devices = now.devices.len();
        println!(
            "| {nodes} | {devices} | {:.0} MiB | {:.0} MiB | {:.0} MiB | {:.0} MiB | {:.0} B |",
            mib(json),
            mib(before_peak),
            mib(now_peak),
            mib(kept),
            kept as f64 / devices as f64,
        );
    }
    Ok(())
}
