//! Which XID errors make a GPU unusable for new work.
//!
//! Policy, as NVIDIA's own Kubernetes device plugin applies it (NVIDIA/k8s-device-plugin,
//! `internal/rm/health.go`): every XID is fatal except the **application errors**, which the
//! driver raises for one faulty process while the GPU stays healthy. The names below follow
//! NVIDIA's Xid catalogue (<https://docs.nvidia.com/deploy/xid-errors/>, "Analyzing Xid Errors
//! with the Xid Catalog": mnemonic, description and resolution bucket per XID; the application
//! errors are those whose immediate action is restarting the application). Operators add XIDs
//! of their own to ignore with `--health-ignored-xids`.

use std::collections::BTreeSet;

/// XIDs a faulty application causes on a healthy GPU: 13 graphics engine exception, 31 GPU
/// memory page fault, 43 GPU stopped processing (the channel was reset), 45 preemptive cleanup
/// after earlier errors, 68 video processor (NVDEC) exception.
pub(crate) const APPLICATION_XIDS: [u32; 5] = [13, 31, 43, 45, 68];

/// XIDs about the whole GPU even when the event names a GPU instance: 48 double-bit ECC error
/// and 79 GPU has fallen off the bus (conditions of the GPU itself, which DAS's uncorrectable-ECC
/// event and lost-GPU check treat GPU-wide too), and 95 uncontained ECC error (an uncontained
/// error may affect every workload on the GPU, unlike a contained one, XID 94, which stays with
/// the application that hit it; docs/reference/mig.md, "Health events").
pub(crate) const GPU_WIDE_XIDS: [u32; 3] = [48, 79, 95];

/// Whether XID `xid` concerns the whole GPU whatever GPU instance the event names.
pub(crate) fn is_gpu_wide(xid: u32) -> bool {
    GPU_WIDE_XIDS.contains(&xid)
}

/// Whether XID `xid` makes the GPU unusable, unless the operator listed it in `ignored`.
pub(crate) fn is_fatal(xid: u32, ignored: &BTreeSet<u32>) -> bool {
    !APPLICATION_XIDS.contains(&xid) && !ignored.contains(&xid)
}

/// What XID `xid` means, for events and logs (the catalogue's description of the XIDs seen most
/// on data-center GPUs; others read "see NVIDIA's Xid catalogue").
pub fn describe(xid: u32) -> &'static str {
    match xid {
        13 => "graphics engine exception",
        31 => "GPU memory page fault",
        43 => "GPU stopped processing",
        45 => "preemptive cleanup, due to previous errors",
        48 => "double-bit ECC error",
        63 => "ECC page retirement or row remapping event",
        64 => "ECC page retirement or row remapping failure",
        68 => "video processor exception",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        119 => "GSP RPC timeout",
        120 => "GSP error",
        999 => "unknown XID (NVML did not report the number)",
        _ => "see NVIDIA's Xid catalogue",
    }
}

/// Parses `--health-ignored-xids`: comma-separated XID numbers, e.g. `109,119`.
///
/// # Errors
/// An entry that is not a non-negative integer, naming it.
pub fn parse_ignored(list: &str) -> Result<BTreeSet<u32>, String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u32>().map_err(|_| {
                format!(
                    "{s:?} is not an XID number; expected comma-separated numbers such as 109,119"
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
