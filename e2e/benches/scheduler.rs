//! Scheduler throughput at cluster scale: how many pods per second kube-scheduler places when
//! every node publishes DAS's ResourceSlices, against plain devices and against the slice shapes
//! of two peer drivers. `make bench-scheduler` builds what it needs and runs it (docs/benchmarks.md).
//!
//! It runs upstream's scheduler_perf (`e2e/k8s/schedperf`, one test binary per Kubernetes
//! version): etcd, kube-apiserver, kube-scheduler and the ResourceClaim controller in one
//! process; nodes are API objects only. Every node has 8 × H100-80GB. Shapes:
//! - `das`: the slices das-kubelet-plugin publishes (from das-driver's own slice builder): 25
//!   devices per GPU (every profile at every placement), one counter set per GPU.
//! - `plain`: pre-partitioned MIG, 7 fixed `1g.10gb` devices per GPU, no counters. The baseline.
//! - `nvidia`: shaped like NVIDIA's DRA driver with DynamicMIG (v25.12): the whole GPU plus every
//!   profile at every placement, named `gpu-<g>-mig-<profile>-<profile id>-<start>` in name order,
//!   one `gpu-<g>-counter-set` with `memory-slice-<n>` counters, all counter sets in one slice and
//!   one device slice per GPU.
//! - `example`: the DRA example driver's partitionable GPUs (v0.4.0, `--gpu-partitions=4`): one
//!   `gpu-<i>-counters` set (memory 80Gi, compute 100) per GPU, 4 partitions and a `full` device,
//!   every device in one slice. (8 partitions would put 72 devices in that slice; the API server
//!   allows at most 64 in a slice whose devices consume counters.)
//!
//! Each pod has one claim from a template asking for one device: a `1g.10gb` (or a partition).
//! Reported per version, shape and node count: pods/s (scheduler_perf's 1-second samples:
//! average, p50, p99) and the DynamicResources plugin's Filter p99, with each shape's average as
//! a ratio to `plain` at the same node count in the same run.
//!
//! Environment: `DAS_SCHEDPERF_BINS` (`version=path,...`, set by the Makefile),
//! `DAS_BENCH_NODES` (default `10,50,100`), `DAS_BENCH_PODS` (the most pods per workload,
//! default 600; a workload of n nodes gets min(30 n, that): the example shape holds 32 per node),
//! `DAS_BENCH_SHAPES` (default `das,plain,nvidia,example`), `DAS_BENCH_CPUPROFILE` (a file:
//! scheduler_perf writes a Go CPU profile of the run there, for `go tool pprof`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use das_api::DRIVER_NAME;
use das_driver::gpu::catalog::find_model;
use das_driver::gpu::emulated::emulated_inventory;
use das_driver::publish::resource_slices::{ResourceSliceLayout, desired_resource_slices};
use serde_json::{Value, json};

const GPUS: &str = "H100-80GB:8";
const GPU_COUNT: usize = 8;
/// Replaced by scheduler_perf's per-node template index in every slice.
const NODE: &str = "scheduler-perf-dra-{{.Index}}";
const PLACEHOLDER: &str = "node-placeholder";
const PROFILE: &str = "1g.10gb";

