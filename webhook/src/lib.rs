//! The DAS compatibility webhook (`das-webhook`).
//!
//! Pods asking for `nvidia.com/mig-<profile>: N` get pod-level ResourceClaims instead,
//! ResourceClaims and ResourceClaimTemplates whose configs for `mig.das.com` do not decode are
//! denied ([`device_configs`]), and ResourceClaims for a shared class get the selector that
//! keeps shared slices within their namespace ([`shared_claims`]); see docs/design.md §8. [`translate`] is the pure translation; [`server`] the HTTPS admission
//! server, [`profiles`] the cache of offered profiles, [`templates`] the
//! watched cache of created templates, [`metrics`] its Prometheus metrics,
//! [`tls`] the reloading certificate resolver, [`start`] the start-up phases (TLS → bound →
//! serving, each made only by the previous one) and [`error`] the one error type (with the
//! metric label of each kind of failure).

// Product functions stay under 80 code lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod device_configs;
pub mod error;
pub mod metrics;
pub mod profiles;
pub mod server;
pub mod shared_claims;
pub mod start;
pub mod templates;
pub mod tls;
pub mod translate;

pub use error::{Error, Result};
