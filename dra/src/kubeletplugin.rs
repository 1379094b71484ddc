//! The kubelet side of a DRA driver (the counterpart of Go's
//! `k8s.io/dynamic-resource-allocation/kubeletplugin`): socket paths, plugin registration and
//! the DRA gRPC services (`v1.DRAPlugin` and `v1beta1.DRAPlugin` on one socket, with the
//! resource-health stream in `v1` and `v1alpha1`, `kubeletplugin/health_service.rs`).
//!
//! The DRA logic exists once, in the `v1` service. The `v1beta1` service carries the same
//! messages without `Device.share_id`: it converts its request to `v1` at the edge
//! (`kubeletplugin/v1beta1_edge.rs`), calls the `v1` service and converts the answer back, so
//! both versions answer alike.
//!
//! Protocol facts (docs/reference/dra.md, "Kubelet plugin protocol"): the kubelet's plugin
//! watcher finds `<registry dir>/<name>-reg.sock`, calls `GetInfo`, dials the returned endpoint
//! and picks the first service in `supported_versions` it knows, then calls
//! `NotifyRegistrationStatus`. One NodePrepareResources call carries every claim of one pod for
//! this driver; the response must have one entry per claim UID; per-claim failures go in
//! `error`, never as a gRPC error.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use das_proto::dra::{v1, v1beta1};
use das_proto::dra_health;
use das_proto::pluginregistration::PluginInfo;
use das_proto::registration::Registrar;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use crate::driver::{ClaimRef, Driver};
use crate::health::HealthSource;
use crate::resourceslice::FirstPublish;
use health_service::{HealthV1, HealthV1alpha1};

/// Longest unix socket path the kubelet accepts (`sun_path` is 108 bytes including the NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// Why [`SocketPaths::new`] refused a socket path.
#[derive(Debug, thiserror::Error)]
pub enum SocketPathError {
    /// The path is longer than a unix socket allows ([`MAX_SOCKET_PATH`] bytes).
    #[error(
        "socket path {} is {len} bytes, more than the {MAX_SOCKET_PATH} a unix socket allows; use a shorter kubelet directory",
        path.display()
    )]
    TooLong {
        /// The socket path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
    },
    /// The path is relative.
    #[error(
        "socket path {} must be absolute: the kubelet rejects relative endpoints",
        path.display()
    )]
    Relative {
        /// The socket path.
        path: PathBuf,
    },
}

