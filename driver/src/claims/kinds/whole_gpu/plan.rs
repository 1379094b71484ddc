//! Names of whole GPUs (pure; docs/design.md §7, "Whole GPUs"). Whether a whole GPU can be
//! prepared is decided for it and for shares of whole GPUs alike
//! ([`crate::claims::kinds::whole_gpu_unavailable`]).

/// Whether `device` is a whole GPU's name, `gpu-<index>` (das_api::whole_gpu_device_name).
pub(crate) fn is_whole_gpu_name(device: &str) -> bool {
    device
        .strip_prefix("gpu-")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}
