//! The `tracing` span of one claim's work, so that every line logged for a claim carries its
//! `claim.uid`, `claim.namespace` and `claim.name` (docs/operations.md, "Logs"; the same field
//! names as the controller's `reconcile` span).
//!
//! A claim's span is opened once, where its work starts: the kubelet's prepare or unprepare of
//! the claim, a carve-before-bind task, the reaper's pass over it, the orphan rule's check of it,
//! start-up's settling or rebuild of its record, its status writer, its MPS daemon brought back.
//! What runs inside (a release, the acquires on one GPU, one device's acquire) opens child spans
//! without the claim's fields: they inherit them, and text logs print a span's fields once.
//!
//! Claim spans are at level `ERROR`, so that an `EnvFilter` that lets any line through keeps
//! their fields on it: a span below the filter's level would be disabled, and a `warn` line
//! inside it would lose its claim under `--log-level=warn`.

/// The span named `$name` (a literal) of claim `$claim` (a `&ClaimRef`), with fields
/// `claim.uid`, `claim.namespace` and `claim.name`, at level `ERROR` (see the module docs).
/// A root: work started from inside another claim's span (a prepare starts its claim's status
/// writer) does not carry that span's fields twice, nor keep it open. Attach it with
/// [`tracing::Instrument::instrument`].
macro_rules! claim_span {
    ($name:literal, $claim:expr) => {{
        let claim: &$crate::claims::handler::ClaimRef = $claim;
        tracing::error_span!(
            parent: None,
            $name,
            claim.uid = %claim.uid,
            claim.namespace = %claim.namespace,
            claim.name = %claim.name
        )
    }};
}

pub(crate) use claim_span;

#[cfg(test)]
mod tests;