/// Why [`serve`] failed: a socket could not be set up, or a gRPC server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The socket's directory cannot be created.
    #[error("create {}", dir.display())]
    CreateDir {
        /// The directory.
        dir: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A socket file left by a crashed instance cannot be removed.
    #[error("remove stale socket {}", path.display())]
    RemoveStale {
        /// The socket path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Listening on the socket failed.
    #[error("listen on {}", path.display())]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The registration server (the kubelet's plugin watcher talks to it) failed.
    #[error("registration server")]
    Registration(#[source] tonic::transport::Error),
    /// The DRA and health server failed.
    #[error("DRA server")]
    Dra(#[source] tonic::transport::Error),
    /// A server's task panicked or was cancelled.
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
}

/// The kubelet's error text for a claim: the claim, then the cause.
fn error_text(claims: &[ClaimRef], uid: &str, e: &dyn std::error::Error) -> String {
    match claims.iter().find(|c| c.uid == uid) {
        Some(c) => format!("claim {c}: {e}"),
        None => format!("claim (uid {uid}): {e}"),
    }
}

/// How often the health of every device is re-sent on the stream.
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(30);
/// After this long without an update the kubelet reports a device's health as Unknown.
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(90);

/// Where the plugin's two sockets go: made by [`SocketPaths::new`] (the kubelet plugin
/// conventions) or [`SocketPaths::explicit`] (names of the caller's choosing), both checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SocketPaths {
    /// Registration socket in the kubelet's plugin registry dir.
    pub registration: PathBuf,
    /// DRA service socket, conventionally under `<plugins dir>/<driver>/`.
    pub dra: PathBuf,
}

impl SocketPaths {
    /// Socket paths for the driver named `driver` (its DRA driver name, e.g. `dev.example.com`):
    /// `<registry_dir>/<driver>-reg.sock` and `<plugins_dir>/<driver>/dra.sock`. With `pod_uid` (a
    /// DaemonSet pod during a rolling update, so two instances can run side by side) both names
    /// are made unique per pod, as the Go `kubeletplugin` package does: `dra-<uid>.sock` and
    /// `<driver>-<uid>-reg.sock`, or, when that path is too long,
    /// `<driver>-<first 16 hex digits of the uid's 64-bit FNV-1a>-reg.sock`.
    ///
    /// # Errors
    /// A path longer than [`MAX_SOCKET_PATH`] bytes, or a relative one.
    pub fn new(
        registry_dir: &Path,
        plugins_dir: &Path,
        driver: &str,
        pod_uid: Option<&str>,
    ) -> Result<Self, SocketPathError> {
        let dra_dir = plugins_dir.join(driver);
        let (registration, dra) = match pod_uid {
            None => (
                registry_dir.join(format!("{driver}-reg.sock")),
                dra_dir.join("dra.sock"),
            ),
            Some(uid) => {
                let long = registry_dir.join(format!("{driver}-{uid}-reg.sock"));
                let reg = if long.as_os_str().len() <= MAX_SOCKET_PATH {
                    long
                } else {
                    registry_dir.join(format!(
                        "{driver}-{:016x}-reg.sock",
                        das_runtime::hash::fnv1a64(uid.as_bytes())
                    ))
                };
                (reg, dra_dir.join(format!("dra-{uid}.sock")))
            }
        };
        Self::explicit(registration, dra)
    }

    /// Socket paths of the caller's choosing, for a kubelet set up with other names. Both must be
    /// absolute (the kubelet rejects relative endpoints) and fit a unix socket address.
    ///
    /// # Errors
    /// A path longer than [`MAX_SOCKET_PATH`] bytes, or a relative one.
    pub fn explicit(registration: PathBuf, dra: PathBuf) -> Result<Self, SocketPathError> {
        for p in [&registration, &dra] {
            let len = p.as_os_str().len();
            if len > MAX_SOCKET_PATH {
                return Err(SocketPathError::TooLong {
                    path: p.clone(),
                    len,
                });
            }
            if !p.is_absolute() {
                return Err(SocketPathError::Relative { path: p.clone() });
            }
        }
        Ok(Self { registration, dra })
    }
}

/// Serves `handler` and `health` to the kubelet as the DRA driver named `driver` until
/// `shutdown` resolves: the DRA services first, then the registration service, so the kubelet
/// never learns of an endpoint that does not answer yet; removes both sockets afterwards (the
/// registration socket first: the kubelet deregisters the plugin when it disappears). A socket
/// file left at either path by a crashed instance is replaced.
///
/// `_published` is the proof that the driver's ResourceSlices were published
/// ([`FirstPublish`], from [`crate::resourceslice::Publisher::publish_first`]): the kubelet
/// learns of the plugin only once the scheduler can see its devices.
///
/// ```compile_fail,E0061
/// # use std::sync::Arc;
/// # use dra_plugin::kubeletplugin::{self, SocketPaths};
/// # use dra_plugin::{Driver, HealthSource};
/// // Serving the kubelet before the first publish does not compile: the proof is missing.
/// async fn register_first<D: Driver>(paths: &SocketPaths, d: Arc<D>, h: Arc<dyn HealthSource>) {
///     let _ = kubeletplugin::serve(paths, "dev.example.com", d, h, async {}).await;
/// }
/// ```
///
/// # Errors
/// A socket cannot be set up, or a server stopped with an error (reported once both stopped).
pub async fn serve<D: Driver + ?Sized>(
    _published: &FirstPublish,
    paths: &SocketPaths,
    driver: &str,
    handler: Arc<D>,
    health: Arc<dyn HealthSource>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let dra = bind(&paths.dra)?;
    let reg = bind(&paths.registration)?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let wait = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    let dra_server = tonic::transport::Server::builder()
        .add_service(v1::dra_plugin_server::DraPluginServer::new(V1(
            handler.clone()
        )))
        .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(V1beta1(
            V1(handler),
        )))
        .add_service(
            dra_health::v1::dra_resource_health_server::DraResourceHealthServer::new(HealthV1(
                health.clone(),
            )),
        )
        .add_service(
            dra_health::v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(
                HealthV1alpha1(health),
            ),
        )
        .serve_with_incoming_shutdown(UnixListenerStream::new(dra), wait(stop_rx.clone()));
    let info = PluginInfo {
        r#type: das_proto::pluginregistration::DRA_PLUGIN_TYPE.into(),
        name: driver.into(),
        endpoint: paths.dra.display().to_string(),
        // Every gRPC service the socket serves. From Kubernetes 1.37 the kubelet watches device
        // health only from plugins that list the health service here (1.34 to 1.36 always
        // tried it); earlier kubelets skip entries they do not know. A 1.37+ kubelet picks the
        // v1 health service by its own order of preference, whatever the order here.
        supported_versions: vec![
            das_proto::dra::SERVICE_V1.into(),
            das_proto::dra::SERVICE_V1BETA1.into(),
            dra_health::SERVICE_V1.into(),
            dra_health::SERVICE_V1ALPHA1.into(),
        ],
    };
    let reg_server = tonic::transport::Server::builder()
        .add_service(Registrar::new(info, Box::new(log_registration)))
        .serve_with_incoming_shutdown(das_proto::authority::incoming(reg), wait(stop_rx));
    let dra_task = tokio::spawn(dra_server);
    let reg_task = tokio::spawn(reg_server);
    tracing::info!(registration = %paths.registration.display(), dra = %paths.dra.display(), "serving the kubelet");

    shutdown.await;
    // Registration socket first: the kubelet deregisters the plugin when it disappears.
    let _ = stop_tx.send(true);
    let _ = std::fs::remove_file(&paths.registration);
    let (r1, r2) = tokio::join!(reg_task, dra_task);
    let _ = std::fs::remove_file(&paths.dra);
    r1?.map_err(ServeError::Registration)?;
    r2?.map_err(ServeError::Dra)?;
    Ok(())
}

/// Logs the kubelet's answer to our registration.
fn log_registration(registered: bool, error: String) {
    if registered {
        tracing::info!("registered with the kubelet");
    } else {
        tracing::error!(%error, "the kubelet rejected the registration");
    }
}

fn bind(path: &Path) -> Result<UnixListener, ServeError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| ServeError::CreateDir {
            dir: dir.to_path_buf(),
            source,
        })?;
    }
    // A socket left by a crashed instance of ourselves; never another plugin's (names are ours).
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(ServeError::RemoveStale {
                path: path.to_path_buf(),
                source,
            });
        }
    }
    UnixListener::bind(path).map_err(|source| ServeError::Bind {
        path: path.to_path_buf(),
        source,
    })
}

