//! The gate in front of the driver: [`Gate`] lets prepares and unprepares through until the
//! instance hands over, then waits for the ones in flight; [`Gated`] is the [`Driver`] behind it
//! that the gRPC server calls, and [`GateError`] what it answers for a claim the driver never
//! saw or did not finish.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedRwLockReadGuard, RwLock};

use crate::driver::{ClaimRef, Driver, PreparedDevice};

/// Why [`Gated`] answered a claim itself. A driver behind the gate turns it into its own error
/// (`D::Error: From<GateError>`), so that its texts and metrics stay its own.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    /// The gate is closed: this instance handed the node to a newer one (or is stopping). The
    /// kubelet retries, and reaches the newer instance.
    #[error("this plugin instance has handed over to a newer one on the node; the kubelet retries")]
    HandedOver,
    /// The task that ran the driver's call panicked or was cancelled (a bug in the driver).
    #[error("the call failed: {0}")]
    CallFailed(String),
}

/// Lets prepares and unprepares through until [`Gate::close`]; `close` waits for the ones in
/// flight.
#[derive(Debug, Default)]
pub struct Gate {
    closed: AtomicBool,
    in_flight: Arc<RwLock<()>>,
}

impl Gate {
    /// A pass for one call, or `None` once the gate is closed. The pass is owned, so the work it
    /// covers can run in a task of its own (see [`Gated`]).
    pub async fn enter(&self) -> Option<OwnedRwLockReadGuard<()>> {
        if self.closed.load(Ordering::SeqCst) {
            return None;
        }
        let pass = self.in_flight.clone().read_owned().await;
        // Closed while we waited behind `close`: the state is no longer ours.
        (!self.closed.load(Ordering::SeqCst)).then_some(pass)
    }

    /// Refuses new calls and returns once every call in flight has finished.
    pub async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        drop(self.in_flight.write().await);
    }

    /// [`Self::close`], waiting at most `limit`; `false` when calls were still running then
    /// (the gate stays closed).
    pub async fn close_within(&self, limit: Duration) -> bool {
        tokio::time::timeout(limit, self.close()).await.is_ok()
    }

    /// Whether the gate refuses new calls (closing or closed).
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

/// A [`Driver`] behind a [`Gate`]: once the gate is closed every claim gets
/// [`GateError::HandedOver`], converted into the driver's error.
pub struct Gated<D: ?Sized> {
    /// The driver the calls reach while the gate is open.
    pub inner: Arc<D>,
    /// The gate, shared with [`super::hand_over_when_asked`], which closes it.
    pub gate: Arc<Gate>,
}

/// Every claim's answer when the gate said `why`.
fn answer_all<T, E: From<GateError>>(
    claims: &[ClaimRef],
    why: &GateError,
) -> HashMap<String, Result<T, E>> {
    claims
        .iter()
        .map(|c| (c.uid.clone(), Err(E::from(why.clone()))))
        .collect()
}

impl<D> Gated<D>
where
    D: Driver + ?Sized,
    D::Error: From<GateError>,
{
    /// Runs `work` in a task of its own that holds the gate's pass: when the kubelet cancels the
    /// call (a timeout), tonic drops our future, but the work (device calls, record writes)
    /// still finishes before the gate can close and the node be handed over.
    async fn run<T, F>(&self, claims: &[ClaimRef], work: F) -> HashMap<String, Result<T, D::Error>>
    where
        T: Send + 'static,
        F: std::future::Future<Output = HashMap<String, Result<T, D::Error>>> + Send + 'static,
    {
        let Some(pass) = self.gate.enter().await else {
            return answer_all(claims, &GateError::HandedOver);
        };
        let task = tokio::spawn(async move {
            let _pass = pass;
            work.await
        });
        match task.await {
            Ok(results) => results,
            Err(e) => answer_all(claims, &GateError::CallFailed(e.to_string())),
        }
    }
}

#[tonic::async_trait]
impl<D> Driver for Gated<D>
where
    D: Driver + ?Sized,
    D::Error: From<GateError>,
{
    type Error = D::Error;

    async fn prepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> HashMap<String, Result<Vec<PreparedDevice>, D::Error>> {
        let inner = self.inner.clone();
        let ids = claims.clone();
        self.run(&ids, async move { inner.prepare(claims).await })
            .await
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> HashMap<String, Result<(), D::Error>> {
        let inner = self.inner.clone();
        let ids = claims.clone();
        self.run(&ids, async move { inner.unprepare(claims).await })
            .await
    }
}
