//! Unit tests of [`super`] (`kubeletplugin.rs`): socket paths, and the v1beta1 face answering as
//! v1.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use das_proto::dra::v1::dra_plugin_server::DraPlugin as _;
use das_proto::dra::v1beta1::dra_plugin_server::DraPlugin as _;
use das_proto::dra::{v1, v1beta1};
use tonic::Request;

use super::{MAX_SOCKET_PATH, SocketPathError, SocketPaths, V1, V1beta1, v1beta1_edge};
use crate::driver::{ClaimRef, Driver, PreparedDevice};

#[test]
fn socket_names_follow_the_kubelet_plugin_conventions() {
    let p = SocketPaths::new(
        Path::new("/var/lib/kubelet/plugins_registry"),
        Path::new("/var/lib/kubelet/plugins"),
        "dev.example.com",
        None,
    )
    .unwrap();
    assert_eq!(
        p.registration,
        Path::new("/var/lib/kubelet/plugins_registry/dev.example.com-reg.sock")
    );
    assert_eq!(
        p.dra,
        Path::new("/var/lib/kubelet/plugins/dev.example.com/dra.sock")
    );

    let uid = "0a1b2c3d-0000-1111-2222-333344445555";
    let p = SocketPaths::new(
        Path::new("/var/lib/kubelet/plugins_registry"),
        Path::new("/var/lib/kubelet/plugins"),
        "dev.example.com",
        Some(uid),
    )
    .unwrap();
    assert_eq!(
        p.registration,
        Path::new(&format!(
            "/var/lib/kubelet/plugins_registry/dev.example.com-{uid}-reg.sock"
        ))
    );
    assert_eq!(
        p.dra,
        Path::new(&format!(
            "/var/lib/kubelet/plugins/dev.example.com/dra-{uid}.sock"
        ))
    );
}

#[test]
fn long_registry_dirs_get_a_hashed_rolling_update_name_or_a_clear_error() {
    let reg = PathBuf::from(format!("/{}/plugins_registry", "k".repeat(40)));
    let uid = "0a1b2c3d-0000-1111-2222-333344445555";
    let p = SocketPaths::new(
        &reg,
        Path::new("/var/lib/kubelet/plugins"),
        "dev.example.com",
        Some(uid),
    )
    .unwrap();
    assert!(p.registration.as_os_str().len() <= MAX_SOCKET_PATH);
    assert!(!p.registration.to_string_lossy().contains(uid));
    let err = SocketPaths::new(
        Path::new(&format!("/{}", "x".repeat(120))),
        Path::new("/p"),
        "dev.example.com",
        None,
    )
    .unwrap_err();
    assert!(err.to_string().contains("more than the 107"), "{err}");
    assert!(SocketPaths::new(Path::new("rel"), Path::new("/p"), "dev.example.com", None).is_err());
}

#[test]
fn explicit_socket_paths_are_checked_like_conventional_ones() {
    let p = SocketPaths::explicit("/run/reg.sock".into(), "/run/dev/dra.sock".into()).unwrap();
    assert_eq!(p.registration, Path::new("/run/reg.sock"));
    assert_eq!(p.dra, Path::new("/run/dev/dra.sock"));
    let err = SocketPaths::explicit("/run/reg.sock".into(), "dra.sock".into()).unwrap_err();
    assert!(matches!(err, SocketPathError::Relative { .. }), "{err}");
    assert!(err.to_string().contains("must be absolute"), "{err}");
    let long = PathBuf::from(format!("/{}.sock", "s".repeat(MAX_SOCKET_PATH)));
    let err = SocketPaths::explicit(long.clone(), "/run/dra.sock".into()).unwrap_err();
    assert!(
        matches!(err, SocketPathError::TooLong { len, .. } if len == long.as_os_str().len()),
        "{err}"
    );
}

/// The test driver's failures.
#[derive(Debug, thiserror::Error)]
enum TestError {
    #[error("the claim is not allocated")]
    NotAllocated,
    #[error("the claim is gone")]
    ClaimGone,
}

/// A driver that prepares claim `ok` with one device, fails claim `bad`, and unprepares `ok`
/// while failing `bad`, whatever version asked.
struct OneGoodOneBad;

#[tonic::async_trait]
impl Driver for OneGoodOneBad {
    type Error = TestError;

