//! The ResourceClaimTemplates the webhook created, watched: a pod whose template already exists
//! costs no API call at admission; a deleted template is noticed and created again.
//!
//! Source: kube-runtime reflector (<https://docs.rs/kube/latest/kube/runtime/fn.reflector.html>).

use das_runtime::client::Clients;
use futures::StreamExt;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};

use crate::error::{Error, Result};
use crate::translate::{MANAGED_BY_LABEL, template_mismatch};

/// What [`Templates::ensure`] did with one template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    /// The watch cache has it: no API call.
    Cached,
    /// Created now.
    Created,
    /// The API server already had it (a race, or a template the cache does not watch).
    Existed,
}

/// Creates missing templates; knows existing ones from a watch on the webhook's label.
#[derive(Clone)]
pub struct Templates {
    client: Client,
    store: Store<ResourceClaimTemplate>,
}

impl Templates {
    /// Starts the watch on `clients.watches` (on the runtime of the caller) and returns the
    /// cache; templates are created with `clients.calls`.
    pub fn watch(clients: &Clients) -> Self {
        let api: Api<ResourceClaimTemplate> = Api::all(clients.watches.clone());
        let cfg = watcher::Config::default()
            .labels(&format!("{}={}", MANAGED_BY_LABEL.0, MANAGED_BY_LABEL.1));
        let (store, writer) = reflector::store();
        let drive = reflector::reflector(writer, watcher(api, cfg))
            .default_backoff()
            .touched_objects()
            .for_each(|r| async move {
                if let Err(e) = r {
                    tracing::warn!(error = %e, "ResourceClaimTemplate watch");
                }
            });
        tokio::spawn(drive);
        Self {
            client: clients.calls.clone(),
            store,
        }
    }

    /// Makes sure `template` exists in namespace `ns` as it should be. A template of that name
    /// that asks for something else (edited, or someone else's) is never used silently: the
    /// error says what it asks for and how to fix it (the admission is denied with it).
    pub async fn ensure(&self, ns: &str, template: &ResourceClaimTemplate) -> Result<Ensured> {
        let name = template.metadata.name.as_deref().unwrap_or_default();
        if let Some(cached) = self.store.get(&ObjectRef::new(name).within(ns)) {
            check(ns, &cached, template)?;
            return Ok(Ensured::Cached);
        }
        let api: Api<ResourceClaimTemplate> = Api::namespaced(self.client.clone(), ns);
        match api.create(&PostParams::default(), template).await {
            Ok(_) => Ok(Ensured::Created),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let existing = api.get(name).await.map_err(|source| Error::ReadTemplate {
                    namespace: ns.to_string(),
                    name: name.to_string(),
                    source,
                })?;
                check(ns, &existing, template)?;
                Ok(Ensured::Existed)
            }
            Err(source) => Err(Error::CreateTemplate {
                namespace: ns.to_string(),
                name: name.to_string(),
                source,
            }),
        }
    }
}

/// Fails when `existing` does not ask for what `desired` asks for.
fn check(
    ns: &str,
    existing: &ResourceClaimTemplate,
    desired: &ResourceClaimTemplate,
) -> Result<()> {
    let name = desired.metadata.name.as_deref().unwrap_or_default();
    match template_mismatch(existing, desired) {
        None => Ok(()),
        Some(why) => Err(Error::TemplateMismatch {
            namespace: ns.to_string(),
            name: name.to_string(),
            why,
        }),
    }
}
