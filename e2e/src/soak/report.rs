//! What a soak did and found ([`SoakReport`]), and the report as Markdown for
//! docs/reliability.md.

use std::collections::BTreeMap;
use std::time::Duration;

use super::SoakConfig;

/// What a soak did and found.
#[derive(Clone, Debug, Default)]
pub struct SoakReport {
    /// Pod cycles run, by kind.
    pub cycles: BTreeMap<&'static str, usize>,
    /// Kills (SIGKILL and restart), by component.
    pub kills: BTreeMap<String, usize>,
    /// Emulated-GPU faults injected, by kind.
    pub faults: BTreeMap<&'static str, usize>,
    /// Force deletes of a pod right after its creation (during its prepare).
    pub force_deletes_during_prepare: usize,
    /// Creates the API server refused (the webhook was down: `failurePolicy: Fail`).
    pub refused_creates: usize,
    /// Pods that stayed Pending (no capacity) and were deleted.
    pub unschedulable: usize,
    /// Invariant violations found after the cluster converged (must be empty).
    pub violations: Vec<String>,
    /// Phases run, each ending in an invariant check.
    pub phases: usize,
    /// Time from the last chaos action of each phase to the invariants holding.
    pub converge: Vec<Duration>,
    /// Pod create → Running, under churn.
    pub create_to_running: Vec<Duration>,
    /// Wall time of the whole run.
    pub wall: Duration,
}

impl SoakReport {
    /// Total pod cycles.
    pub fn total_cycles(&self) -> usize {
        self.cycles.values().sum()
    }

    /// The report as Markdown.
    pub fn markdown(&self, cfg: &SoakConfig) -> String {
        let pct = |v: &[Duration], q: f64| {
            let mut v = v.to_vec();
            v.sort();
            v.get(((v.len().max(1) - 1) as f64 * q).round() as usize)
                .map_or(0.0, Duration::as_secs_f64)
        };
        let list = |m: &BTreeMap<String, usize>| {
            m.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let faults: BTreeMap<String, usize> = self
            .faults
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        let cycles: BTreeMap<String, usize> = self
            .cycles
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        let mut out = String::new();
        out.push_str(&format!(
            "| seed | {} |\n|---|---|\n| pod cycles | {} ({}) |\n| concurrency | {} |\n",
            cfg.seed,
            self.total_cycles(),
            list(&cycles),
            cfg.concurrency
        ));
        out.push_str(&format!(
            "| kills (SIGKILL + restart) | {} ({}) |\n",
            self.kills.values().sum::<usize>(),
            list(&self.kills)
        ));
        out.push_str(&format!(
            "| faults injected | {} ({}) |\n",
            self.faults.values().sum::<usize>(),
            list(&faults)
        ));
        out.push_str(&format!(
            "| force deletes during prepare | {} |\n| creates refused (webhook down) | {} |\n| pods left Pending (no capacity) and deleted | {} |\n",
            self.force_deletes_during_prepare, self.refused_creates, self.unschedulable
        ));
        out.push_str(&format!(
            "| invariant checks | {} phases |\n| **invariant violations** | **{}** |\n",
            self.phases,
            self.violations.len()
        ));
        out.push_str(&format!(
            "| converge after the last chaos action (p50 / max) | {:.1} s / {:.1} s |\n",
            pct(&self.converge, 0.5),
            pct(&self.converge, 1.0)
        ));
        out.push_str(&format!(
            "| pod create → Running under churn (p50 / p99, {} pods) | {:.2} s / {:.2} s |\n",
            self.create_to_running.len(),
            pct(&self.create_to_running, 0.5),
            pct(&self.create_to_running, 0.99)
        ));
        out.push_str(&format!(
            "| wall time | {:.0} s |\n",
            self.wall.as_secs_f64()
        ));
        out
    }
}
