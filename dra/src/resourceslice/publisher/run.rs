//! [`Publisher::run`]: the loop that keeps the pool published, from desired specs or, with
//! [`Publisher::run_with`], from whatever the driver turns into specs (its health
//! monitor's facts, say).

use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::resource::v1::{ResourceSlice, ResourceSliceSpec};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{PublishStats, Publisher};

/// Timers of [`Publisher::run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunConfig {
    /// Delay between a foreign change of the pool's slices and the republish; changes in that
    /// window are coalesced (upstream waits 30 s; this publisher republishes sooner because a
    /// missing slice makes the whole pool unallocatable).
    pub debounce: Duration,
    /// Republish at least this often, even without events.
    pub resync: Duration,
    /// First retry delay after a failed publish; doubles up to `max_backoff`.
    pub min_backoff: Duration,
    /// Longest retry delay.
    pub max_backoff: Duration,
}

impl Default for RunConfig {
    /// 1 s debounce, 5 min resync, retries from 1 s to 60 s.
    fn default() -> Self {
        Self {
            debounce: Duration::from_secs(1),
            resync: Duration::from_secs(300),
            min_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
        }
    }
}

impl Publisher {
    /// The watch of this node's slices ([`Self::field_selector`]); without a watch client, a
    /// stream that never yields.
    fn watch(&self) -> BoxStream<'static, Result<Event<ResourceSlice>, watcher::Error>> {
        match &self.watch_api {
            Some(api) => {
                let wc = watcher::Config::default().fields(&self.field_selector());
                watcher::watcher(api.clone(), wc).default_backoff().boxed()
            }
            None => futures::stream::pending().boxed(),
        }
    }

    /// Whether a watch event is someone else's doing (not the result of our last publish).
    fn is_foreign(&self, event: &Event<ResourceSlice>) -> bool {
        let id = |s: &ResourceSlice| {
            (
                s.metadata.name.clone().unwrap_or_default(),
                s.metadata.resource_version.clone().unwrap_or_default(),
            )
        };
        match event {
            Event::Apply(s) | Event::InitApply(s) => {
                let (name, rv) = id(s);
                self.known.get(&name) != Some(&rv)
            }
            Event::Delete(s) => self.known.contains_key(&id(s).0),
            Event::Init => false,
            Event::InitDone => true,
        }
    }

    /// Publishes `desired` now and whenever it changes, when someone else changes or deletes
    /// this node's slices (watched with the [`Self::field_selector`], republished after
    /// `config.debounce`), and every `config.resync`. Failed publishes are logged and retried
    /// with exponential backoff. Returns the publisher when `shutdown` is cancelled; the slices
    /// stay published (a restarting plugin should not empty the pool).
    pub async fn run(
        self,
        desired: watch::Receiver<Vec<ResourceSliceSpec>>,
        shutdown: CancellationToken,
        config: RunConfig,
    ) -> Self {
        self.run_with(desired, Vec::clone, shutdown, config).await
    }

    /// [`Self::run`] publishing `desired(input)` for the latest `input`: for a driver whose
    /// desired slices follow from something else (the slices built from its inventory, with
    /// the taints its health monitor reports, say). `desired` is called
    /// once per publish, with the channel's value borrowed.
    pub async fn run_with<T: Send + Sync>(
        mut self,
        mut input: watch::Receiver<T>,
        desired: impl Fn(&T) -> Vec<ResourceSliceSpec> + Send,
        shutdown: CancellationToken,
        config: RunConfig,
    ) -> Self {
        let mut events = self.watch();
        let mut next = Instant::now();
        let mut backoff = config.min_backoff;
        let mut input_open = true;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return self,
                _ = tokio::time::sleep_until(next) => {
                    let specs = desired(&input.borrow_and_update());
                    next = match self.publish(specs).await {
                        Ok(stats) => {
                            log_publish(&self.pool.node, &stats);
                            backoff = config.min_backoff;
                            let resync = Instant::now() + config.resync;
                            // While the devices are withdrawn, the next probe may come sooner.
                            self.guard.next_probe().map_or(resync, |at| at.min(resync))
                        }
                        Err(e) => {
                            warn!(error = %e, retry_in = ?backoff, "publishing ResourceSlices failed");
                            let at = Instant::now() + backoff;
                            backoff = (backoff * 2).min(config.max_backoff);
                            at
                        }
                    };
                }
                changed = input.changed(), if input_open => match changed {
                    Ok(()) => next = Instant::now(),
                    Err(_) => input_open = false,
                },
                event = events.next() => match event {
                    Some(Ok(ev)) if self.is_foreign(&ev) => {
                        debug!(event = %event_kind(&ev), "foreign ResourceSlice change");
                        next = next.min(Instant::now() + config.debounce);
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => warn!(error = %e, "watching ResourceSlices"),
                    None => events = self.watch(),
                },
            }
        }
    }
}

fn log_publish(node: &str, stats: &PublishStats) {
    if stats.writes() > 0 {
        info!(
            node,
            generation = stats.generation,
            slices = stats.slice_count,
            created = stats.created,
            updated = stats.updated,
            deleted = stats.deleted,
            dropped_fields = stats.dropped_fields,
            withdrawn = stats.withdrawn,
            "published ResourceSlices"
        );
    } else {
        debug!(
            node,
            generation = stats.generation,
            slices = stats.slice_count,
            "ResourceSlices up to date"
        );
    }
}

fn event_kind(ev: &Event<ResourceSlice>) -> &'static str {
    match ev {
        Event::Apply(_) => "apply",
        Event::Delete(_) => "delete",
        Event::Init => "init",
        Event::InitApply(_) => "init-apply",
        Event::InitDone => "init-done",
    }
}
