//! An in-memory API server's ResourceClaims for a `Preparer` driven from outside the crate: the
//! MPS preparer tests (driver/tests/mps_preparer.rs) and the share_prepare benchmark include it
//! with `#[path]`. Claims are stored by name (one namespace); status writes and events are
//! dropped.

use std::collections::BTreeMap;
use std::sync::Mutex;

use das_driver::claims::checkpoint::RecordedDevice;
use das_driver::claims::{ApiError, ClaimApi, ClaimRef, EventKind, EventSink, EventTarget};
use k8s_openapi::api::resource::v1::ResourceClaim;

/// The API server's claims, in memory.
#[derive(Default)]
pub struct ClaimStore {
    claims: Mutex<BTreeMap<String, ResourceClaim>>,
}

impl ClaimStore {
    /// Stores (or replaces) claim `rc` under its name and returns its reference.
    pub fn put(&self, rc: ResourceClaim) -> ClaimRef {
        let claim = ClaimRef {
            namespace: rc.metadata.namespace.clone().unwrap_or_default(),
            name: rc.metadata.name.clone().unwrap_or_default(),
            uid: rc.metadata.uid.clone().unwrap_or_default(),
        };
        self.claims.lock().unwrap().insert(claim.name.clone(), rc);
        claim
    }
}

#[tonic::async_trait]
impl EventSink for ClaimStore {
    async fn event(&self, _about: &EventTarget, _kind: EventKind, _reason: &str, _note: String) {}
}

#[tonic::async_trait]
impl ClaimApi for ClaimStore {
    async fn get_claim(&self, _ns: &str, name: &str) -> Result<Option<ResourceClaim>, ApiError> {
        Ok(self.claims.lock().unwrap().get(name).cloned())
    }

    async fn list_claims(&self) -> Result<Vec<ResourceClaim>, ApiError> {
        Ok(self.claims.lock().unwrap().values().cloned().collect())
    }

    async fn write_status(&self, _c: &ClaimRef, _d: &[RecordedDevice]) -> Result<(), ApiError> {
        Ok(())
    }
}
