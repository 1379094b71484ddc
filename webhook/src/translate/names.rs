//! Names the translation gives: pod claim entries, kept valid DNS labels and unique in the pod.

use std::collections::BTreeSet;

use das_api::profile_dns_label;

/// Longest DNS label (RFC 1123).
const DNS_LABEL_MAX: usize = 63;

/// A container name as a DNS label fragment: lower case, every character outside `[a-z0-9]` →
/// `-` (profiles use [`profile_dns_label`], which keeps `+me` and `-me` apart).
pub(super) fn dns_label(s: &str) -> String {
    s.chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9') => c,
            _ => '-',
        })
        .collect()
}

/// Pod claim name for `container` and `profile`: `mig-<container>-<profile>`, kept a valid DNS
/// label (≤ 63, alphanumeric ends) by truncating and appending a hash of the full name.
pub(super) fn claim_name(container: &str, profile: &str) -> String {
    let full = format!(
        "mig-{}-{}",
        dns_label(container),
        profile_dns_label(profile)
    );
    fit_label(&full, &full)
}

/// `base` if it is free in `used`, else `base` with a numeric suffix that is.
pub(super) fn unique_name(base: &str, used: &BTreeSet<String>) -> String {
    if !used.contains(base) {
        return base.to_string();
    }
    (2u32..)
        .map(|i| fit_label(&format!("{base}-{i}"), &format!("{base}-{i}")))
        .find(|n| !used.contains(n))
        .expect("an unbounded range finds a free name")
}

/// `name` cut to a DNS label; when cut, an 8-hex-digit FNV-1a hash of `seed` keeps it unique.
pub(super) fn fit_label(name: &str, seed: &str) -> String {
    let trimmed = name.trim_matches('-');
    if trimmed.len() <= DNS_LABEL_MAX {
        return trimmed.to_string();
    }
    let hash = format!("{:08x}", das_runtime::hash::fnv1a32(seed.as_bytes()));
    let head = trimmed[..DNS_LABEL_MAX - hash.len() - 1].trim_end_matches('-');
    format!("{head}-{hash}")
}
