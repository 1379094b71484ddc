//! The v1beta1 messages as v1 messages and back. They differ only in `Device.share_id` (v1,
//! docs/reference/dra.md, "Kubelet plugin protocol"), which v1beta1 cannot carry: it is dropped
//! on the way back; requests lose nothing. Functions rather than `From` impls: both types are
//! das-proto's, so the orphan rule keeps `From` there.

use das_proto::dra::{v1, v1beta1};

/// The kubelet's claims, as v1 names them.
fn claims(claims: Vec<v1beta1::Claim>) -> Vec<v1::Claim> {
    claims
        .into_iter()
        .map(|c| v1::Claim {
            namespace: c.namespace,
            uid: c.uid,
            name: c.name,
        })
        .collect()
}

/// A v1beta1 NodePrepareResources request as v1.
pub(super) fn prepare_request(
    req: v1beta1::NodePrepareResourcesRequest,
) -> v1::NodePrepareResourcesRequest {
    v1::NodePrepareResourcesRequest {
        claims: claims(req.claims),
    }
}

/// A v1beta1 NodeUnprepareResources request as v1.
pub(super) fn unprepare_request(
    req: v1beta1::NodeUnprepareResourcesRequest,
) -> v1::NodeUnprepareResourcesRequest {
    v1::NodeUnprepareResourcesRequest {
        claims: claims(req.claims),
    }
}

/// The v1 answer to a NodePrepareResources call as v1beta1 (`share_id` dropped).
pub(super) fn prepare_response(
    resp: v1::NodePrepareResourcesResponse,
) -> v1beta1::NodePrepareResourcesResponse {
    let claims = resp
        .claims
        .into_iter()
        .map(|(uid, c)| {
            let devices = c
                .devices
                .into_iter()
                .map(|d| v1beta1::Device {
                    request_names: d.request_names,
                    pool_name: d.pool_name,
                    device_name: d.device_name,
                    cdi_device_ids: d.cdi_device_ids,
                })
                .collect();
            let entry = v1beta1::NodePrepareResourceResponse {
                devices,
                error: c.error,
            };
            (uid, entry)
        })
        .collect();
    v1beta1::NodePrepareResourcesResponse { claims }
}

/// The v1 answer to a NodeUnprepareResources call as v1beta1.
pub(super) fn unprepare_response(
    resp: v1::NodeUnprepareResourcesResponse,
) -> v1beta1::NodeUnprepareResourcesResponse {
    let claims = resp
        .claims
        .into_iter()
        .map(|(uid, c)| {
            (
                uid,
                v1beta1::NodeUnprepareResourceResponse { error: c.error },
            )
        })
        .collect();
    v1beta1::NodeUnprepareResourcesResponse { claims }
}
