//! Benchmark: memory of the webhook's refresh of the offered profiles (the ResourceSlices part),
//! in process (no cluster).
//!
//! Each node is what das-kubelet-plugin publishes for 8 emulated H100-80GB (200 devices in 4
//! device slices, one counter slice; `das_e2e::das::printed_resource_slices`, metadata as the API
//! server adds it), renamed per node. For each cluster size, one refresh is run on the JSON the
//! API server would send:
//! - before: one list of every DAS slice, its whole text held and decoded into
//!   `ResourceSlice`s, then `max_per_node` over them;
//! - now: pages of [`SLICE_PAGE_SIZE`] slices, each decoded into [`SlicePlacements`] (the four
//!   attributes read) and folded into a [`PlacementSummary`], then its `max_per_node`.
//!
//! Printed: the peak of heap bytes live during the refresh (the page texts included), the
//! summary's size before it is reduced, and the answer's size (what stays cached). Counted with
//! a counting global allocator (`das_e2e::alloc_count`; requested sizes, not the allocator's own
//! overhead or the process's code and stacks). Both answers are checked to be equal.
//!
//! Needs the plugin binary (`cargo build -p das-driver --bin das-kubelet-plugin`, or
//! `--release`). Run: `make bench-memory`, or `cargo bench --profile dev -p das-e2e
//! --bench webhook_slice_memory` (heap figures do not depend on the optimization level). Prints a
//! table; figures go into docs/benchmarks.md by hand. `DAS_BENCH_NODES=125,1000` sets the sizes.

use std::time::Instant;

use anyhow::{Result, ensure};
use das_e2e::alloc_count::{Counting, measure};
use das_e2e::das::{bench_node_counts, printed_resource_slices, slice_list_text};
use das_webhook::profiles::{PlacementSummary, SLICE_PAGE_SIZE, SlicePlacements, max_per_node};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::core::ObjectList;

#[global_allocator]
static ALLOC: Counting = Counting;

const GPUS: &str = "H100-80GB:8";
const TEMPLATE_NODE: &str = "das-bench-template-node";

fn main() -> Result<()> {
    let sizes = bench_node_counts("125,1000")?;
    let template: Vec<String> = printed_resource_slices(GPUS, TEMPLATE_NODE)?
        .iter()
        .map(serde_json::to_string)
        .collect::<Result<_, _>>()?;
    println!(
        "| nodes | GPUs | devices | JSON | refresh peak before (one list) | refresh peak now (pages of {SLICE_PAGE_SIZE}) | summary | answer | time before | time now |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for nodes in sizes {
        // As the API server lists them: by name, `<index>-mig.das.com-<node>`.
        let mut items: Vec<(String, String)> = (0..nodes)
            .flat_map(|i| {
                let node = format!("node-{i:04}");
                template.iter().map(move |t| {
                    let s = t.replace(TEMPLATE_NODE, &node);
                    let v: serde_json::Value = serde_json::from_str(&s).expect("JSON");
                    (v["metadata"]["name"].as_str().unwrap_or("").to_string(), s)
                })
            })
            .collect();
        items.sort();
        let items: Vec<String> = items.into_iter().map(|(_, s)| s).collect();
        let json: usize = items.iter().map(String::len).sum();

        let t = Instant::now();
        let (old, _, old_peak) = measure(|| {
            let text = slice_list_text(&items);
            let list: ObjectList<ResourceSlice> = serde_json::from_str(&text).expect("a list");
            max_per_node(&list.items)
        });
        let old_time = t.elapsed();

        let t = Instant::now();
        let ((new, devices, summary_bytes), _, new_peak) = measure(|| {
            let (summary, summary_bytes, _) = measure(|| {
                let mut summary = PlacementSummary::default();
                for page in items.chunks(SLICE_PAGE_SIZE as usize) {
                    let text = slice_list_text(page);
                    let page: ObjectList<SlicePlacements> =
                        serde_json::from_str(&text).expect("a page");
                    drop(text);
                    summary.add_page(page.items);
                }
                summary
            });
            let devices = summary.devices();
            (summary.max_per_node(), devices, summary_bytes)
        });
        let new_time = t.elapsed();
        ensure!(old == new, "the same answer: {old:?} / {new:?}");
        let (answer, answer_bytes, _) = measure(|| new.clone());
        drop(answer);
        println!(
            "| {nodes} | {} | {devices} | {} | {} | {} | {} | {} B | {:.1} s | {:.1} s |",
            nodes * 8,
            mib(json),
            mib(old_peak),
            mib(new_peak),
            mib(summary_bytes),
            answer_bytes,
            old_time.as_secs_f64(),
            new_time.as_secs_f64(),
        );
    }
    Ok(())
}

fn mib(bytes: usize) -> String {
    let m = bytes as f64 / (1024.0 * 1024.0);
    if m >= 10.0 {
        format!("{m:.0} MiB")
    } else {
        format!("{m:.1} MiB")
    }
}
