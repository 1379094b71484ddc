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

/// Whether the tests run as root (mounting a tmpfs needs it).
pub fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The shm of the daemons these tests start: a 4 MiB tmpfs, as the plugin mounts one, when the
/// tests run as root; else a plain directory (`--mps-shm-size=0`), so they still run without
/// privileges (`mps_shm.rs` checks the tmpfs itself, and needs root).
pub fn test_shm() -> das_driver::mps::Shm {
    if root() {
        das_driver::mps::Shm::Tmpfs {
            size_bytes: 4 << 20,
        }
    } else {
        das_driver::mps::Shm::Directory
    }
}

/// Unmounts (lazily) every mount below its directory when dropped: a test that ends with a
/// daemon's tmpfs still mounted (a daemon a restarted "plugin" adopted and never stopped)
/// leaves nothing mounted in the host's mount table. Declare it before the directory's
/// `TempDir`, which is removed after it.
pub struct UnmountBelow(pub std::path::PathBuf);

impl Drop for UnmountBelow {
    fn drop(&mut self) {
        let Ok(dir) = std::fs::canonicalize(&self.0) else {
            return;
        };
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut below: Vec<std::path::PathBuf> = das_driver::mps::shm::parse_mountinfo(&text)
            .into_iter()
            .map(|e| e.mount_point)
            .filter(|m| m.starts_with(&dir))
            .collect();
        // Deepest first.
        below.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
        for m in below {
            let _ = rustix::mount::unmount(&m, rustix::mount::UnmountFlags::DETACH);
        }
    }
}
