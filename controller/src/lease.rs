//! Leader election on a `coordination.k8s.io/v1` Lease, the protocol of client-go's
//! `leaderelection` package (<https://pkg.go.dev/k8s.io/client-go/tools/leaderelection>):
//! the holder renews `spec.renewTime` every `renew_every`; another replica takes the lease over
//! once `renewTime + leaseDurationSeconds` has passed. Writes carry the read `resourceVersion`,
//! so of two replicas racing for an expired lease exactly one wins (the other gets 409 Conflict).
//!
//! Like client-go, expiry is judged against this replica's clock; replicas on one cluster are
//! assumed to have clocks within a fraction of the lease duration.
//!
//! Start-up order in types: only [`Elector::acquire`] makes a [`Leadership`] (its field is
//! private), and the controller's [`Role`], which its watches and its run require, is either
//! that leadership or [`Role::Single`], the explicit choice of running without election. So
//! the controller cannot start writing before it leads, and a leader's renewals and release go
//! through the value that proves it leads.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::PostParams;

use crate::error::{Error, Result};

/// Settings of one elector.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// Lease name.
    pub name: String,
    /// This replica's identity (holder identity when leading).
    pub identity: String,
    /// How long a lease stays valid after its last renewal.
    pub duration: Duration,
    /// How often the holder renews, and how often a candidate retries.
    pub renew_every: Duration,
    /// How long the holder keeps leading without a successful renewal (client-go's
    /// `RenewDeadline`): shorter than [`Self::duration`], so a leader whose API calls stall steps
    /// down before its lease can expire and another replica take over. Every lease call is also
    /// bounded by it.
    pub renew_deadline: Duration,
}

impl LeaseConfig {
    /// client-go's proportions: renew every third of the lease, give up after two thirds.
    pub fn for_duration(name: &str, identity: &str, duration: Duration) -> Self {
        Self {
            name: name.into(),
            identity: identity.into(),
            duration,
            renew_every: duration / 3,
            renew_deadline: duration * 2 / 3,
        }
    }
}

/// What a replica may do with the lease as it finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// We hold it: renew.
    Renew,
    /// Free or expired: take it over.
    TakeOver,
    /// Another replica holds a valid lease.
    HeldByOther,
}

/// Pure decision from the lease's spec (docs/design.md §6: one writer at a time).
pub fn decide(spec: Option<&LeaseSpec>, identity: &str, now: Timestamp) -> Decision {
    let Some(spec) = spec else {
        return Decision::TakeOver;
    };
    let holder = spec.holder_identity.as_deref().unwrap_or("");
    if holder == identity {
        return Decision::Renew;
    }
    if holder.is_empty() {
        return Decision::TakeOver;
    }
    let secs = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    let expired = spec
        .renew_time
        .as_ref()
        .is_none_or(|t| t.0 + SignedDuration::from_secs(secs) < now);
    if expired {
        Decision::TakeOver
    } else {
        Decision::HeldByOther
    }
}

