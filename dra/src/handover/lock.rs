//! The node's locks: `plugin.lock`, held by the active instance ([`Active`]), and
//! `handover.wait`, on which a waiting instance holds a shared lock ([`Waiting`]). Both are
//! `flock(2)` locks (std's `File::lock`), dropped by the kernel when the process dies; the state
//! dir is `0700` and the files `0600` so that no other local user can hold them.

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The lock the active instance holds, in the state dir.
pub const LOCK_FILE: &str = "plugin.lock";
/// The file a waiting instance holds a shared lock on, in the state dir.
pub const WAIT_FILE: &str = "handover.wait";

/// Mode of the state dir: only its owner (root) may enter it.
pub const STATE_DIR_MODE: u32 = 0o700;
/// Mode of the lock files.
pub const LOCK_FILE_MODE: u32 = 0o600;

/// Makes `dir` (created if missing) enterable only by its owner.
///
/// # Errors
/// The directory cannot be created or its mode set.
pub fn restrict_state_dir(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(STATE_DIR_MODE))
}

fn open(dir: &Path, name: &str) -> io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(LOCK_FILE_MODE)
        .open(dir.join(name))?;
    // A file left by an older version may have a wider mode.
    file.set_permissions(std::fs::Permissions::from_mode(LOCK_FILE_MODE))?;
    Ok(file)
}

/// This process is the node's active plugin while this value lives. Made only by taking
/// `plugin.lock` ([`Active::try_acquire`], [`super::take_over`],
/// [`super::check_then_take_over`]); [`super::hand_over_when_asked`] consumes it.
///
/// ```compile_fail,E0451
/// use std::path::PathBuf;
/// use dra_plugin::handover::Active;
/// // Acting as the node's active instance without its lock does not compile: the fields are
/// // private.
/// fn active(file: std::fs::File, dir: PathBuf) -> Active {
///     Active { _lock: file, dir }
/// }
/// ```
#[derive(Debug)]
pub struct Active {
    _lock: File,
    dir: PathBuf,
}

impl Active {
    /// Takes `<dir>/plugin.lock` if it is free (`Ok(None)` when another instance holds it).
    ///
    /// # Errors
    /// The lock file cannot be created or locked.
    pub fn try_acquire(dir: &Path) -> io::Result<Option<Self>> {
        let lock = open(dir, LOCK_FILE)?;
        match lock.try_lock() {
            Ok(()) => Ok(Some(Self {
                _lock: lock,
                dir: dir.to_path_buf(),
            })),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(e)) => Err(e),
        }
    }

    /// The state dir this instance holds.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether another instance waits to take over (holds a lock on `handover.wait`).
    pub fn handover_requested(&self) -> bool {
        let Ok(wait) = File::open(self.dir.join(WAIT_FILE)) else {
            return false;
        };
        match wait.try_lock() {
            Ok(()) => {
                let _ = wait.unlock();
                false
            }
            Err(TryLockError::WouldBlock) => true,
            Err(TryLockError::Error(_)) => false,
        }
    }
}

/// A waiting instance's announcement (a shared lock on `<dir>/handover.wait`), held while it
/// waits for `plugin.lock`.
#[derive(Debug)]
pub struct Waiting {
    _wait: File,
}

impl Waiting {
    /// Announces that this instance waits to take over.
    ///
    /// # Errors
    /// The wait file cannot be created or locked.
    pub fn announce(dir: &Path) -> io::Result<Self> {
        let wait = open(dir, WAIT_FILE)?;
        wait.lock_shared()?;
        Ok(Self { _wait: wait })
    }
}
