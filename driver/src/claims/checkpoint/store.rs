//! The checkpoint file: loading it (an upgrade, a new boot or a corrupt file are outcomes, not
//! errors), saving it atomically, the boot ID it belongs to, and [`CheckpointStore`], the
//! checkpoint the request path reads, changes and persists (see [`super`] for why writes are not
//! fsynced).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use das_runtime::fs::write_atomically;

use super::format::{Checkpoint, CorruptReason, parse, unix_now};

/// Default file name of the checkpoint in the plugin's state directory.
pub const CHECKPOINT_FILE_NAME: &str = "checkpoint.json";

/// Where Linux exposes the ID of the current boot (a UUID, new on every boot).
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// Errors that stop a load or save. Bad file *content* is not an error: see
/// [`LoadOutcome::Corrupt`].
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file operation failed (read, write, rename, create directory).
    #[error("checkpoint {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The checkpoint could not be serialized (not expected with these types).
    #[error("checkpoint cannot be serialized: {0}")]
    Serialize(#[from] serde_json::Error),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Result of [`Checkpoint::load`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadOutcome {
    /// The file was valid and from this boot (any version from 2 to [`super::CHECKPOINT_VERSION`]:
    /// one document type, of which each save writes the oldest version that holds it).
    Loaded(Checkpoint),
    /// The file was a valid version-1 document (the first release's shape) from this boot,
    /// upgraded in memory (the next save writes the current shape).
    Upgraded {
        /// The upgraded checkpoint.
        checkpoint: Checkpoint,
        /// The version the file had.
        from: u64,
    },
    /// There was no file: first start on this node (or the state dir was wiped).
    Fresh,
    /// The file was valid but written in an earlier boot: MIG instances and `/var/run/cdi` are
    /// gone, so the caller starts from [`Checkpoint::new`]. The old records, for logging.
    NewBoot {
        /// The checkpoint of the earlier boot.
        previous: Checkpoint,
    },
    /// The file was unreadable as a checkpoint and was moved aside; the caller rebuilds state
    /// from the backend and the API server.
    Corrupt {
        /// Where the file now is, `<path>.corrupt-<unix time>`.
        moved_to: PathBuf,
        /// What was wrong with it.
        reason: CorruptReason,
    },
}

impl Checkpoint {
    /// Loads the checkpoint at `path` for the current `boot_id` (see [`read_boot_id`]). Bad
    /// content is moved aside and reported, never returned as an error (see [`LoadOutcome`]).
    ///
    /// # Errors
    /// [`CheckpointError::Io`] when the file exists but cannot be read, or a corrupt file cannot
    /// be moved aside.
    pub fn load(path: &Path, boot_id: &str) -> Result<LoadOutcome, CheckpointError> {
        let bytes = match fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(LoadOutcome::Fresh),
            Err(e) => return Err(io_err(path)(e)),
        };
        match parse(&bytes) {
            Ok((cp, _)) if cp.boot_id != boot_id => Ok(LoadOutcome::NewBoot { previous: cp }),
            // Versions 2 to 9 are one document type: this binary writes the oldest that holds
            // the content, so an older version is no upgrade. Version 1 had another shape.
            Ok((checkpoint, from @ 1)) => Ok(LoadOutcome::Upgraded { checkpoint, from }),
            Ok((cp, _)) => Ok(LoadOutcome::Loaded(cp)),
            Err(reason) => {
                let moved_to = move_aside(path)?;
                Ok(LoadOutcome::Corrupt { moved_to, reason })
            }
        }
    }

    /// Writes the checkpoint to `path` atomically (temp file `.<name>.tmp` beside it, rename;
    /// no fsync, see [`super`]), creating the directory if needed. Saves of one file must
    /// not run concurrently (they share the temp file): keep one writer, e.g. behind a mutex.
    ///
    /// # Errors
    /// [`CheckpointError::Io`] when a file step fails; the old file is then left intact.
    pub fn save(&self, path: &Path) -> Result<(), CheckpointError> {
        let bytes = self.to_bytes()?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir).map_err(io_err(dir))?;
        }
        write_atomically(path, &temp_path(path), &bytes).map_err(io_err(path))
    }
}

/// Renames a corrupt file to `<path>.corrupt-<unix time>` (with `.<n>` added if that exists).
fn move_aside(path: &Path) -> Result<PathBuf, CheckpointError> {
    let base = format!("{}.corrupt-{}", path.display(), unix_now());
    let mut target = PathBuf::from(&base);
    let mut n = 1;
    while target.exists() {
        target = PathBuf::from(format!("{base}.{n}"));
        n += 1;
    }
    fs::rename(path, &target).map_err(io_err(path))?;
    Ok(target)
}

/// `dir/.<name>.tmp` for `dir/<name>`.
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "checkpoint".into(), |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.tmp"))
}

