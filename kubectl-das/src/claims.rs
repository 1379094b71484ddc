//! `kubectl das claims`: the AllocationClaims (docs/design.md §6) as a table, with the GPU as its
//! index on the node rather than its UUID (the UUID is in `-o wide`).

use std::collections::HashMap;

use das_api::allocation::AllocationClaim;

use crate::inventory::Inventory;
use crate::table::{Cell, render};

/// The claims as a table: `NAMESPACE NAME NODE GPU PROFILE START STATE POD`, `-o wide` adding the
/// MIG UUID, GPU UUID and device. `all_namespaces` adds the namespace column (as kubectl does).
/// Sorted by namespace and name.
pub fn render_text(
    claims: &[AllocationClaim],
    inv: &Inventory,
    all_namespaces: bool,
    wide: bool,
) -> String {
    let mut sorted: Vec<&AllocationClaim> = claims.iter().collect();
    sorted.sort_by_key(|c| (c.metadata.namespace.clone(), c.metadata.name.clone()));
    let mut header = vec!["NAME", "NODE", "GPU", "PROFILE", "START", "STATE", "POD"];
    if all_namespaces {
        header.insert(0, "NAMESPACE");
    }
    if wide {
        header.extend(["MIG UUID", "GPU UUID", "DEVICE"]);
    }
    let mut rows: Vec<Vec<Cell>> = vec![header.into_iter().map(Cell::from).collect()];
    // (pool, device) → GPU index: one look-up per claim, not a walk of every published device.
    let mut gpu_of: HashMap<(&str, &str), u32> = HashMap::with_capacity(inv.devices.len());
    for d in &inv.devices {
        gpu_of
            .entry((d.pool.as_str(), d.name.as_str()))
            .or_insert(d.gpu);
    }
    for c in sorted {
        let s = &c.spec;
        // The GPU's index from the published device; the UUID's prefix where it is not
        // published any more (a node that went away).
        let gpu = gpu_of
            .get(&(s.pool.as_str(), s.device.as_str()))
            .map(|g| format!("gpu-{g}"))
            .unwrap_or_else(|| "-".into());
        let state = c.status.as_ref().map(|st| st.state.as_str()).unwrap_or("-");
        let mut row: Vec<Cell> = vec![
            c.metadata.name.clone().unwrap_or_default().into(),
            s.nodename.clone().into(),
            gpu.into(),
            s.profile.clone().into(),
            s.mig_placement.start.to_string().into(),
            state.into(),
            s.pod_ref
                .as_ref()
                .map(|p| p.name.clone())
                .unwrap_or_else(|| "-".into())
                .into(),
        ];
        if all_namespaces {
            row.insert(0, c.metadata.namespace.clone().unwrap_or_default().into());
        }
        if wide {
            let uuid = c.status.as_ref().and_then(|st| st.mig_uuid.clone());
            row.push(uuid.unwrap_or_else(|| "-".into()).into());
            row.push(s.gpu_uuid.clone().into());
            row.push(s.device.clone().into());
        }
        rows.push(row);
    }
    if rows.len() == 1 {
        return String::new();
    }
    render(&rows, false)
}
