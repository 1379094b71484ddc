//! `das-runtime`: the plumbing every DAS binary shares, written once so the node plugin, the
//! controller and the webhook behave the same.
//!
//! - [`logging`]: the `--log-format` / `--log-level` flags and the `tracing` set-up (stderr;
//!   colour only on a terminal; a bad filter is refused with a clear error).
//! - [`client`]: the `--kubeconfig` flag and kube clients with connect, read and write
//!   timeouts (one for calls, one for watches).
//! - [`probes`]: the `/metrics`, `/healthz` and `/readyz` HTTP server.
//! - [`metrics_auth`]: the `--metrics-auth` flag: `/metrics` open, or only to callers the API
//!   server authenticates (TokenReview) and authorizes (SubjectAccessReview).
//! - [`errors`]: an error with every cause in its chain, each said once ([`errors::chain`]).
//! - [`fs`]: atomic file writes (temp file, rename).
//! - [`hash`]: FNV-1a, stable across Rust releases, for names and emulated UUIDs.

// Product functions stay under 80 code lines (clippy.toml); tests may be longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod client;
pub mod errors;
pub mod fs;
pub mod hash;
pub mod logging;
pub mod metrics_auth;
pub mod probes;
pub mod process;