fn main() -> Result<()> {
    let bins = env_list("DAS_SCHEDPERF_BINS", "")?;
    ensure!(
        !bins.is_empty(),
        "DAS_SCHEDPERF_BINS is empty: run `make bench-scheduler`, which builds e2e/k8s/schedperf per Kubernetes version"
    );
    let nodes: Vec<u32> = env_list("DAS_BENCH_NODES", "10,50,100")?
        .iter()
        .map(|n| n.parse().context("DAS_BENCH_NODES"))
        .collect::<Result<_>>()?;
    let pods: u32 = std::env::var("DAS_BENCH_PODS")
        .unwrap_or_else(|_| "600".into())
        .parse()
        .context("DAS_BENCH_PODS")?;
    let shapes = env_list("DAS_BENCH_SHAPES", "das,plain,nvidia,example")?;
    let root = das_e2e::install::target_dir().join("bench-scheduler");
    std::fs::create_dir_all(&root)?;
    let templates = write_templates(&root, &shapes)?;

    for entry in bins {
        let (version, bin) = entry
            .split_once('=')
            .with_context(|| format!("DAS_SCHEDPERF_BINS entry {entry:?} is not version=path"))?;
        let dir = root.join(version);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let config = dir.join("config.yaml");
        std::fs::write(
            &config,
            serde_json::to_string_pretty(&config_of(&templates, &nodes, pods))?,
        )?;
        eprintln!("scheduler_perf on Kubernetes {version}: {shapes:?} at {nodes:?} nodes");
        let t0 = Instant::now();
        run_schedperf(Path::new(bin), &config, &dir)?;
        let results = read_results(&dir)?;
        print_table(
            version,
            &results,
            &shapes,
            &nodes,
            pods,
            t0.elapsed().as_secs(),
        );
    }
    Ok(())
}

fn env_list(name: &str, default: &str) -> Result<Vec<String>> {
    Ok(std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect())
}

/// The files of one shape, as scheduler_perf templates.
struct ShapeFiles {
    name: String,
    slices: Vec<PathBuf>,
    class: PathBuf,
    claim_template: PathBuf,
}

struct Templates {
    node: PathBuf,
    pod: PathBuf,
    shapes: Vec<ShapeFiles>,
}

fn write_templates(root: &Path, shapes: &[String]) -> Result<Templates> {
    let dir = root.join("templates");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let write = |name: &str, v: &Value| -> Result<PathBuf> {
        let p = dir.join(name);
        // JSON is YAML; the node placeholder becomes scheduler_perf's template index.
        std::fs::write(
            &p,
            serde_json::to_string_pretty(v)?.replace(PLACEHOLDER, NODE),
        )?;
        Ok(p)
    };
    let node = write("node.yaml", &node())?;
    let pod = write("pod.yaml", &pod())?;
    let mut out = Vec::new();
    for shape in shapes {
        let (slices, driver, selector) = match shape.as_str() {
            "das" => (das_slices()?, DRIVER_NAME, das_selector()),
            "plain" => (plain_slices()?, DRIVER_NAME, das_selector()),
            "das-no-me" => (
                das_without(|d| !attr_str(d, "profile").contains('+'))?,
                DRIVER_NAME,
                das_selector(),
            ),
            "das-four" => (
                das_without(|d| FOUR_PROFILES.contains(&attr_str(d, "profile")))?,
                DRIVER_NAME,
                das_selector(),
            ),
            "das-lean" => (das_lean()?, DRIVER_NAME, das_selector()),
            "nvidia" => (nvidia_slices()?, NVIDIA_DRIVER, nvidia_selector()),
            "example" => (example_slices(), EXAMPLE_DRIVER, example_selector()),
            other => bail!(
                "unknown shape {other:?}: das, plain, nvidia, example, das-no-me, das-four or das-lean"
            ),
        };
        let count = slices.len();
        let mut files = Vec::new();
        for (i, spec) in slices.into_iter().enumerate() {
            files.push(write(
                &format!("{shape}-slice-{i}.yaml"),
                &slice(&format!("{shape}-{PLACEHOLDER}-{i}"), driver, count, spec),
            )?);
        }
        let class_name = format!("bench-{shape}");
        out.push(ShapeFiles {
            name: shape.clone(),
            slices: files,
            class: write(
                &format!("{shape}-class.yaml"),
                &json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                    "metadata": {"name": class_name},
                    "spec": {"selectors": [{"cel": {"expression": selector}}]}}),
            )?,
            claim_template: write(
                &format!("{shape}-claim-template.yaml"),
                &json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                    "metadata": {"name": "bench-claim"},
                    "spec": {"spec": {"devices": {"requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": class_name, "count": 1}}]}}}}),
            )?,
        });
    }
    Ok(Templates {
        node,
        pod,
        shapes: out,
    })
}

