//! [`dra_plugin::kubeletplugin::serve`] over real unix sockets, called as the kubelet calls it:
//! registration (`GetInfo`, `NotifyRegistrationStatus`), NodePrepareResources and
//! NodeUnprepareResources on `v1` and `v1beta1`, the health stream (`v1alpha1` woken by a change,
//! then `v1` from the same source), and both
//! sockets gone once it stops. (The DAS plugin against the real kubelet is e2e's
//! `kubelet_smoke`.)

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use das_proto::dra::v1::dra_plugin_client::DraPluginClient as V1Client;
use das_proto::dra::v1beta1::dra_plugin_client::DraPluginClient as V1beta1Client;
use das_proto::dra::{v1, v1beta1};
use das_proto::dra_health::v1 as health_v1;
use das_proto::dra_health::v1::dra_resource_health_client::DraResourceHealthClient as HealthV1Client;
use das_proto::dra_health::v1alpha1 as health;
use das_proto::dra_health::v1alpha1::dra_resource_health_client::DraResourceHealthClient;
use das_proto::pluginregistration::registration_client::RegistrationClient;
use das_proto::pluginregistration::{InfoRequest, RegistrationStatus};
use dra_plugin::kubeletplugin::{self, ServeError, SocketPaths};
use dra_plugin::resourceslice::{FirstPublish, Pool, Publisher};
use dra_plugin::testing::FakeSliceApi;
use dra_plugin::{ClaimRef, DeviceHealthReport, Driver, HealthSource, PreparedDevice};
use hyper_util::rt::TokioIo;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};

const DRIVER: &str = "dev.example.com";
const WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
#[error("claim {0} is not allocated here")]
struct NotHere(String);

/// Prepares the claim with UID `ok` as device `dev-0`, refuses every other claim, and notes
/// every call.
#[derive(Default)]
struct OneDevice {
    calls: Mutex<Vec<String>>,
}

#[tonic::async_trait]
impl Driver for OneDevice {
    type Error = NotHere;

    async fn prepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> HashMap<String, Result<Vec<PreparedDevice>, NotHere>> {
        let mut calls = self.calls.lock().unwrap();
        claims
            .into_iter()
            .map(|c| {
                calls.push(format!("prepare {c}"));
                let r = if c.uid == "ok" {
                    Ok(vec![PreparedDevice {
                        requests: vec!["req".into()],
                        pool: "node-a".into(),
                        device: "dev-0".into(),
                        cdi_device_ids: vec!["example.com/dev=dev-0".into()],
                        share_id: Some("share-1".into()),
                    }])
                } else {
                    Err(NotHere(c.name.clone()))
                };
                (c.uid, r)
            })
            .collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> HashMap<String, Result<(), NotHere>> {
        let mut calls = self.calls.lock().unwrap();
        claims
            .into_iter()
            .map(|c| {
                calls.push(format!("unprepare {c}"));
                (c.uid, Ok(()))
            })
            .collect()
    }
}

/// Device `dev-0`'s health, as a watch a test can change.
struct Health(watch::Sender<u64>, Mutex<bool>);

#[tonic::async_trait]
impl HealthSource for Health {
    async fn device_health(&self) -> Vec<DeviceHealthReport> {
        let healthy = *self.1.lock().unwrap();
        vec![DeviceHealthReport {
            pool: "node-a".into(),
            device: "dev-0".into(),
            healthy,
            message: if healthy { "" } else { "it overheated" }.into(),
        }]
    }

