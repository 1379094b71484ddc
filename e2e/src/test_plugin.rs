//! A minimal DRA kubelet plugin for harness tests: it registers with a hollow kubelet, answers
//! NodePrepareResources with one CDI device ID per allocated device, and records every call.
//! The real plugin (`das-kubelet-plugin`) lives in `driver/`; this one only proves that the
//! kubelet's DRA manager reaches a plugin over the real sockets and protocol.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use das_proto::dra::v1::dra_plugin_server::{DraPlugin, DraPluginServer};
use das_proto::dra::v1::{
    Device, NodePrepareResourceResponse, NodePrepareResourcesRequest, NodePrepareResourcesResponse,
    NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest, NodeUnprepareResourcesResponse,
};
use das_proto::pluginregistration::PluginInfo;
use das_proto::registration::Registrar;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::{Api, Client};
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// One call the kubelet made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Prepare {
        claim_uid: String,
        claim_name: String,
    },
    Unprepare {
        claim_uid: String,
    },
    Registered {
        ok: bool,
        error: String,
    },
}

/// A running test plugin; stops serving when dropped.
pub struct TestPlugin {
    pub calls: Arc<Mutex<Vec<Call>>>,
    sockets: Vec<PathBuf>,
    shutdown: Vec<oneshot::Sender<()>>,
}

impl TestPlugin {
    /// Serves driver `driver` for the kubelet whose dirs are `registry_dir` and `plugins_dir`.
    /// CDI IDs are `<cdi_kind>=<claim uid>-<device>`.
    pub async fn start(
        client: Client,
        driver: &str,
        cdi_kind: &str,
        registry_dir: &Path,
        plugins_dir: &Path,
    ) -> Result<Self> {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let dra_dir = plugins_dir.join(driver);
        std::fs::create_dir_all(&dra_dir)?;
        std::fs::create_dir_all(registry_dir)?;
        let dra_sock = dra_dir.join("dra.sock");
        let reg_sock = registry_dir.join(format!("{driver}-reg.sock"));
        let mut plugin = Self {
            calls: calls.clone(),
            sockets: vec![],
            shutdown: vec![],
        };

        // DRA service first, then registration: the kubelet may dial the endpoint at once.
        let dra = DraPluginServer::new(Dra {
            client,
            driver: driver.into(),
            cdi_kind: cdi_kind.into(),
            calls: calls.clone(),
        });
        plugin.serve(
            &dra_sock,
            tonic::transport::Server::builder().add_service(dra),
            false,
        )?;
        let seen = calls.clone();
        let reg = Registrar::new(
            PluginInfo {
                r#type: das_proto::pluginregistration::DRA_PLUGIN_TYPE.into(),
                name: driver.into(),
                endpoint: dra_sock.display().to_string(),
                supported_versions: vec![das_proto::dra::SERVICE_V1.into()],
            },
            Box::new(move |ok, error| seen.lock().unwrap().push(Call::Registered { ok, error })),
        );
        plugin.serve(
            &reg_sock,
            tonic::transport::Server::builder().add_service(reg),
            true,
        )?;
        Ok(plugin)
    }

    /// Serves `router` on a fresh socket at `sock` until the plugin is dropped. The registration
    /// socket goes through [`das_proto::authority`]: the kubelet's registration client sends the
    /// socket path as `:authority`, which h2 would reject.
    fn serve(
        &mut self,
        sock: &Path,
        router: tonic::transport::server::Router,
        registration: bool,
    ) -> Result<()> {
        let _ = std::fs::remove_file(sock);
        let listener =
            UnixListener::bind(sock).with_context(|| format!("bind {}", sock.display()))?;
        let (tx, rx) = oneshot::channel::<()>();
        let stop = async {
            let _ = rx.await;
        };
        if registration {
            tokio::spawn(
                router.serve_with_incoming_shutdown(das_proto::authority::incoming(listener), stop),
            );
        } else {
            tokio::spawn(
                router.serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop),
            );
        }
        self.sockets.push(sock.to_path_buf());
        self.shutdown.push(tx);
        Ok(())
    }

    /// A snapshot of the calls so far.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

impl Drop for TestPlugin {
    fn drop(&mut self) {
        for tx in self.shutdown.drain(..) {
            let _ = tx.send(());
        }
        for s in &self.sockets {
            let _ = std::fs::remove_file(s);
        }
    }
}

struct Dra {
    client: Client,
    driver: String,
    cdi_kind: String,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Dra {
    async fn prepare(&self, namespace: &str, name: &str, uid: &str) -> Result<Vec<Device>, String> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
        let claim = api
            .get(name)
            .await
            .map_err(|e| format!("get claim {namespace}/{name}: {e}"))?;
        if claim.metadata.uid.as_deref() != Some(uid) {
            return Err(format!(
                "claim {namespace}/{name}: UID changed, expected {uid}"
            ));
        }
        let results = claim
            .status
            .and_then(|s| s.allocation)
            .and_then(|a| a.devices)
            .and_then(|d| d.results)
            .ok_or_else(|| format!("claim {namespace}/{name} is not allocated"))?;
        Ok(results
            .into_iter()
            .filter(|r| r.driver == self.driver)
            .map(|r| Device {
                request_names: vec![r.request.split('/').next().unwrap_or_default().to_string()],
                cdi_device_ids: vec![format!("{}={uid}-{}", self.cdi_kind, r.device)],
                pool_name: r.pool,
                device_name: r.device,
                share_id: None,
            })
            .collect())
    }
}

#[tonic::async_trait]
impl DraPlugin for Dra {
    async fn node_prepare_resources(
        &self,
        req: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let mut resp = NodePrepareResourcesResponse::default();
        for c in req.into_inner().claims {
            self.calls.lock().unwrap().push(Call::Prepare {
                claim_uid: c.uid.clone(),
                claim_name: c.name.clone(),
            });
            let entry = match self.prepare(&c.namespace, &c.name, &c.uid).await {
                Ok(devices) => NodePrepareResourceResponse {
                    devices,
                    error: String::new(),
                },
                Err(error) => NodePrepareResourceResponse {
                    devices: vec![],
                    error,
                },
            };
            resp.claims.insert(c.uid, entry);
        }
        Ok(Response::new(resp))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let mut resp = NodeUnprepareResourcesResponse::default();
        for c in req.into_inner().claims {
            self.calls.lock().unwrap().push(Call::Unprepare {
                claim_uid: c.uid.clone(),
            });
            resp.claims
                .insert(c.uid, NodeUnprepareResourceResponse::default());
        }
        Ok(Response::new(resp))
    }
}