/// What a failed election round is reported to: the error's metric label.
type ErrorCounter = Box<dyn Fn(&'static str) + Send + Sync>;

/// A candidate for leadership.
pub struct Elector {
    api: Api<Lease>,
    cfg: LeaseConfig,
    count_error: Option<ErrorCounter>,
}

impl Elector {
    /// An elector for lease `cfg.name` through `api` (namespaced).
    pub fn new(api: Api<Lease>, cfg: LeaseConfig) -> Self {
        Self {
            api,
            cfg,
            count_error: None,
        }
    }

    /// Reports each failed round (acquire, renew, release) to `count` with the error's
    /// [`Error::metric_label`] (`lease`, `lease_timeout`), as well as logging it: the binary
    /// counts them in `das_controller_errors_total{cause}`.
    pub fn counting_errors(mut self, count: impl Fn(&'static str) + Send + Sync + 'static) -> Self {
        self.count_error = Some(Box::new(count));
        self
    }

    fn failed(&self, e: &Error) {
        if let Some(count) = &self.count_error {
            count(e.metric_label());
        }
    }

    /// The settings.
    pub fn config(&self) -> &LeaseConfig {
        &self.cfg
    }

    fn spec(&self, now: Timestamp, acquired: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.cfg.identity.clone()),
            lease_duration_seconds: Some(self.cfg.duration.as_secs().max(1) as i32),
            acquire_time: acquired.or(Some(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// One round: creates, renews or takes over the lease. `Ok(true)` while we lead; a 409
    /// Conflict (another replica won the race) is `Ok(false)`.
    async fn try_acquire_or_renew(&self) -> Result<bool> {
        let now = Timestamp::now();
        let pp = PostParams::default();
        let Some(mut lease) = self
            .api
            .get_opt(&self.cfg.name)
            .await
            .map_err(Error::Lease)?
        else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.cfg.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(now, None, 0)),
            };
            return conflict_is_false(self.api.create(&pp, &lease).await);
        };
        let spec = lease.spec.as_ref();
        let transitions = spec.and_then(|s| s.lease_transitions).unwrap_or(0);
        lease.spec = Some(match decide(spec, &self.cfg.identity, now) {
            Decision::HeldByOther => return Ok(false),
            Decision::Renew => {
                self.spec(now, spec.and_then(|s| s.acquire_time.clone()), transitions)
            }
            Decision::TakeOver => self.spec(now, None, transitions + 1),
        });
        conflict_is_false(self.api.replace(&self.cfg.name, &pp, &lease).await)
    }

    /// Gives the lease up (clears the holder) so a standby takes over at once; best effort.
    /// Reached through [`Leadership::release`].
    async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.cfg.name).await else {
            return;
        };
        let Some(spec) = lease.spec.as_mut() else {
            return;
        };
        if spec.holder_identity.as_deref() != Some(&self.cfg.identity) {
            return;
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        spec.acquire_time = None;
        match self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => tracing::info!(lease = %self.cfg.name, "released the leader lease"),
            Err(e) => {
                let e = Error::Lease(e);
                self.failed(&e);
                tracing::warn!(error = %e, "could not release the leader lease");
            }
        }
    }

    /// [`Self::try_acquire_or_renew`], bounded by the renew deadline (a stalled call is an
    /// error, not a wait).
    async fn bounded_round(&self) -> Result<bool> {
        tokio::time::timeout(self.cfg.renew_deadline, self.try_acquire_or_renew())
            .await
            .map_err(|_| Error::LeaseTimeout(self.cfg.renew_deadline))?
    }

    /// Waits until this replica leads (retrying every `renew_every`) and returns the proof,
    /// the one way to get a [`Leadership`]. Dropping the future stops the candidacy.
    pub async fn acquire(self) -> Leadership {
        loop {
            match self.bounded_round().await {
                Ok(true) => {
                    tracing::info!(identity = %self.cfg.identity, lease = %self.cfg.name, "became leader");
                    return Leadership {
                        elector: Box::new(self),
                    };
                }
                Ok(false) => tracing::debug!("lease held by another replica"),
                Err(e) => {
                    self.failed(&e);
                    tracing::warn!(error = %e, "leader election");
                }
            }
            tokio::time::sleep(self.cfg.renew_every).await;
        }
    }

    /// Renews until leadership is lost: returns when another replica holds the lease or no
    /// renewal succeeded within the renew deadline (each call is bounded by it too), which is
    /// before the lease expires for the other replicas. Reached through [`Leadership::keep`].
    async fn keep(&self) {
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.cfg.renew_every).await;
            match self.bounded_round().await {
                Ok(true) => last_ok = tokio::time::Instant::now(),
                Ok(false) => {
                    tracing::error!("leader lease taken by another replica");
                    return;
                }
                Err(e) => {
                    self.failed(&e);
                    tracing::warn!(error = %e, "renewing the leader lease");
                }
            }
            if last_ok.elapsed() >= self.cfg.renew_deadline {
                tracing::error!(deadline = ?self.cfg.renew_deadline,
                    "could not renew the leader lease within the renew deadline: stepping down");
                return;
            }
        }
    }
}

/// Proof that this replica acquired the leader lease: made only by [`Elector::acquire`]. It
/// keeps the lease ([`Self::keep`]) and gives it up ([`Self::release`], which consumes it).
///
/// ```compile_fail,E0451
/// use das_controller::lease::{Elector, Leadership};
/// // Leading without acquiring the lease does not compile: the field is private.
/// fn lead(e: Elector) -> Leadership {
///     Leadership { elector: Box::new(e) }
/// }
/// ```
pub struct Leadership {
    /// Boxed: a [`Role`] is either this or nothing.
    elector: Box<Elector>,
}

impl Leadership {
    /// Renews the lease every `renew_every`; returns once leadership is lost (another replica
    /// holds the lease, or no renewal succeeded within the renew deadline).
    pub async fn keep(&self) {
        self.elector.keep().await
    }

    /// Gives the lease up so a standby takes over at once; best effort.
    pub async fn release(self) {
        self.elector.release().await
    }

    /// The settings of the lease held.
    pub fn config(&self) -> &LeaseConfig {
        self.elector.config()
    }
}

/// Whether, and by what right, this replica runs the controller: the watches and the run of
/// `crate::controller` require one.
pub enum Role {
    /// Elected: holds the leader lease (`--leader-elect`, the default).
    Leading(Leadership),
    /// The only replica, without election (`--leader-elect=false`).
    Single,
}

impl Role {
    /// Resolves when this replica must stop writing: leadership lost. A [`Role::Single`]
    /// never loses its role.
    pub async fn lost(&self) {
        match self {
            Self::Leading(l) => l.keep().await,
            Self::Single => std::future::pending().await,
        }
    }

    /// Steps down after a clean stop: the leader releases the lease for a standby to take over
    /// at once (best effort); a single replica has nothing to give up.
    pub async fn release(self) {
        if let Self::Leading(l) = self {
            l.release().await
        }
    }
}

fn conflict_is_false(r: Result<Lease, kube::Error>) -> Result<bool> {
    match r {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(Error::Lease(e)),
    }
}

#[cfg(test)]
mod tests;