/// The v1 service: the one implementation of NodePrepareResources and NodeUnprepareResources.
struct V1<D: ?Sized>(Arc<D>);

/// The v1beta1 service: the v1 service behind a conversion of its messages ([`v1beta1_edge`]).
struct V1beta1<D: ?Sized>(V1<D>);

/// The driver's names of the kubelet's claims.
fn claim_refs(claims: Vec<v1::Claim>) -> Vec<ClaimRef> {
    claims
        .into_iter()
        .map(|c| ClaimRef {
            namespace: c.namespace,
            name: c.name,
            uid: c.uid,
        })
        .collect()
}

#[tonic::async_trait]
impl<D: Driver + ?Sized> v1::dra_plugin_server::DraPlugin for V1<D> {
    async fn node_prepare_resources(
        &self,
        req: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        let refs = claim_refs(req.into_inner().claims);
        let results = self.0.prepare(refs.clone()).await;
        let claims = results
            .into_iter()
            .map(|(uid, r)| {
                let entry = match r {
                    Ok(devices) => v1::NodePrepareResourceResponse {
                        devices: devices
                            .into_iter()
                            .map(|d| v1::Device {
                                request_names: d.requests,
                                pool_name: d.pool,
                                device_name: d.device,
                                cdi_device_ids: d.cdi_device_ids,
                                share_id: d.share_id,
                            })
                            .collect(),
                        error: String::new(),
                    },
                    Err(e) => v1::NodePrepareResourceResponse {
                        devices: vec![],
                        error: error_text(&refs, &uid, &e),
                    },
                };
                (uid, entry)
            })
            .collect();
        Ok(Response::new(v1::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        let refs = claim_refs(req.into_inner().claims);
        let results = self.0.unprepare(refs.clone()).await;
        let claims = results
            .into_iter()
            .map(|(uid, r)| {
                let error = r.err().map(|e| error_text(&refs, &uid, &e));
                (
                    uid,
                    v1::NodeUnprepareResourceResponse {
                        error: error.unwrap_or_default(),
                    },
                )
            })
            .collect();
        Ok(Response::new(v1::NodeUnprepareResourcesResponse { claims }))
    }
}

#[tonic::async_trait]
impl<D: Driver + ?Sized> v1beta1::dra_plugin_server::DraPlugin for V1beta1<D> {
    async fn node_prepare_resources(
        &self,
        req: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let req = req.map(v1beta1_edge::prepare_request);
        let resp = v1::dra_plugin_server::DraPlugin::node_prepare_resources(&self.0, req).await?;
        Ok(resp.map(v1beta1_edge::prepare_response))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let req = req.map(v1beta1_edge::unprepare_request);
        let resp = v1::dra_plugin_server::DraPlugin::node_unprepare_resources(&self.0, req).await?;
        Ok(resp.map(v1beta1_edge::unprepare_response))
    }
}

mod health_service;
mod v1beta1_edge;

#[cfg(test)]
mod tests;
