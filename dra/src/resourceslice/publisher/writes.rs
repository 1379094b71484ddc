//! One publish's I/O: list the node's slices, plan against them ([`crate::resourceslice::plan`]),
//! and carry the plan out (deletes, updates, creates), checking what the server stored.

use k8s_openapi::api::resource::v1::{ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Preconditions;
use tracing::{debug, info, warn};

use super::{PublishError, PublishStats, Publisher, with_generation};
use crate::resourceslice::gates::Written;
use crate::resourceslice::plan::{self, Adopted, Plan, PlanInput};

impl Publisher {
    /// Makes the server's slices equal to `desired` (completed specs).
    pub(super) async fn publish_once(
        &mut self,
        desired: Vec<ResourceSliceSpec>,
    ) -> Result<(PublishStats, Written), PublishError> {
        let existing = self.list().await?;
        let cached = self.looked_up_uid.is_some();
        let mut uid = self.node_uid(false).await?;
        let mut plan = self.plan(&uid, &desired, &existing);
        // Creating with a stale UID would let the garbage collector delete the new slices
        // (the Node was re-registered): check the cached UID before creating.
        if !plan.create.is_empty() && self.pool.node_uid.is_none() && cached {
            let fresh = self.node_uid(true).await?;
            if fresh != uid {
                info!(old = %uid, new = %fresh, "Node UID changed; re-planning");
                uid = fresh;
                plan = self.plan(&uid, &desired, &existing);
            }
        }
        self.known = existing
            .iter()
            .filter_map(|s| {
                Some((
                    s.metadata.name.clone()?,
                    s.metadata.resource_version.clone()?,
                ))
            })
            .collect();
        self.apply(&uid, &desired, plan).await
    }

    fn plan(&self, uid: &str, desired: &[ResourceSliceSpec], existing: &[ResourceSlice]) -> Plan {
        plan::plan(
            PlanInput {
                driver: &self.pool.driver,
                node: &self.pool.node,
                node_uid: uid,
                desired,
                baseline: &self.baseline,
            },
            existing,
        )
    }

    pub(super) async fn list(&self) -> Result<Vec<ResourceSlice>, PublishError> {
        let selector = self.field_selector();
        match self.api.list(&selector).await {
            Ok(items) => Ok(items),
            Err(source) => Err(PublishError::List { selector, source }),
        }
    }

    async fn node_uid(&mut self, refresh: bool) -> Result<String, PublishError> {
        if let Some(uid) = &self.pool.node_uid {
            return Ok(uid.clone());
        }
        if let (Some(uid), false) = (&self.looked_up_uid, refresh) {
            return Ok(uid.clone());
        }
        let node =
            self.api
                .node(&self.pool.node)
                .await
                .map_err(|source| PublishError::NodeLookup {
                    node: self.pool.node.clone(),
                    source,
                })?;
        let uid = node
            .metadata
            .uid
            .ok_or_else(|| PublishError::NodeWithoutUid {
                node: self.pool.node.clone(),
            })?;
        self.looked_up_uid = Some(uid.clone());
        Ok(uid)
    }

    async fn apply(
        &mut self,
        uid: &str,
        desired: &[ResourceSliceSpec],
        plan: Plan,
    ) -> Result<(PublishStats, Written), PublishError> {
        let mut written = Written::default();
        let mut stats = PublishStats {
            unchanged: plan.unchanged.len(),
            generation: plan.generation,
            slice_count: desired.len(),
            ..Default::default()
        };
        if plan.writes() > 0 {
            debug!(
                generation = plan.generation,
                bumped = plan.bumped,
                delete = plan.delete.len(),
                update = plan.update.len(),
                create = plan.create.len(),
                "publishing ResourceSlices"
            );
        }
        for d in &plan.delete {
            self.delete(d).await?;
            self.known.remove(&d.name);
            stats.deleted += 1;
        }
        let width = plan::index_width(desired.len());
        for (index, existing) in plan.update {
            let mut slice = existing;
            slice.spec = with_generation(&desired[index], plan.generation);
            slice.metadata.owner_references = Some(vec![plan::node_owner(&self.pool.node, uid)]);
            let stored = self.replace(index, &slice).await?;
            stats.dropped_fields += usize::from(self.check_stored(index, &slice.spec, &stored));
            written.add(&slice.spec, &stored.spec);
            stats.updated += 1;
        }
        for index in plan.create {
            let slice = ResourceSlice {
                metadata: ObjectMeta {
                    name: Some(plan::slice_name(
                        &self.pool.driver,
                        &self.pool.node,
                        index,
                        width,
                    )),
                    owner_references: Some(vec![plan::node_owner(&self.pool.node, uid)]),
                    ..Default::default()
                },
                spec: with_generation(&desired[index], plan.generation),
            };
            let stored = self.create(index, &slice).await?;
            stats.dropped_fields += usize::from(self.check_stored(index, &slice.spec, &stored));
            written.add(&slice.spec, &stored.spec);
            stats.created += 1;
        }
        self.baseline.retain(|i, _| *i < desired.len());
        Ok((stats, written))
    }

    pub(super) async fn delete(&self, d: &plan::Deletion) -> Result<(), PublishError> {
        let preconditions = Preconditions {
            uid: d.uid.clone(),
            resource_version: d.resource_version.clone(),
        };
        match self.api.delete(&d.name, preconditions).await {
            Ok(_) => {
                info!(slice = %d.name, reason = %d.reason, "deleted obsolete ResourceSlice");
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
            Err(source) => Err(PublishError::Delete {
                slice: d.name.clone(),
                reason: d.reason.to_string(),
                source,
            }),
        }
    }

    async fn replace(
        &mut self,
        index: usize,
        slice: &ResourceSlice,
    ) -> Result<ResourceSlice, PublishError> {
        let name = slice.metadata.name.clone().unwrap_or_default();
        let stored = self
            .api
            .replace(slice)
            .await
            .map_err(|source| PublishError::Update {
                slice: name.clone(),
                index,
                pool: self.pool.node.clone(),
                source,
            })?;
        self.remember(&stored);
        Ok(stored)
    }

    async fn create(
        &mut self,
        index: usize,
        slice: &ResourceSlice,
    ) -> Result<ResourceSlice, PublishError> {
        let stored =
            self.api
                .create(slice, false)
                .await
                .map_err(|source| PublishError::Create {
                    slice: slice.metadata.name.clone().unwrap_or_default(),
                    index,
                    pool: self.pool.node.clone(),
                    source,
                })?;
        self.remember(&stored);
        Ok(stored)
    }

    fn remember(&mut self, stored: &ResourceSlice) {
        if let (Some(n), Some(rv)) = (&stored.metadata.name, &stored.metadata.resource_version) {
            self.known.insert(n.clone(), rv.clone());
        }
    }

    /// Compares what the server stored with what was sent; adopts and logs a difference.
    /// Returns whether there was one.
    fn check_stored(
        &mut self,
        index: usize,
        sent: &ResourceSliceSpec,
        stored: &ResourceSlice,
    ) -> bool {
        let sent_key = plan::spec_key(sent);
        let stored_key = plan::spec_key(&stored.spec);
        if sent_key == stored_key {
            self.baseline.remove(&index);
            return false;
        }
        let paths = plan::diff_paths(&sent_key, &stored_key, 8);
        let gates = plan::guess_disabled_features(&paths);
        let summary = format!("#{index}: {}", paths.join(", "));
        let slice = stored.metadata.name.as_deref().unwrap_or_default();
        if self.warned.insert(summary) {
            warn!(
                slice, index, fields = ?paths, likely_disabled_gates = ?gates,
                "the API server stored this ResourceSlice differently from what was sent \
                 (dropped fields or canonicalized values); adopting the stored version"
            );
        } else {
            debug!(slice, index, fields = ?paths, "stored ResourceSlice differs again; adopting");
        }
        self.baseline.insert(
            index,
            Adopted {
                sent: sent_key,
                stored: stored_key,
            },
        );
        true
    }
}
