//! The DAS compatibility webhook (`das-webhook`).
//!
//! Built by the webhook issue: pods asking for `nvidia.com/mig-<profile>: N` get pod-level
//! ResourceClaims instead; see `shared/DESIGN.md` §8.