    async fn prepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> HashMap<String, Result<Vec<PreparedDevice>, TestError>> {
        claims
            .into_iter()
            .map(|c| {
                let r = if c.uid == "ok" {
                    Ok(vec![PreparedDevice {
                        requests: vec!["dev".into()],
                        pool: "node-a".into(),
                        device: "dev-0".into(),
                        cdi_device_ids: vec!["example.com/dev=dev-0".into()],
                        share_id: None,
                    }])
                } else {
                    Err(TestError::NotAllocated)
                };
                (c.uid, r)
            })
            .collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> HashMap<String, Result<(), TestError>> {
        claims
            .into_iter()
            .map(|c| {
                let r = if c.uid == "ok" {
                    Ok(())
                } else {
                    Err(TestError::ClaimGone)
                };
                (c.uid, r)
            })
            .collect()
    }
}

fn v1_claims() -> Vec<v1::Claim> {
    ["ok", "bad"]
        .map(|uid| v1::Claim {
            namespace: "ns".into(),
            uid: uid.into(),
            name: format!("claim-{uid}"),
        })
        .to_vec()
}

fn v1beta1_claims() -> Vec<v1beta1::Claim> {
    ["ok", "bad"]
        .map(|uid| v1beta1::Claim {
            namespace: "ns".into(),
            uid: uid.into(),
            name: format!("claim-{uid}"),
        })
        .to_vec()
}

/// A v1beta1 prepare and unprepare round trip gives what v1 gives, devices and per-claim error
/// texts included: the v1beta1 face only converts messages.
#[tokio::test]
async fn v1beta1_answers_exactly_as_v1() {
    let handler = Arc::new(OneGoodOneBad);
    let v1_service = V1(handler.clone());
    let v1beta1_service = V1beta1(V1(handler));

    let by_v1 = v1_service
        .node_prepare_resources(Request::new(v1::NodePrepareResourcesRequest {
            claims: v1_claims(),
        }))
        .await
        .unwrap()
        .into_inner();
    let by_v1beta1 = v1beta1_service
        .node_prepare_resources(Request::new(v1beta1::NodePrepareResourcesRequest {
            claims: v1beta1_claims(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_v1beta1, v1beta1_edge::prepare_response(by_v1.clone()));
    assert_eq!(by_v1beta1.claims.len(), 2, "one entry per claim");
    let ok = &by_v1beta1.claims["ok"];
    assert!(ok.error.is_empty(), "{}", ok.error);
    assert_eq!(ok.devices.len(), 1);
    assert_eq!(ok.devices[0].device_name, "dev-0");
    assert_eq!(ok.devices[0].cdi_device_ids, ["example.com/dev=dev-0"]);
    let bad = &by_v1beta1.claims["bad"];
    assert!(bad.devices.is_empty());
    assert_eq!(bad.error, by_v1.claims["bad"].error);
    assert_eq!(
        bad.error,
        "claim ns/claim-bad (uid bad): the claim is not allocated"
    );

    let by_v1 = v1_service
        .node_unprepare_resources(Request::new(v1::NodeUnprepareResourcesRequest {
            claims: v1_claims(),
        }))
        .await
        .unwrap()
        .into_inner();
    let by_v1beta1 = v1beta1_service
        .node_unprepare_resources(Request::new(v1beta1::NodeUnprepareResourcesRequest {
            claims: v1beta1_claims(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_v1beta1, v1beta1_edge::unprepare_response(by_v1.clone()));
    assert!(by_v1beta1.claims["ok"].error.is_empty());
    assert!(
        by_v1beta1.claims["bad"]
            .error
            .starts_with("claim ns/claim-bad (uid bad): "),
        "{}",
        by_v1beta1.claims["bad"].error
    );
}

/// The request conversion keeps every claim field (the request path keys on the UID).
#[test]
fn v1beta1_requests_convert_field_by_field() {
    let req = v1beta1_edge::prepare_request(v1beta1::NodePrepareResourcesRequest {
        claims: v1beta1_claims(),
    });
    assert_eq!(req.claims, v1_claims());
    let req = v1beta1_edge::unprepare_request(v1beta1::NodeUnprepareResourcesRequest {
        claims: v1beta1_claims(),
    });
    assert_eq!(req.claims, v1_claims());
}
