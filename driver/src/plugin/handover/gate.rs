//! The gate in front of the request path: [`Gate`] lets prepares and unprepares through until
//! the instance hands over, then waits for the ones in flight; [`Gated`] is the
//! [`ClaimHandler`] behind it that the gRPC server calls.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedRwLockReadGuard, RwLock};

use crate::claims::{ClaimHandler, ClaimRef, PrepareError, PreparedDevice};

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

/// A [`ClaimHandler`] behind a [`Gate`]: once the gate is closed every claim gets
/// [`PrepareError::HandedOver`].
pub struct Gated {
    /// The request path the calls reach while the gate is open.
    pub inner: Arc<dyn ClaimHandler>,
    /// The gate, shared with [`super::hand_over_when_asked`], which closes it.
    pub gate: Arc<Gate>,
}

fn refuse<T>(claims: &[ClaimRef]) -> HashMap<String, Result<T, PrepareError>> {
    claims
        .iter()
        .map(|c| (c.uid.clone(), Err(PrepareError::HandedOver)))
        .collect()
}

impl Gated {
    /// Runs `work` in a task of its own that holds the gate's pass: when the kubelet cancels the
    /// call (a timeout), tonic drops our future, but the work (GPU calls, checkpoint writes)
    /// still finishes before the gate can close and the node be handed over.
    async fn run<T, F>(
        &self,
        claims: &[ClaimRef],
        work: F,
    ) -> HashMap<String, Result<T, PrepareError>>
    where
        T: Send + 'static,
        F: std::future::Future<Output = HashMap<String, Result<T, PrepareError>>> + Send + 'static,
    {
        let Some(pass) = self.gate.enter().await else {
            return refuse(claims);
        };
        let task = tokio::spawn(async move {
            let _pass = pass;
            work.await
        });
        match task.await {
            Ok(results) => results,
            Err(e) => claims
                .iter()
                .map(|c| {
                    (
                        c.uid.clone(),
                        Err(PrepareError::Internal(format!("the call failed: {e}"))),
                    )
                })
                .collect(),
        }
    }
}

#[tonic::async_trait]
impl ClaimHandler for Gated {
    async fn prepare(
        &self,
        claims: Vec<ClaimRef>,
    ) -> HashMap<String, Result<Vec<PreparedDevice>, PrepareError>> {
        let inner = self.inner.clone();
        let ids = claims.clone();
        self.run(&ids, async move { inner.prepare(claims).await })
            .await
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> HashMap<String, Result<(), PrepareError>> {
        let inner = self.inner.clone();
        let ids = claims.clone();
        self.run(&ids, async move { inner.unprepare(claims).await })
            .await
    }
}
