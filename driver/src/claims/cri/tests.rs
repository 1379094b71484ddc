//! Unit tests of [`super`] (`cri.rs`): the client against a CRI server on a unix socket that
//! answers from a list of pods, checking the label selector it receives, and from a list of
//! containers with their verbose status (as containerd reports it).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use das_proto::cri::POD_UID_LABEL;
use das_proto::cri::v1::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use das_proto::cri::v1::{
    Container, ContainerState, ContainerStatusRequest, ContainerStatusResponse,
    ListContainersRequest, ListContainersResponse, ListPodSandboxRequest, ListPodSandboxResponse,
    PodSandbox,
};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use super::CriRuntime;
use crate::claims::container_marks::ClaimMarks;
use crate::claims::orphans::{PodContainers, RuntimeError};

/// A container of the fake runtime and the `info` of its verbose status (`None`: the runtime
/// reports none).
type FakeContainer = (Container, Option<String>);

/// Pod UID → (sandboxes, containers) the fake runtime has; and the node's containers.
#[derive(Default, Clone)]
struct Fake {
    pods: Arc<Mutex<BTreeMap<String, (usize, usize)>>>,
    containers: Arc<Mutex<Vec<FakeContainer>>>,
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
        let filter = r.into_inner().filter;
        if filter.is_none() {
            self.calls.lock().unwrap().push("all containers".into());
            let all = self.containers.lock().unwrap();
            return Ok(Response::new(ListContainersResponse {
                containers: all.iter().map(|(c, _)| c.clone()).collect(),
            }));
        }
        let pod = selected(filter.as_ref().map(|f| &f.label_selector))?;
        self.calls.lock().unwrap().push(format!("containers {pod}"));
        let n = self.pods.lock().unwrap().get(&pod).map_or(0, |p| p.1);
        Ok(Response::new(ListContainersResponse {
            containers: vec![Container::default(); n],
        }))
    }

    async fn container_status(
        &self,
        r: Request<ContainerStatusRequest>,
    ) -> Result<Response<ContainerStatusResponse>, Status> {
        let r = r.into_inner();
        if !r.verbose {
            return Err(Status::invalid_argument("DAS asks for the verbose status"));
        }
        self.calls
            .lock()
            .unwrap()
            .push(format!("status {}", r.container_id));
        let all = self.containers.lock().unwrap();
        let (_, info) = all
            .iter()
            .find(|(c, _)| c.id == r.container_id)
            .ok_or_else(|| Status::not_found("no such container"))?;
        Ok(Response::new(ContainerStatusResponse {
            status: None,
            info: info
                .iter()
                .map(|i| ("info".to_string(), i.clone()))
                .collect(),
        }))
    }
}

/// A container of pod `pod` in `state`.
fn container(id: &str, pod: &str, state: ContainerState) -> Container {
    Container {
        id: id.into(),
        state: state as i32,
        labels: [
            ("io.kubernetes.pod.name", pod),
            ("io.kubernetes.pod.namespace", "ns"),
            ("io.kubernetes.container.name", "main"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        ..Default::default()
    }
}

/// Containerd's verbose info of a container whose runtime spec has `env`.
fn info(env: &[&str]) -> Option<String> {
    Some(
        serde_json::json!({"sandboxID": "s", "pid": 1, "runtimeSpec": {"process": {"env": env}}})
            .to_string(),
    )
}

/// The node's live containers that carry a claim's marks, read from each one's verbose status;
/// exited containers are not asked; a live one without a runtime spec is an error, never an
/// absence.
#[tokio::test]
async fn containers_holding_a_claims_marks_are_found_in_their_runtime_specs() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("cri.sock");
    let fake = Fake::default();
    fake.containers.lock().unwrap().extend([
        (
            container("c-late", "late", ContainerState::ContainerRunning),
            info(&["DAS_MIG_UUID_uid_1_gpu_0=MIG-1"]),
        ),
        (
            container("c-other", "other", ContainerState::ContainerRunning),
            info(&["DAS_MIG_UUID_uid_2_gpu_0=MIG-2"]),
        ),
        (
            container("c-exited", "old", ContainerState::ContainerExited),
            None,
        ),
    ]);
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RuntimeServiceServer::new(fake.clone()))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    let cri = CriRuntime::new(socket.to_str().unwrap()).unwrap();
    let marks = ClaimMarks {
        env_prefixes: vec!["DAS_MIG_UUID_uid_1_".into()],
        device_paths: Vec::new(),
    };
    assert_eq!(
        cri.containers_holding(&marks).await.unwrap(),
        ["container main of pod ns/late (its CDI variable DAS_MIG_UUID_uid_1_gpu_0)"]
    );
    let calls = fake.calls.lock().unwrap().clone();
    assert_eq!(calls, ["all containers", "status c-late", "status c-other"]);
    // A live container the runtime says nothing about: the answer is an error.
    fake.containers.lock().unwrap().push((
        container("c-mute", "mute", ContainerState::ContainerRunning),
        None,
    ));
    let e = cri.containers_holding(&marks).await.unwrap_err();
    assert!(
        matches!(&e, RuntimeError::NoRuntimeSpec { container } if container.contains("ns/mute")),
        "{e}"
    );
    server.abort();
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
