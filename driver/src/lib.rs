//! The DAS node plugin (`das-kubelet-plugin`).
//!
//! Pure logic is kept apart from I/O so it can be unit-tested:
//! - [`gpu`]: GPU models and MIG profile tables (data files), the backend trait, the emulated
//!   backend.
//! - [`slices`]: building ResourceSlices from an inventory (pure).
//! - [`placement`]: the order devices are published in, which is the placement policy (pure).
//! - [`cdi`]: CDI spec types and atomic spec files.
//! - [`checkpoint`]: the versioned, atomically written record of prepared claims.
//!
//! See `shared/DESIGN.md` §3, §5 and §7 for the contract.

pub mod cdi;
pub mod checkpoint;
pub mod gpu;
pub mod handover;
pub mod kubelet;
pub mod metrics;
pub mod placement;
pub mod prepare;
pub mod publish;
pub mod reconcile;
pub mod slices;
