//! The plugin's side of the MPS host ([`super::server`]): one connection per request.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use super::protocol::{self, MAX_MESSAGE, Request, Response};
use crate::mps::daemon::{DaemonProcess, MpsError};
use crate::mps::launch::Launch;

/// How long one request may take, connection to answer (a spawn answers once the process runs
/// and its pid file is written: milliseconds; docs/benchmarks.md, "MPS host").
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The MPS host at a socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostClient {
    socket: PathBuf,
}

impl HostClient {
    /// The host listening on `socket` (`--mps-host-socket`).
    pub fn new(socket: PathBuf) -> Self {
        Self { socket }
    }

    /// Its socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Sends `request`, returns the answer (an [`Response::Error`] included).
    ///
    /// # Errors
    /// The host could not be reached, answered nothing valid, or not within
    /// [`REQUEST_TIMEOUT`]; the text names the socket and what runs the host.
    pub async fn request(&self, request: &Request) -> Result<Response, MpsError> {
        let exchange = async {
            let mut s = UnixStream::connect(&self.socket).await?;
            s.write_all(&protocol::encode(request)).await?;
            s.shutdown().await?;
            let mut buf = Vec::new();
            (&mut s)
                .take(MAX_MESSAGE as u64 + 1)
                .read_to_end(&mut buf)
                .await?;
            Ok::<_, std::io::Error>(buf)
        };
        let unreachable = |why: String| {
            MpsError(format!(
                "the MPS host at {} {why} (it is the das-mps-host pod of this node, chart mps.host.enabled; --mps-host-socket names its socket)",
                self.socket.display()
            ))
        };
        let buf = tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| {
                unreachable(format!(
                    "did not answer within {} s",
                    REQUEST_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|e| unreachable(format!("could not be reached: {e}")))?;
        protocol::decode_response(&buf).map_err(unreachable)
    }

    /// Has the host start the daemon `launch` describes; returns its process.
    ///
    /// # Errors
    /// The host is unreachable or could not start it (its reason).
    pub async fn spawn(&self, launch: &Launch) -> Result<DaemonProcess, MpsError> {
        match self
            .request(&Request::Spawn {
                launch: launch.clone(),
            })
            .await?
        {
            Response::Spawned { daemon } => Ok(daemon),
            other => Err(self.unexpected("spawn", other)),
        }
    }

    /// Has the host kill its daemon `pid`'s group; returns whether it still ran.
    ///
    /// # Errors
    /// The host is unreachable, or `pid` is none of its daemons.
    pub async fn kill(&self, pid: u32) -> Result<bool, MpsError> {
        match self.request(&Request::Kill { pid }).await? {
            Response::Killed { running, .. } => Ok(running),
            other => Err(self.unexpected("kill", other)),
        }
    }

    /// The host's live daemons.
    ///
    /// # Errors
    /// The host is unreachable.
    pub async fn list(&self) -> Result<Vec<DaemonProcess>, MpsError> {
        match self.request(&Request::List).await? {
            Response::Daemons { daemons } => Ok(daemons),
            other => Err(self.unexpected("list", other)),
        }
    }

    fn unexpected(&self, op: &str, answer: Response) -> MpsError {
        match answer {
            Response::Error { message } => MpsError(format!(
                "the MPS host at {} refused {op}: {message}",
                self.socket.display()
            )),
            other => MpsError(format!(
                "the MPS host at {} answered {op} with {other:?}",
                self.socket.display()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_absent_host_is_named_with_what_runs_it() {
        let dir = tempfile::tempdir().unwrap();
        let c = HostClient::new(dir.path().join("mps/host.sock"));
        let e = c.list().await.unwrap_err();
        assert!(e.0.contains("/mps/host.sock could not be reached"), "{e}");
        assert!(e.0.contains("das-mps-host pod"), "{e}");
    }
}
