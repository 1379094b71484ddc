//! Unit tests of [`super`] (`cri.rs`): the client against a CRI server on a unix socket that
//! answers from a list of pods, checking the label selector it receives.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use das_proto::cri::POD_UID_LABEL;
use das_proto::cri::v1::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use das_proto::cri::v1::{
    Container, ListContainersRequest, ListContainersResponse, ListPodSandboxRequest,
    ListPodSandboxResponse, PodSandbox,
};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use super::CriRuntime;
use crate::claims::orphans::PodContainers;

/// Pod UID → (sandboxes, containers) the fake runtime has.
#[derive(Default, Clone)]
struct Fake {
    pods: Arc<Mutex<BTreeMap<String, (usize, usize)>>>,
    calls: Arc<Mutex<Vec<String>>>,
}

fn selected(labels: Option<&std::collections::HashMap<String, String>>) -> Result<String, Status> {
    let labels = labels.ok_or_else(|| Status::invalid_argument("no filter"))?;
    labels
        .get(POD_UID_LABEL)
        .cloned()
        .ok_or_else(|| Status::invalid_argument("no pod UID label selector"))
}

#[tonic::async_trait]
impl RuntimeService for Fake {
    async fn list_pod_sandbox(
        &self,
        r: Request<ListPodSandboxRequest>,
    ) -> Result<Response<ListPodSandboxResponse>, Status> {
        let pod = selected(r.into_inner().filter.as_ref().map(|f| &f.label_selector))?;
        self.calls.lock().unwrap().push(format!("sandboxes {pod}"));
        let n = self.pods.lock().unwrap().get(&pod).map_or(0, |p| p.0);
        Ok(Response::new(ListPodSandboxResponse {
            items: vec![PodSandbox::default(); n],
        }))
    }

    async fn list_containers(
        &self,
        r: Request<ListContainersRequest>,
    ) -> Result<Response<ListContainersResponse>, Status> {
        let pod = selected(r.into_inner().filter.as_ref().map(|f| &f.label_selector))?;
        self.calls.lock().unwrap().push(format!("containers {pod}"));
        let n = self.pods.lock().unwrap().get(&pod).map_or(0, |p| p.1);
        Ok(Response::new(ListContainersResponse {
            containers: vec![Container::default(); n],
        }))
    }
}

#[tokio::test]
async fn a_pod_has_containers_while_the_runtime_has_a_sandbox_or_a_container_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("cri.sock");
    let fake = Fake::default();
    fake.pods.lock().unwrap().extend([
        ("sandbox-only".to_string(), (1, 0)),
        ("container-only".to_string(), (0, 1)),
        ("both".to_string(), (1, 2)),
    ]);
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RuntimeServiceServer::new(fake.clone()))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    let cri = CriRuntime::new(&format!("unix://{}", socket.display())).unwrap();
    for pod in ["sandbox-only", "container-only", "both"] {
        assert_eq!(cri.pod_has_containers(pod).await, Ok(true), "{pod}");
    }
    assert_eq!(cri.pod_has_containers("gone").await, Ok(false));
    // A pod with a sandbox is answered without listing containers; a gone one asks both.
    let calls = fake.calls.lock().unwrap().clone();
    assert_eq!(calls[0], "sandboxes sandbox-only");
    assert_eq!(calls[1], "sandboxes container-only");
    assert_eq!(calls[2], "containers container-only");
    assert_eq!(calls.last().unwrap(), "containers gone");
    server.abort();
}

#[tokio::test]
async fn a_runtime_that_does_not_answer_is_an_error_not_an_absence() {
    let dir = tempfile::tempdir().unwrap();
    let cri = CriRuntime::new(dir.path().join("missing.sock").to_str().unwrap()).unwrap();
    let e = cri.pod_has_containers("p").await.unwrap_err();
    assert!(e.to_string().contains("missing.sock"), "{e}");
}

#[test]
fn an_endpoint_that_is_not_a_unix_socket_is_refused_with_the_valid_form() {
    let e = CriRuntime::new("tcp://127.0.0.1:1234").unwrap_err();
    assert!(
        e.to_string()
            .contains("unix:///run/containerd/containerd.sock"),
        "{e}"
    );
    assert!(
        CriRuntime::new("/run/crio/crio.sock")
            .unwrap()
            .socket()
            .ends_with("crio.sock")
    );
}
