//! The MPS host's server: listens on `<state dir>/mps/host.sock` (mode 0600: root's, as the
//! plugin is), answers each connection's request in a task of its own (a plugin that
//! disconnects or stalls mid-request holds up no other request, and a spawn it asked for
//! completes: the daemon runs and its pid file is written, for the next plugin to adopt or
//! stop), keeps the daemons it started as children and reaps each when it exits.

use std::collections::BTreeMap;
use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use super::protocol::{self, MAX_MESSAGE, Request, Response};
use crate::mps::daemon::{DaemonProcess, MpsError};
use crate::mps::layout::MPS_DIR;

/// How long a connection may take to send its request; one slower is dropped unanswered.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The daemons the host started and has not reaped, by pid.
type Children = Arc<Mutex<BTreeMap<u32, DaemonProcess>>>;

/// The host of `<state_dir>/mps/`.
pub struct Host {
    /// `<state dir>/mps`: every file of a spawn request must be under it.
    root: PathBuf,
    children: Children,
}

impl Host {
    /// The host of `state_dir`'s daemons.
    pub fn new(state_dir: &Path) -> Self {
        Self {
            root: state_dir.join(MPS_DIR),
            children: Arc::default(),
        }
    }

    /// Serves requests on `<state dir>/mps/host.sock` until `shutdown` resolves. The daemons
    /// run on when it returns (in a container, the runtime ends them with the container).
    ///
    /// # Errors
    /// The socket could not be made: its directory, another host listening there, the bind.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> Result<(), MpsError> {
        let listener = self.bind()?;
        tracing::info!(socket = %self.socket().display(), "MPS host listening");
        let host = Arc::new(self);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        tokio::spawn(host.clone().answer(stream));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a connection to the MPS host failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
    }

    fn socket(&self) -> PathBuf {
        self.root.join("host.sock")
    }

    /// Makes `<state dir>/mps` (0755, as the daemons need), removes a socket no host listens
    /// on any more, binds, and makes the socket 0600.
    fn bind(&self) -> Result<UnixListener, MpsError> {
        let socket = self.socket();
        std::fs::create_dir_all(&self.root)
            .map_err(|e| MpsError(format!("create {}: {e}", self.root.display())))?;
        if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
            return Err(MpsError(format!(
                "another MPS host listens on {} already (one host per node and state dir)",
                socket.display()
            )));
        }
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket)
            .map_err(|e| MpsError(format!("listen on {}: {e}", socket.display())))?;
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| MpsError(format!("chmod 0600 {}: {e}", socket.display())))?;
        Ok(listener)
    }

    /// Reads one request, answers it; a client gone before the answer only misses it.
    async fn answer(self: Arc<Self>, mut stream: UnixStream) {
        let mut buf = Vec::new();
        let read = tokio::time::timeout(
            READ_TIMEOUT,
            (&mut stream)
                .take(MAX_MESSAGE as u64 + 1)
                .read_to_end(&mut buf),
        )
        .await;
        let response = match read {
            Err(_) => {
                tracing::warn!(
                    "an MPS host client sent no request within {} s",
                    READ_TIMEOUT.as_secs()
                );
                return;
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "reading an MPS host request failed");
                return;
            }
            Ok(Ok(_)) => match protocol::decode_request(&buf) {
                Ok(request) => self.handle(request).await,
                Err(message) => Response::Error { message },
            },
        };
        if let Err(e) = stream.write_all(&protocol::encode(&response)).await {
            tracing::info!(error = %e, answer = ?response, "the MPS host client left before its answer");
        }
        let _ = stream.shutdown().await;
    }

    /// The answer to `request`.
    pub async fn handle(&self, request: Request) -> Response {
        match request {
            Request::Spawn { launch } => {
                if let Err(e) = launch.check_under(&self.root) {
                    return Response::Error { message: e.0 };
                }
                match launch.spawn().await {
                    Ok((child, daemon)) => {
                        self.keep(child, daemon);
                        tracing::info!(pid = daemon.pid, pid_file = %launch.pid_file.display(), "MPS control daemon started");
                        Response::Spawned { daemon }
                    }
                    Err(e) => Response::Error { message: e.0 },
                }
            }
            Request::Kill { pid } => {
                let known = self.lock().get(&pid).copied();
                match known {
                    Some(daemon) => {
                        let running = daemon.alive();
                        daemon.kill();
                        Response::Killed { pid, running }
                    }
                    None => Response::Error {
                        message: format!(
                            "pid {pid} is no daemon of this MPS host (its daemons: {:?})",
                            self.lock().keys().collect::<Vec<_>>()
                        ),
                    },
                }
            }
            Request::List => Response::Daemons {
                daemons: self.lock().values().copied().collect(),
            },
        }
    }

    /// Keeps the child until it exits, then reaps it and forgets it.
    fn keep(&self, mut child: tokio::process::Child, daemon: DaemonProcess) {
        self.lock().insert(daemon.pid, daemon);
        let children = self.children.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            children
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&daemon.pid);
            tracing::info!(pid = daemon.pid, status = ?status, "MPS control daemon exited, reaped");
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, DaemonProcess>> {
        self.children.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mps::host::{HostClient, socket_path};
    use crate::mps::launch::Launch;

    /// A host serving `dir` until the returned sender is dropped.
    async fn host(dir: &Path) -> (HostClient, tokio::sync::oneshot::Sender<()>) {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let h = Host::new(dir);
        tokio::spawn(async move {
            h.serve(async {
                let _ = rx.await;
            })
            .await
            .unwrap();
        });
        let client = HostClient::new(socket_path(dir));
        for _ in 0..100 {
            if socket_path(dir).exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        (client, tx)
    }

    /// `sleep 30` as a daemon of directory `id` (made here).
    fn sleeper(dir: &Path, id: &str) -> Launch {
        let d = dir.join("mps").join(id);
        std::fs::create_dir_all(d.join("log")).unwrap();
        Launch {
            program: PathBuf::from("sleep"),
            args: vec!["30".to_string()],
            env: vec![],
            output: d.join("log/daemon.out"),
            pid_file: d.join("daemon.pid"),
            control_socket: d.join("pipe/control"),
            shm_over_dev_shm: None,
        }
    }

    #[tokio::test]
    async fn the_host_spawns_lists_kills_and_reaps_its_daemons() {
        let dir = tempfile::tempdir().unwrap();
        let (client, _stop) = host(dir.path()).await;
        let mode = std::fs::metadata(socket_path(dir.path()))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let l = sleeper(dir.path(), "a");
        let d = client.spawn(&l).await.unwrap();
        assert!(d.alive());
        let recorded = std::fs::read_to_string(&l.pid_file).unwrap();
        assert_eq!(recorded, format!("{} {}\n", d.pid, d.start));
        assert_eq!(client.list().await.unwrap(), vec![d]);
        assert!(client.kill(d.pid).await.unwrap(), "it ran");
        for _ in 0..200 {
            if client.list().await.unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(client.list().await.unwrap().is_empty(), "reaped");
        assert!(!d.alive(), "no zombie left: the host reaped it");
        let e = client.kill(d.pid).await.unwrap_err();
        assert!(e.0.contains("is no daemon of this MPS host"), "{e}");
    }

    #[tokio::test]
    async fn a_spawn_outside_the_state_dir_or_of_a_missing_program_fails_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let (client, _stop) = host(dir.path()).await;
        let mut l = sleeper(dir.path(), "a");
        l.pid_file = PathBuf::from("/etc/das.pid");
        let e = client.spawn(&l).await.unwrap_err();
        assert!(
            e.0.contains("pidFile /etc/das.pid is not a path under"),
            "{e}"
        );
        let mut l = sleeper(dir.path(), "b");
        l.program = PathBuf::from("/nonexistent/mps-control");
        let e = client.spawn(&l).await.unwrap_err();
        assert!(
            e.0.contains("run /nonexistent/mps-control for the MPS control daemon"),
            "{e}"
        );
        assert!(client.list().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_client_that_leaves_mid_request_does_not_stop_the_host() {
        let dir = tempfile::tempdir().unwrap();
        let (client, _stop) = host(dir.path()).await;
        // Half a request, then gone.
        let mut s = UnixStream::connect(socket_path(dir.path())).await.unwrap();
        s.write_all(br#"{"op": "spawn", "launch": {"prog"#)
            .await
            .unwrap();
        drop(s);
        // A whole spawn whose client leaves before the answer: the daemon runs all the same.
        let l = sleeper(dir.path(), "a");
        let mut s = UnixStream::connect(socket_path(dir.path())).await.unwrap();
        s.write_all(&protocol::encode(&Request::Spawn { launch: l.clone() }))
            .await
            .unwrap();
        s.shutdown().await.unwrap();
        drop(s);
        let mut listed = Vec::new();
        for _ in 0..200 {
            listed = client.list().await.unwrap();
            if !listed.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(listed.len(), 1, "the spawn completed");
        assert!(std::fs::read_to_string(&l.pid_file).is_ok());
        client.kill(listed[0].pid).await.unwrap();
    }

    #[tokio::test]
    async fn a_second_host_on_the_same_state_dir_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (_client, _stop) = host(dir.path()).await;
        let e = Host::new(dir.path())
            .serve(std::future::pending())
            .await
            .unwrap_err();
        assert!(e.0.contains("another MPS host listens on"), "{e}");
    }
}
