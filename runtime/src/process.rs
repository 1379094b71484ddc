//! Start and end of a DAS binary: logging installed before anything else runs (a bad filter
//! exits 2, like any bad flag), the error chain logged and turned into the exit status, and the
//! shutdown signals (SIGTERM from the kubelet or the Deployment controller, SIGINT from a terminal).

use std::process::ExitCode;

use anyhow::{Context, Result};
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::logging::{self, LogArgs};

/// Installs logging for `log`; on a bad filter prints `<program>: <why>` to stderr and returns
/// the exit status 2 (as clap does for bad flags) for `main` to return.
///
/// # Errors
/// The exit status to end the process with.
pub fn start(program: &str, log: &LogArgs) -> Result<(), ExitCode> {
    logging::init(log).map_err(|e| {
        eprintln!("{program}: {e:#}");
        ExitCode::from(2)
    })
}

/// The exit status of a run: its own on success, 1 with the error chain logged on failure
/// (each cause once: [`crate::errors::chain`]).
pub fn exit_status(result: Result<ExitCode>) -> ExitCode {
    result.unwrap_or_else(|e| {
        let chain: &(dyn std::error::Error + 'static) = e.as_ref();
        tracing::error!("{}", crate::errors::chain(chain));
        ExitCode::FAILURE
    })
}

/// SIGTERM and SIGINT, listened for from creation: a signal that arrives while the program is
/// still starting is kept and ends the next [`Shutdown::wait`] at once.
pub struct Shutdown {
    term: Signal,
    int: Signal,
}

impl Shutdown {
    /// Starts listening (inside a tokio runtime).
    ///
    /// # Errors
    /// A signal handler cannot be installed.
    pub fn listen() -> Result<Self> {
        Ok(Self {
            term: signal(SignalKind::terminate()).context("SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("SIGINT handler")?,
        })
    }

    /// Resolves on the next SIGTERM or SIGINT, and logs which.
    pub async fn wait(&mut self) {
        tokio::select! {
            _ = self.term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = self.int.recv() => tracing::info!("SIGINT: shutting down"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_signal_sent_before_waiting_is_kept() {
        let mut s = Shutdown::listen().unwrap();
        // SAFETY: raise only sends SIGINT to this process, whose handler `listen` installed.
        unsafe { libc::raise(libc::SIGINT) };
        tokio::time::timeout(std::time::Duration::from_secs(5), s.wait())
            .await
            .expect("the early SIGINT ends the wait");
    }
}
