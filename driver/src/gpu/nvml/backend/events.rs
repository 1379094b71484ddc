//! GPU health events through NVML's event set: registration of each GPU at start-up, and the
//! wait that turns raw events into [`HealthEvent`]s.

use std::time::Duration;

use super::{NvmlBackend, other};
use crate::gpu::nvml::{NvmlApi, RawEvent, code, event};
use crate::gpu::{BackendError, HealthEvent, Target};

impl<A: NvmlApi> NvmlBackend<A> {
    /// `nvmlEventSetWait_v2` for the first event (at most `timeout`), then whatever else is
    /// already queued, up to [`EVENT_BATCH`]. Every GPU an event names has its cached instance
    /// list marked stale.
    pub(super) fn wait_events(&self, timeout: Duration) -> Result<Vec<HealthEvent>, BackendError> {
        let ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        let mut events = Vec::new();
        let mut wait = ms;
        while events.len() < EVENT_BATCH {
            match self.api.wait_event(wait) {
                Ok(e) => {
                    let event = health_event(e);
                    if let Some(ev) = &event {
                        // The GPU's instances may have changed outside DAS (a reset, a GI
                        // torn down): its cached list is read again.
                        self.invalidate(ev.gpu(), &format_args!("health event {ev:?}"));
                    }
                    events.extend(event);
                }
                Err(e) if e.code == code::TIMEOUT => break,
                Err(e) if events.is_empty() => {
                    return Err(other(Target::gpu(0), &e, "waiting for GPU health events"));
                }
                Err(_) => break,
            }
            wait = 0;
        }
        Ok(events)
    }
}

/// Registers GPU `dev` for the events the health monitor watches, each type on its own so a
/// GPU that lacks one (`NOT_SUPPORTED`, e.g. ECC off) still reports the others. A failure is
/// logged: the GPU then reports its health through the inventory only.
pub(super) fn register_health_events<A: NvmlApi>(api: &A, dev: u32) {
    for (mask, what) in [
        (event::XID_CRITICAL_ERROR, "XID errors"),
        (event::DOUBLE_BIT_ECC_ERROR, "uncorrectable ECC errors"),
    ] {
        if let Err(e) = api.register_events(dev, mask) {
            tracing::warn!(gpu = dev, error = %e, "cannot watch the GPU for {what}");
        }
    }
}

/// The health event of a raw NVML event; `None` for events about no GPU of ours or of types
/// the monitor does not watch.
fn health_event(e: RawEvent) -> Option<HealthEvent> {
    let gpu = e.dev?;
    if e.event_type & event::XID_CRITICAL_ERROR != 0 {
        return Some(HealthEvent::Xid {
            gpu,
            // `eventData` holds the XID (999 when NVML does not know it).
            xid: u32::try_from(e.data).unwrap_or(u32::MAX),
            gpu_instance: e.gpu_instance,
        });
    }
    (e.event_type & event::DOUBLE_BIT_ECC_ERROR != 0)
        .then_some(HealthEvent::UncorrectableEcc { gpu })
}

/// Most events taken in one call after the first (the rest wait for the next call).
const EVENT_BATCH: usize = 64;