fn node() -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": PLACEHOLDER},
        "status": {"capacity": {"pods": "110", "cpu": "64", "memory": "512Gi"},
            "conditions": [{"type": "Ready", "status": "True"}], "phase": "Running"}})
}

fn pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "bench-"},
        "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10.1",
                "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "bench-claim"}]}})
}

fn slice(name: &str, driver: &str, count: usize, mut spec: Value) -> Value {
    spec["driver"] = json!(driver);
    spec["nodeName"] = json!(PLACEHOLDER);
    spec["pool"] = json!({"name": PLACEHOLDER, "generation": 1, "resourceSliceCount": count});
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name}, "spec": spec})
}

fn das_selector() -> String {
    format!(
        "device.driver == '{DRIVER_NAME}' && device.attributes['{DRIVER_NAME}'].profile == '{PROFILE}'"
    )
}

/// What das-kubelet-plugin publishes for the node (`--print-resource-slices` prints the same),
/// as slice specs without the pool fields.
fn das_slices() -> Result<Vec<Value>> {
    let gpus = emulated_inventory(GPUS, PLACEHOLDER)?;
    let slices = desired_resource_slices(
        PLACEHOLDER,
        &gpus,
        ResourceSliceLayout::SeparateCounterSlices,
    )?;
    slices
        .into_iter()
        .map(|s| {
            let mut spec = serde_json::to_value(&s.slice.spec)?;
            let obj = spec.as_object_mut().context("slice spec")?;
            obj.remove("pool");
            Ok(spec)
        })
        .collect()
}

/// The profiles of the `das-four` shape: one per size NVIDIA's fixed MIG layouts use most.
const FOUR_PROFILES: [&str; 4] = ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"];

fn attr_str<'a>(device: &'a Value, name: &str) -> &'a str {
    attr(device, name).as_str().unwrap_or_default()
}

/// DAS's slices with `edit` applied to each slice's device list.
fn das_edited(mut edit: impl FnMut(&mut Vec<Value>)) -> Result<Vec<Value>> {
    let mut slices = das_slices()?;
    for s in &mut slices {
        if let Some(devices) = s.get_mut("devices").and_then(Value::as_array_mut) {
            edit(devices);
        }
    }
    Ok(slices)
}

/// DAS's slices keeping only the devices `keep` accepts (a node that publishes fewer profiles).
fn das_without(keep: impl Fn(&Value) -> bool) -> Result<Vec<Value>> {
    das_edited(|devices| devices.retain(&keep))
}

/// DAS's slices with only the `memory` and `multiprocessors` capacities (the engine counts
/// dropped): what the per-device capacities cost the allocator.
fn das_lean() -> Result<Vec<Value>> {
    das_edited(|devices| {
        for cap in devices
            .iter_mut()
            .filter_map(|d| d.get_mut("capacity").and_then(Value::as_object_mut))
        {
            cap.retain(|k, _| k == "memory" || k == "multiprocessors");
        }
    })
}