    fn changes(&self) -> Option<watch::Receiver<u64>> {
        Some(self.0.subscribe())
    }
}

fn fresh_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dra-serve-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

async fn channel(socket: &Path) -> Channel {
    let socket = socket.to_path_buf();
    // The URI is a placeholder: the connector dials the socket.
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
        .unwrap()
}

async fn wait_for(path: &Path) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !path.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The proof [`kubeletplugin::serve`] requires: the node's pool published (empty) on a fake
/// ResourceSlice registry.
async fn published() -> FirstPublish {
    let api = Arc::new(FakeSliceApi::new(true, true));
    let mut publisher = Publisher::with_api(api, Pool::new(DRIVER, "node-a"));
    publisher.publish_first(vec![]).await.unwrap().1
}

fn claims<C>(make: impl Fn(String, String, String) -> C) -> Vec<C> {
    ["ok", "bad"]
        .map(|uid| make("ns".into(), format!("claim-{uid}"), uid.into()))
        .into_iter()
        .collect()
}

#[tokio::test]
async fn the_kubelet_registers_prepares_watches_health_and_sees_the_sockets_go() {
    let dir = fresh_dir("all");
    let paths =
        SocketPaths::new(&dir.join("registry"), &dir.join("plugins"), DRIVER, None).unwrap();
    let driver = Arc::new(OneDevice::default());
    let (changed, _) = watch::channel(0);
    let source = Arc::new(Health(changed, Mutex::new(true)));
    let stop = CancellationToken::new();
    let server = tokio::spawn({
        let (paths, driver, source, stop) =
            (paths.clone(), driver.clone(), source.clone(), stop.clone());
        async move {
            let first = published().await;
            kubeletplugin::serve(
                &first,
                &paths,
                DRIVER,
                driver,
                source,
                stop.cancelled_owned(),
            )
            .await
        }
    });
    wait_for(&paths.registration).await;

    // Registration: what the kubelet's plugin watcher reads, then its verdict.
    let mut registration = RegistrationClient::new(channel(&paths.registration).await);
    let info = registration
        .get_info(InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(Path::new(&info.endpoint), paths.dra);
    assert_eq!(
        info.supported_versions,
        [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth"
        ],
        "v1 first: the kubelet takes the first it knows"
    );
    registration
        .notify_registration_status(RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .unwrap();

    // v1: one entry per claim, the device with its share ID, the failure as the claim's text.
    let dra = channel(Path::new(&info.endpoint)).await;
    let mut v1_client = V1Client::new(dra.clone());
    let answer = v1_client
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: claims(|namespace, name, uid| v1::Claim {
                namespace,
                name,
                uid,
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.claims.len(), 2);
    let ok = &answer.claims["ok"];
    assert_eq!(ok.error, "");
    assert_eq!(
        ok.devices,
        [v1::Device {
            request_names: vec!["req".into()],
            pool_name: "node-a".into(),
            device_name: "dev-0".into(),
            cdi_device_ids: vec!["example.com/dev=dev-0".into()],
            share_id: Some("share-1".into()),
        }]
    );
    assert_eq!(
        answer.claims["bad"].error,
        "claim ns/claim-bad (uid bad): claim claim-bad is not allocated here"
    );

    // v1beta1: the same answer without the share ID; unprepare reaches the driver.
    let mut v1beta1_client = V1beta1Client::new(dra.clone());
    let answer = v1beta1_client
        .node_prepare_resources(v1beta1::NodePrepareResourcesRequest {
            claims: claims(|namespace, name, uid| v1beta1::Claim {
                namespace,
                name,
                uid,
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.claims["ok"].devices[0].device_name, "dev-0");
    assert!(
        answer.claims["bad"]
            .error
            .ends_with("claim claim-bad is not allocated here")
    );
    let answer = v1beta1_client
        .node_unprepare_resources(v1beta1::NodeUnprepareResourcesRequest {
            claims: claims(|namespace, name, uid| v1beta1::Claim {
                namespace,
                name,
                uid,
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.claims.len(), 2);
    assert!(answer.claims.values().all(|c| c.error.is_empty()));
    assert_eq!(
        *driver.calls.lock().unwrap(),
        [
            "prepare ns/claim-ok (uid ok)",
            "prepare ns/claim-bad (uid bad)",
            "prepare ns/claim-ok (uid ok)",
            "prepare ns/claim-bad (uid bad)",
            "unprepare ns/claim-ok (uid ok)",
            "unprepare ns/claim-bad (uid bad)",
        ]
    );

    // Health: every device at once, then again as soon as the source says it changed (long
    // before the 30 s interval).
    let mut stream = DraResourceHealthClient::new(dra.clone())
        .node_watch_resources(health::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(WAIT, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.devices.len(), 1);
    let device = &first.devices[0];
    assert_eq!(device.health, health::HealthStatus::Healthy as i32);
    let id = device.device.as_ref().unwrap();
    assert_eq!(
        (id.pool_name.as_str(), id.device_name.as_str()),
        ("node-a", "dev-0")
    );
    assert_eq!(
        device.health_check_timeout_seconds,
        kubeletplugin::HEALTH_TIMEOUT.as_secs() as i64
    );
    *source.1.lock().unwrap() = false;
    source.0.send_modify(|n| *n += 1);
    let second = tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("a change is reported at once")
        .unwrap()
        .unwrap();
    assert_eq!(
        second.devices[0].health,
        health::HealthStatus::Unhealthy as i32
    );
    assert_eq!(second.devices[0].message, "it overheated");

    // v1 (what a 1.37 kubelet picks): the same devices, from the same source.
    let mut v1_stream = HealthV1Client::new(dra)
        .node_watch_resources(health_v1::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let now = tokio::time::timeout(WAIT, v1_stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let device = &now.devices[0];
    let id = device.device.as_ref().unwrap();
    assert_eq!(
        (id.pool_name.as_str(), id.device_name.as_str()),
        ("node-a", "dev-0")
    );
    assert_eq!(device.health, health_v1::HealthStatus::Unhealthy as i32);
    assert_eq!(device.message, "it overheated");
    assert_eq!(
        (
            device.last_updated_time > 0,
            device.health_check_timeout_seconds
        ),
        (true, kubeletplugin::HEALTH_TIMEOUT.as_secs() as i64)
    );
    drop(v1_stream);

    // Stop: both sockets go, the server ends cleanly.
    drop(stream);
    stop.cancel();
    tokio::time::timeout(WAIT, server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!paths.registration.exists(), "registration socket removed");
    assert!(!paths.dra.exists(), "DRA socket removed");
}

/// A socket left by a crashed instance is replaced; a directory that cannot be made is a clear
/// error naming it.
#[tokio::test]
async fn a_stale_socket_is_replaced_and_a_bad_directory_named() {
    let dir = fresh_dir("stale");
    let paths = SocketPaths::new(
        &dir.join("registry"),
        &dir.join("plugins"),
        DRIVER,
        Some("pod-1"),
    )
    .unwrap();
    std::fs::create_dir_all(paths.dra.parent().unwrap()).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&paths.dra).unwrap());
    assert!(paths.dra.exists(), "a stale socket file");
    let stop = CancellationToken::new();
    let server = tokio::spawn({
        let (paths, stop) = (paths.clone(), stop.clone());
        let source = Arc::new(Health(watch::channel(0).0, Mutex::new(true)));
        async move {
            kubeletplugin::serve(
                &published().await,
                &paths,
                DRIVER,
                Arc::new(OneDevice::default()),
                source,
                stop.cancelled_owned(),
            )
            .await
        }
    });
    wait_for(&paths.registration).await;
    let answer = V1Client::new(channel(&paths.dra).await)
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims: vec![] })
        .await
        .unwrap()
        .into_inner();
    assert!(answer.claims.is_empty());
    stop.cancel();
    server.await.unwrap().unwrap();

    let file = dir.join("not-a-dir");
    std::fs::write(&file, b"").unwrap();
    let paths = SocketPaths::explicit(dir.join("reg.sock"), file.join("dra.sock")).unwrap();
    let source = Arc::new(Health(watch::channel(0).0, Mutex::new(true)));
    let err = kubeletplugin::serve(
        &published().await,
        &paths,
        DRIVER,
        Arc::new(OneDevice::default()),
        source,
        async {},
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ServeError::CreateDir { .. }), "{err:?}");
    assert_eq!(err.to_string(), format!("create {}", file.display()));
}
