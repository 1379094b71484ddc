//! DAS's words for what the publisher tells users (docs/design.md §4): the notes of the Node
//! events the ResourceSlice publisher posts when the API server drops (or keeps again) a gated
//! field, in terms of MIG and GPUs, posted through the plugin's [`EventSink`]. The event
//! reasons and what triggers each are the DRA layer's ([`Notice`]).

use std::sync::Arc;

use dra_plugin::resourceslice::gates::{
    CONSUMABLE_CAPACITY, DEVICE_BINDING_CONDITIONS, DEVICE_TAINTS, PARTITIONABLE_DEVICES,
};
use dra_plugin::resourceslice::{NodeEvents, Notice, Pool};

use crate::events::{EventKind, EventSink, EventTarget};

/// The publisher's Node events, as DAS posts them: DAS's notes ([`note`]), through the plugin's
/// event sink (reporting component `das-kubelet-plugin`).
pub(crate) struct NodeNotices {
    /// Where the events go.
    pub sink: Arc<dyn EventSink>,
}

#[tonic::async_trait]
impl NodeEvents for NodeNotices {
    fn note(&self, notice: &Notice, pool: &Pool) -> String {
        note(notice, &pool.node)
    }

    async fn post(&self, notice: &Notice, note: String) {
        let kind = if notice.is_warning() {
            EventKind::Warning
        } else {
            EventKind::Normal
        };
        self.sink
            .event(&EventTarget::Node, kind, notice.reason(), note)
            .await;
    }
}

/// The event's note for `node`: what happened, what the plugin did, what to do.
pub fn note(notice: &Notice, node: &str) -> String {
    match notice {
        Notice::CountersDropped { retry_in, .. } => format!(
            "kube-apiserver drops the shared counters (sharedCounters, consumesCounters) of \
             node {node}'s mig.das.com ResourceSlices: the feature gate \
             {PARTITIONABLE_DEVICES} is off there. Without the counters the scheduler would \
             hand out overlapping MIG placements, so the node's MIG devices are withdrawn \
             (its pool is published empty). Start kube-apiserver and kube-scheduler with \
             --feature-gates={PARTITIONABLE_DEVICES}=true (Kubernetes 1.34 and 1.35); the \
             plugin checks again in {}s and republishes the devices by itself.",
            retry_in.as_secs()
        ),
        Notice::CountersKept => format!(
            "kube-apiserver keeps the shared counters of node {node}'s mig.das.com \
             ResourceSlices ({PARTITIONABLE_DEVICES} is on): the node's MIG devices are \
             published again. kube-scheduler must run with the gate on too."
        ),
        Notice::TaintsDropped => format!(
            "kube-apiserver dropped the device taints of node {node}'s unhealthy GPUs: the \
             feature gate {DEVICE_TAINTS} is off there. Their devices stay offered untainted, \
             so new pods may be placed on a failed GPU (the GpuUnhealthy events, the \
             das_kubelet_plugin_gpu_healthy metric and the kubelet's resource health still \
             report it). Turn --feature-gates={DEVICE_TAINTS}=true on for kube-apiserver and \
             kube-scheduler (and kube-controller-manager for NoExecute eviction)."
        ),
        Notice::TaintsKept => format!(
            "kube-apiserver keeps the device taints of node {node}'s unhealthy GPUs again \
             ({DEVICE_TAINTS} is on)."
        ),
        Notice::SharesDropped => format!(
            "kube-apiserver dropped allowMultipleAllocations or the capacity request \
             policies of node {node}'s shareable mig.das.com devices (type mig-shared): the \
             feature gate {CONSUMABLE_CAPACITY} is off there. Stored without them a \
             shareable device would be given whole to one claim, so the node's shareable \
             devices are withdrawn; its exclusive devices stay published. Turn \
             --feature-gates={CONSUMABLE_CAPACITY}=true on for kube-apiserver and \
             kube-scheduler (shared slices need Kubernetes 1.36.2 or newer), then restart \
             the node plugin to publish them again."
        ),
        Notice::BindingConditionsDropped => format!(
            "kube-apiserver dropped the binding conditions of node {node}'s mig.das.com \
             devices (carve before bind): the feature gate {DEVICE_BINDING_CONDITIONS} is \
             off there. The devices are published without them, so slices are carved at \
             prepare as without --carve-before-bind. Turn \
             --feature-gates={DEVICE_BINDING_CONDITIONS}=true on for kube-apiserver and \
             kube-scheduler, then restart the node plugin."
        ),
    }
}

#[cfg(test)]
mod tests;