/// Every device of `slices`, in publish order.
fn devices_of(slices: &[Value]) -> Vec<Value> {
    slices
        .iter()
        .flat_map(|s| s["devices"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn attr<'a>(device: &'a Value, name: &str) -> &'a Value {
    let a = &device["attributes"][name];
    if a.get("string").is_some() {
        &a["string"]
    } else {
        &a["int"]
    }
}

/// The DAS devices of the profile, without counters, all in one slice.
fn plain_slices() -> Result<Vec<Value>> {
    let devices: Vec<Value> = devices_of(&das_slices()?)
        .into_iter()
        .filter(|d| attr(d, "profile") == PROFILE)
        .map(|mut d| {
            d.as_object_mut().map(|o| o.remove("consumesCounters"));
            d
        })
        .collect();
    ensure!(
        devices.len() == 7 * GPU_COUNT,
        "{} plain devices",
        devices.len()
    );
    Ok(vec![json!({"devices": devices})])
}

const NVIDIA_DRIVER: &str = "gpu.nvidia.com";

fn nvidia_selector() -> String {
    format!(
        "device.driver == '{NVIDIA_DRIVER}' && device.attributes['{NVIDIA_DRIVER}'].type == 'mig' && device.attributes['{NVIDIA_DRIVER}'].profile == '{PROFILE}'"
    )
}

/// NVIDIA's `pname`: the profile without dots, lower case, anything outside `[a-z0-9-.]` → `-`.
fn nvidia_profile_name(profile: &str) -> String {
    profile
        .replace('.', "")
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// The DAS devices renamed and reordered as NVIDIA's DynamicMIG names them, plus the whole GPU.
fn nvidia_slices() -> Result<Vec<Value>> {
    let model = find_model("H100-80GB")?.context("H100-80GB model")?;
    let das = das_slices()?;
    let counter_sets: Vec<Value> = das
        .iter()
        .flat_map(|s| s["sharedCounters"].as_array().cloned().unwrap_or_default())
        .collect();
    ensure!(counter_sets.len() == GPU_COUNT, "one counter set per GPU");
    let mut per_gpu: BTreeMap<i64, Vec<(String, Value)>> = BTreeMap::new();
    for mut d in devices_of(&das) {
        let g = attr(&d, "gpuIndex").as_i64().context("gpuIndex")?;
        let profile = attr(&d, "profile").as_str().context("profile")?.to_string();
        let start = attr(&d, "placementStart")
            .as_i64()
            .context("placementStart")?;
        let id = model
            .profiles
            .iter()
            .find(|p| p.name == profile)
            .with_context(|| format!("profile {profile}"))?
            .id;
        let name = format!("gpu-{g}-mig-{}-{id}-{start}", nvidia_profile_name(&profile));
        d["name"] = json!(name);
        let attrs = d["attributes"].as_object_mut().context("attributes")?;
        for gone in ["gpuIndex", "placementStart", "placementSize"] {
            attrs.remove(gone);
        }
        attrs.insert("brand".into(), json!({"string": "Nvidia"}));
        per_gpu.entry(g).or_default().push((name, d));
    }
    let mut slices = vec![json!({"sharedCounters": counter_sets})];
    for (g, mut devices) in per_gpu {
        let set = &counter_sets[g as usize];
        let whole = json!({"name": format!("gpu-{g}"),
            "attributes": {"type": {"string": "gpu"}, "productName": {"string": model.product_name},
                "brand": {"string": "Nvidia"}, "architecture": {"string": model.architecture}},
            "consumesCounters": [{"counterSet": set["name"], "counters": set["counters"]}]});
        devices.push((format!("gpu-{g}"), whole));
        devices.sort_by(|a, b| a.0.cmp(&b.0));
        let devices: Vec<Value> = devices.into_iter().map(|(_, d)| d).collect();
        slices.push(json!({"devices": devices}));
    }
    Ok(slices)
}

const EXAMPLE_DRIVER: &str = "gpu.example.com";
const EXAMPLE_PARTITIONS: usize = 4;

fn example_selector() -> String {
    format!(
        "device.driver == '{EXAMPLE_DRIVER}' && has(device.attributes['{EXAMPLE_DRIVER}'].partition)"
    )
}

/// dra-example-driver v0.4.0 `internal/profiles/gpu`: counters in slice 0, every device in
/// slice 1; per GPU its partitions, then its `full` device.
fn example_slices() -> Vec<Value> {
    let memory = format!("{}Gi", 80 / EXAMPLE_PARTITIONS);
    let compute = (100 / EXAMPLE_PARTITIONS).to_string();
    let mut sets = Vec::new();
    let mut devices = Vec::new();
    for i in 0..GPU_COUNT {
        let set = format!("gpu-{i}-counters");
        sets.push(json!({"name": set, "counters": {"memory": {"value": "80Gi"}, "compute": {"value": "100"}}}));
        let base = json!({"index": {"int": i}, "uuid": {"string": format!("gpu-{i:08x}-0000-0000-0000-000000000000")},
            "model": {"string": "LATEST-GPU-MODEL"}, "driverVersion": {"version": "1.0.0"},
            "partitionable": {"bool": true}});
        for j in 0..EXAMPLE_PARTITIONS {
            let mut attributes = base.clone();
            attributes["partition"] = json!({"int": j});
            devices.push(
                json!({"name": format!("gpu-{i}-partition-{j}"), "attributes": attributes,
                "capacity": {"memory": {"value": memory}, "compute": {"value": compute}},
                "consumesCounters": [{"counterSet": set,
                    "counters": {"memory": {"value": memory}, "compute": {"value": compute}}}]}),
            );
        }
        let mut attributes = base.clone();
        attributes["full"] = json!({"bool": true});
        devices.push(
            json!({"name": format!("gpu-{i}-full"), "attributes": attributes,
            "capacity": {"memory": {"value": "80Gi"}, "compute": {"value": "100"}},
            "consumesCounters": [{"counterSet": set,
                "counters": {"memory": {"value": "80Gi"}, "compute": {"value": "100"}}}]}),
        );
    }
    vec![json!({"sharedCounters": sets}), json!({"devices": devices})]
}

/// Pods in a workload of `nodes` nodes: 30 per node (the example shape holds 32), at most `max`.
fn pods_for(nodes: u32, max: u32) -> u32 {
    (30 * nodes).min(max)
}

/// scheduler_perf's config: one test case per shape, one workload per node count.
fn config_of(t: &Templates, nodes: &[u32], pods: u32) -> Value {
    let cases: Vec<Value> = t
        .shapes
        .iter()
        .map(|s| {
            let mut ops = vec![json!({"opcode": "createNodes", "nodeTemplatePath": t.node, "countParam": "$nodes"})];
            for p in &s.slices {
                ops.push(json!({"opcode": "createAny", "templatePath": p, "countParam": "$nodes"}));
            }
            ops.push(json!({"opcode": "createAny", "templatePath": s.class}));
            ops.push(json!({"opcode": "createAny", "templatePath": s.claim_template, "namespace": "test"}));
            ops.push(json!({"opcode": "createPods", "namespace": "test", "countParam": "$pods",
                "podTemplatePath": t.pod, "collectMetrics": true}));
            let workloads: Vec<Value> = nodes
                .iter()
                .map(|n| json!({"name": format!("{n}nodes"), "labels": ["performance"],
                    "params": {"nodes": n, "pods": pods_for(*n, pods)}}))
                .collect();
            // scheduler_perf starts the ResourceClaim controller only when the test case names
            // the gate, whatever its default.
            json!({"name": s.name, "featureGates": {"DynamicResourceAllocation": true},
                "workloadTemplate": ops, "workloads": workloads})
        })
        .collect();
    json!(cases)
}

fn run_schedperf(bin: &Path, config: &Path, dir: &Path) -> Result<()> {
    ensure!(
        bin.exists(),
        "{} not found: run `make bench-scheduler`",
        bin.display()
    );
    // scheduler_perf starts etcd from PATH: the multi-call binary's `etcd` link.
    let etcd_dir = das_e2e::cluster::workspace_root().join(".local/bin");
    let path = format!(
        "{}:{}",
        etcd_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let log = std::fs::File::create(dir.join("schedperf.log"))?;
    let status = Command::new(bin)
        .current_dir(dir)
        .env("PATH", path)
        .env("DAS_SCHEDPERF_CONFIG", config)
        .args([
            "-test.run",
            "^$",
            "-test.bench",
            ".",
            "-test.benchtime",
            "1x",
        ])
        .args(["-perf-scheduling-label-filter", "performance"])
        .arg(format!("-data-items-dir={}", dir.display()))
        // A Go CPU profile of the whole run (API server, scheduler and all), for `go tool pprof`.
        .args(
            std::env::var("DAS_BENCH_CPUPROFILE")
                .ok()
                .map(|p| format!("-test.cpuprofile={p}")),
        )
        .stdout(log.try_clone()?)
        .stderr(log)
        .status()
        .with_context(|| format!("run {}", bin.display()))?;
    if !status.success() {
        // Some workloads may still have results: print them, and say where the failure is.
        eprintln!(
            "{} failed ({status}): see `--- FAIL` and `FATAL ERROR` in {}",
            bin.display(),
            dir.join("schedperf.log").display()
        );
    }
    Ok(())
}

/// One workload's figures.
#[derive(Default, Debug)]
struct Figures {
    avg: f64,
    p50: f64,
    p99: f64,
    filter_p99_ms: Option<f64>,
}

/// `(shape, workload)` → figures, from scheduler_perf's JSON data items.
fn read_results(dir: &Path) -> Result<BTreeMap<(String, String), Figures>> {
    let mut out: BTreeMap<(String, String), Figures> = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let p = entry?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if !(name.starts_with("BenchmarkPerfScheduling") && name.ends_with(".json")) {
            continue;
        }
        let v: Value = serde_json::from_slice(&std::fs::read(&p)?)?;
        for item in v["dataItems"].as_array().into_iter().flatten() {
            let labels = &item["labels"];
            // "BenchmarkPerfScheduling/<shape>/<workload>/<namespace>"
            let mut name = labels["Name"]
                .as_str()
                .unwrap_or_default()
                .split('/')
                .skip(1);
            let (Some(shape), Some(workload)) = (name.next(), name.next()) else {
                continue;
            };
            let (shape, workload) = (shape.to_string(), workload.to_string());
            let data = &item["data"];
            let f = out.entry((shape, workload)).or_default();
            match labels["Metric"].as_str() {
                Some("SchedulingThroughput") => {
                    f.avg = data["Average"].as_f64().unwrap_or_default();
                    f.p50 = data["Perc50"].as_f64().unwrap_or_default();
                    f.p99 = data["Perc99"].as_f64().unwrap_or_default();
                }
                Some("scheduler_plugin_execution_duration_seconds")
                    if labels["plugin"] == "DynamicResources"
                        && labels["extension_point"] == "Filter" =>
                {
                    f.filter_p99_ms = data["Perc99"].as_f64();
                }
                _ => {}
            }
        }
    }
    ensure!(
        !out.is_empty(),
        "no scheduler_perf results in {}",
        dir.display()
    );
    Ok(out)
}

fn print_table(
    version: &str,
    results: &BTreeMap<(String, String), Figures>,
    shapes: &[String],
    nodes: &[u32],
    pods: u32,
    secs: u64,
) {
    println!(
        "\nKubernetes {version}: min(30 × nodes, {pods}) pods, one 1-device claim each, nodes with 8 × H100-80GB ({secs} s)"
    );
    println!(
        "| shape | nodes | pods/s avg | p50 | p99 | DynamicResources Filter p99 (ms) | avg vs plain |"
    );
    println!("|---|---|---|---|---|---|---|");
    for n in nodes {
        let w = format!("{n}nodes");
        let plain = results
            .get(&("plain".to_string(), w.clone()))
            .map(|f| f.avg);
        for s in shapes {
            let Some(f) = results.get(&(s.clone(), w.clone())) else {
                println!("| {s} | {n} | (no result) | | | | |");
                continue;
            };
            let ratio = plain
                .filter(|p| *p > 0.0)
                .map_or("-".to_string(), |p| format!("{:.2}×", f.avg / p));
            let filter = f
                .filter_p99_ms
                .map_or("-".to_string(), |ms| format!("{ms:.2}"));
            println!(
                "| {s} | {n} | {:.1} | {:.1} | {:.1} | {filter} | {ratio} |",
                f.avg, f.p50, f.p99
            );
        }
    }
}
