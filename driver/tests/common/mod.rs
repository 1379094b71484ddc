//! What the MPS integration tests share: bounded waits and process checks on the daemons they
//! start (`mps_daemon.rs`, `mps_preparer.rs`, `mps_supervision.rs`).

#![allow(dead_code)] // each test file uses part of it

use std::time::{Duration, Instant};

/// The longest any wait of these tests takes.
pub const LIMIT: Duration = Duration::from_secs(20);

/// Waits until `f` gives something, at most [`LIMIT`].
pub async fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(t0.elapsed() < LIMIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether process `pid` runs (exists and is neither a zombie nor dead).
pub fn running(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit_once(')').map(|(_, r)| r.trim_start());
    state.is_some_and(|s| !s.starts_with('Z') && !s.starts_with('X'))
}

/// SIGKILL to `pid`, a process the test started.
pub fn sigkill(pid: u32) {
    // SAFETY: kill(2) on a process this test started.
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
    }
}
