//! The profiles the cluster offers: one DeviceClass `<profile>.mig.das.com` each (DESIGN §3),
//! listed from the API server and cached for a short time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::Client;
use kube::api::{Api, ListParams};
use tokio::sync::Mutex;

use crate::translate::offered_profile;

/// Cached list of offered profiles; refreshed when older than the TTL, and at most once per
/// `min_refresh` when a pod asks for a profile the cache does not know (a class just created).
pub struct Profiles {
    api: Api<DeviceClass>,
    ttl: Duration,
    min_refresh: Duration,
    cache: Mutex<Option<(Instant, Arc<Vec<String>>)>>,
}

impl Profiles {
    pub fn new(client: Client, ttl: Duration) -> Self {
        Self {
            api: Api::all(client),
            ttl,
            min_refresh: Duration::from_secs(1).min(ttl),
            cache: Mutex::new(None),
        }
    }

    /// Offered profiles, such that every one of `wanted` is known if the cluster offers it.
    pub async fn get(&self, wanted: &[String]) -> Result<Arc<Vec<String>>> {
        let mut cache = self.cache.lock().await;
        if let Some((at, list)) = cache.as_ref() {
            let fresh = at.elapsed() < self.ttl;
            let covers = wanted.iter().all(|w| list.contains(&w.replace('+', "-")));
            if fresh && (covers || at.elapsed() < self.min_refresh) {
                return Ok(list.clone());
            }
        }
        let list = Arc::new(self.list().await?);
        *cache = Some((Instant::now(), list.clone()));
        Ok(list)
    }

    /// Can the API server be reached and the classes be listed (readiness)?
    pub async fn check(&self) -> Result<()> {
        self.get(&[]).await.map(|_| ())
    }

    async fn list(&self) -> Result<Vec<String>> {
        let classes = self.api.list(&ListParams::default()).await?;
        let mut v: Vec<String> = classes
            .items
            .iter()
            .filter_map(|c| offered_profile(c.metadata.name.as_deref()?))
            .collect();
        v.sort();
        Ok(v)
    }
}