/// Reads the current boot ID from [`BOOT_ID_PATH`].
///
/// # Errors
/// [`CheckpointError::Io`] when the file cannot be read or is empty.
pub fn read_boot_id() -> Result<String, CheckpointError> {
    read_boot_id_from(Path::new(BOOT_ID_PATH))
}

/// Reads a boot ID from `path` (tests and emulated nodes point this elsewhere), trimmed.
///
/// # Errors
/// [`CheckpointError::Io`] when the file cannot be read or is empty.
pub fn read_boot_id_from(path: &Path) -> Result<String, CheckpointError> {
    let text = fs::read_to_string(path).map_err(io_err(path))?;
    let id = text.trim();
    if id.is_empty() {
        return Err(io_err(path)(io::Error::new(
            io::ErrorKind::InvalidData,
            "empty boot ID",
        )));
    }
    Ok(id.to_string())
}

/// The checkpoint in memory and on disk. Changes are made under a short lock and numbered;
/// [`Self::persist`] makes sure a change is on disk by writing the newest state, so changes made
/// at the same time share one write (group commit) instead of queueing one each.
pub struct CheckpointStore {
    state: std::sync::Mutex<(Checkpoint, u64)>,
    /// Called with the checkpoint after every change, under the lock ([`Self::observe`]).
    observer: std::sync::OnceLock<Observer>,
    /// Number of the newest change on disk; held while writing.
    written: tokio::sync::Mutex<u64>,
    path: PathBuf,
    blocking: crate::blocking::BlockingCalls,
}

/// What [`CheckpointStore::observe`] calls.
type Observer = Box<dyn Fn(&Checkpoint) + Send + Sync>;

impl CheckpointStore {
    /// A store for `checkpoint`, saved to `path` ([`Checkpoint::save`]) on the calling task.
    pub fn new(checkpoint: Checkpoint, path: PathBuf) -> Self {
        Self {
            state: std::sync::Mutex::new((checkpoint, 0)),
            observer: std::sync::OnceLock::new(),
            written: tokio::sync::Mutex::new(0),
            path,
            blocking: crate::blocking::BlockingCalls::Threads,
        }
    }

    /// Writes on the calling task as `blocking` says: for tests that drive thousands of changes
    /// through chosen interleavings.
    pub fn for_tests(mut self, blocking: crate::blocking::BlockingCalls) -> Self {
        self.blocking = blocking;
        self
    }

    /// The file the store saves to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the checkpoint.
    pub fn read<R>(&self, f: impl FnOnce(&Checkpoint) -> R) -> R {
        f(&self.state.lock().expect("checkpoint lock").0)
    }

    /// Changes the checkpoint in memory only; returns the change's number for
    /// [`Self::persist`].
    pub fn change<R>(&self, f: impl FnOnce(&mut Checkpoint) -> R) -> (R, u64) {
        let mut g = self.state.lock().expect("checkpoint lock");
        g.1 += 1;
        let r = f(&mut g.0);
        if let Some(observe) = self.observer.get() {
            observe(&g.0);
        }
        (r, g.1)
    }

    /// Has `f` called with the checkpoint now and after every change from now on, in the
    /// order of the changes (under the store's lock, so `f` must be brief and must not touch
    /// the store). One observer per store: returns `false`, and keeps the first, when one is
    /// set already. Whoever derives state from the records (the shared slices' namespaces the
    /// publisher shows, docs/design.md §7, "Shares are a tenant's own") sees every change,
    /// whichever path made it: prepare, carve, release, reaper, start-up.
    pub fn observe(&self, f: impl Fn(&Checkpoint) + Send + Sync + 'static) -> bool {
        let g = self.state.lock().expect("checkpoint lock");
        if self.observer.set(Box::new(f)).is_err() {
            return false;
        }
        if let Some(observe) = self.observer.get() {
            observe(&g.0);
        }
        true
    }

    /// Makes sure change `version` (and every earlier one) is on disk.
    ///
    /// # Errors
    /// [`CheckpointError`] when the file could not be written (it names the file); the change
    /// stays in memory and the next successful write saves it.
    pub(crate) async fn persist(&self, version: u64) -> Result<(), CheckpointError> {
        let mut written = self.written.lock().await;
        if *written >= version {
            return Ok(()); // someone else's write carried it
        }
        let (snapshot, newest) = {
            let g = self.state.lock().expect("checkpoint lock");
            (g.0.clone(), g.1)
        };
        // A write without fsync: brief enough to do on this task (see `run_brief`).
        self.blocking
            .run_brief(|| snapshot.save(&self.path))
            .await?;
        *written = newest;
        Ok(())
    }

    /// Changes the checkpoint and waits until the change is on disk.
    ///
    /// # Errors
    /// As [`Self::persist`]; the change stays in memory (the next successful write saves it).
    pub async fn commit<R>(
        &self,
        f: impl FnOnce(&mut Checkpoint) -> R,
    ) -> Result<R, CheckpointError> {
        let (r, version) = self.change(f);
        self.persist(version).await?;
        Ok(r)
    }
}
