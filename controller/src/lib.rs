//! The DAS cluster controller (`das-controller`).
//!
//! Built by the controller issue: it mirrors allocations into AllocationClaims
//! (`staged` → `created` → `inUse`); see `shared/DESIGN.md` §6.
