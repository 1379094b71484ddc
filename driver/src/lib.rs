//! The DAS node plugin (`das-kubelet-plugin`).
//!
//! Pure logic is kept apart from I/O so it can be unit-tested:
//! - [`cdi`]: CDI spec types and atomic spec files.
//! - [`checkpoint`]: the versioned, atomically written record of prepared claims.
//!
//! See `shared/DESIGN.md` §3, §5 and §7 for the contract.

pub mod cdi;
pub mod checkpoint;
