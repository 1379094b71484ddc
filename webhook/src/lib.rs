//! The DAS compatibility webhook (`das-webhook`).
//!
//! Pods asking for `nvidia.com/mig-<profile>: N` get pod-level ResourceClaims instead; see
//! docs/design.md §8. [`translate`] is the pure translation; [`server`] the HTTPS admission
//! server, [`profiles`] the cache of offered profiles, [`templates`] the
//! watched cache of created templates, [`metrics`] its Prometheus metrics and
//! [`tls`] the reloading certificate resolver.

pub mod metrics;
pub mod profiles;
pub mod server;
pub mod templates;
pub mod tls;
pub mod translate;
