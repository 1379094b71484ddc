//! The read-only inventory report of `das-kubelet-plugin --print-inventory`: the driver and
//! CUDA versions; every GPU, its PCI IDs, brand and MIG mode (or that it has none), the
//! data-file model it matches, every GI
//! profile NVML reports (enum → real ID, name, memory, SMs, count, placements) and the GPU
//! instances that exist. It only reads: it never changes MIG mode and never creates or destroys
//! instances.

use std::fmt::Write;

use super::architecture_name;
use super::backend::{switch_base, with_pending};
use super::{DeviceIdentity, MigModeState, NvmlOptions};
use super::{
    GI_ENUM_NAMES, GI_PROFILE_ENUM_COUNT, GiProfileInfo, NvmlApi, NvmlResult, brand_name, code,
    cuda_version,
};
use crate::gpu::MigSwitch;
use crate::gpu::catalog::find_model_for_gpu;
use crate::gpu::layout::Placement;
use crate::gpu::model::GpuModel;

/// The report as text, one block per GPU. NVML errors are printed in place, not returned.
pub fn inventory_report<A: NvmlApi>(api: &A) -> String {
    let mut out = String::new();
    let count = match api.device_count() {
        Ok(n) => n,
        Err(e) => return format!("cannot count GPUs: {e}\n"),
    };
    let driver = api.driver_version().unwrap_or_else(|e| e.to_string());
    let cuda = api
        .cuda_driver_version()
        .map_or_else(|e| e.to_string(), cuda_version);
    let _ = writeln!(out, "NVIDIA driver {driver} (CUDA {cuda}), {count} GPU(s)");
    for dev in 0..count {
        gpu_block(api, dev, &mut out);
    }
    out
}

fn gpu_block<A: NvmlApi>(api: &A, dev: u32, out: &mut String) {
    let id = match api.device_identity(dev) {
        Ok(id) => id,
        Err(e) => {
            let _ = writeln!(out, "\nGPU {dev}: {e}");
            return;
        }
    };
    let _ = writeln!(
        out,
        "\nGPU {dev}: {} {} minor {} pci {} ({:#010x}, subsystem {:#010x}) {} MiB, {}",
        id.name,
        id.uuid,
        id.minor,
        id.pci_bus_id,
        id.pci_device_id,
        id.pci_subsystem_id,
        id.memory_mib,
        architecture_name(id.architecture)
    );
    let found = find_model_for_gpu(id.pci_device_id, id.pci_subsystem_id, &id.name);
    let model = match &found {
        Ok(Some(m)) if m.mig => format!("{} ({})", m.name, m.source_file),
        Ok(Some(m)) => format!("{} ({}, no MIG)", m.name, m.source_file),
        Ok(None) => "none (built from what NVML reports)".into(),
        Err(e) => format!("invalid embedded data: {e}"),
    };
    let brand = match api.brand(dev) {
        Ok(b) => brand_name(b).map_or_else(|| format!("unnamed ({b})"), str::to_string),
        Err(e) => e.to_string(),
    };
    let _ = writeln!(out, "  brand: {brand}");
    let _ = writeln!(out, "  DAS model: {model}");
    match api.mig_mode(dev) {
        Ok(m) => {
            let _ = writeln!(
                out,
                "  MIG mode: current {}, pending {}",
                on(m.current),
                on(m.pending)
            );
            if let Ok(Some(model)) = &found {
                let _ = writeln!(
                    out,
                    "  MIG mode switching (with --mig-mode-switching): {}",
                    switch_verdict(api, dev, &id, model, m)
                );
            }
        }
        Err(e) if e.code == code::NOT_SUPPORTED => {
            let _ = writeln!(
                out,
                "  MIG: not supported (served whole with --whole-gpus, chart wholeGpus.enabled)"
            );
            return;
        }
        Err(e) => {
            let _ = writeln!(out, "  MIG mode: {e}");
        }
    }
    let _ = writeln!(
        out,
        "  GI profiles (enum -> ID name, MiB, SMs, max, placements start:size):"
    );
    for e in 0..GI_PROFILE_ENUM_COUNT {
        profile_line(api, dev, e, out);
    }
    instances_block(api, dev, out);
}

/// Whether the plugin would switch GPU `dev`'s MIG mode with `--mig-mode-switching`: the rule
/// the backend applies (architecture, model data, virtualization mode, a pending change).
fn switch_verdict<A: NvmlApi>(
    api: &A,
    dev: u32,
    id: &DeviceIdentity,
    model: &GpuModel,
    mode: MigModeState,
) -> String {
    let options = NvmlOptions {
        mig_mode_switching: true,
        ..NvmlOptions::default()
    };
    match with_pending(&switch_base(api, &options, dev, id, model), mode) {
        MigSwitch::Allowed => "allowed (no reset needed)".into(),
        MigSwitch::Refused(why) => format!("refused: {why}"),
    }
}

fn profile_line<A: NvmlApi>(api: &A, dev: u32, e: u32, out: &mut String) {
    let info = match api.gi_profile_info(dev, e) {
        Ok(info) => info,
        Err(err) if matches!(err.code, code::NOT_SUPPORTED | code::INVALID_ARGUMENT) => return,
        Err(err) => {
            let _ = writeln!(out, "    {}: {err}", GI_ENUM_NAMES[e as usize]);
            return;
        }
    };
    let placements = api
        .gi_possible_placements(dev, info.id)
        .map_or_else(|err| err.to_string(), |p| placements_text(&p));
    let _ = writeln!(
        out,
        "    {:<40} -> {:>2} {:<16} {:>6} {:>3} {:>2}  {placements}",
        GI_ENUM_NAMES[e as usize],
        info.id,
        info.short_name(),
        info.memory_mib,
        info.multiprocessors,
        info.instance_count,
    );
}

fn instances_block<A: NvmlApi>(api: &A, dev: u32, out: &mut String) {
    let profiles: Vec<GiProfileInfo> = (0..GI_PROFILE_ENUM_COUNT)
        .filter_map(|e| api.gi_profile_info(dev, e).ok())
        .collect();
    let mut lines = Vec::new();
    for p in &profiles {
        match api.gpu_instances(dev, p.id) {
            Ok(gis) => {
                lines.extend(gis.iter().map(|gi| {
                    format!("    GI {:>2} {} at {}", gi.id, p.short_name(), gi.placement)
                }))
            }
            Err(e) if e.code == code::NOT_SUPPORTED => return,
            Err(e) => lines.push(format!("    {}: {e}", p.short_name())),
        }
    }
    let _ = writeln!(
        out,
        "  GPU instances: {}",
        if lines.is_empty() { "none" } else { "" }
    );
    for l in lines {
        let _ = writeln!(out, "{l}");
    }
    if let Ok(migs) = mig_devices(api, dev) {
        for (gi, ci, uuid) in migs {
            let _ = writeln!(out, "    MIG device GI {gi} CI {ci}: {uuid}");
        }
    }
}

fn mig_devices<A: NvmlApi>(api: &A, dev: u32) -> NvmlResult<Vec<(u32, u32, String)>> {
    let max = api.max_mig_device_count(dev)?;
    Ok((0..max)
        .filter_map(|i| api.mig_device(dev, i).ok())
        .map(|m| (m.gi_id, m.ci_id, m.uuid))
        .collect())
}

fn placements_text(p: &[Placement]) -> String {
    let starts: Vec<String> = p.iter().map(|p| p.start.to_string()).collect();
    let size = p.first().map_or(0, |p| p.size);
    format!("{{{}}}:{size}", starts.join(","))
}

fn on(b: bool) -> &'static str {
    if b { "on" } else { "off" }
}
