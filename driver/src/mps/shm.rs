//! The shm directory of a daemon (docs/design.md §7, "MPS on a slice", *Directories*): a tmpfs
//! of a configured size mounted on `<state dir>/mps/<id>/shm` before the daemon first starts,
//! kept across daemon and plugin restarts (a tmpfs already there is never mounted again: the
//! running containers have that very mount bind-mounted as their `/dev/shm`), and unmounted
//! when the daemon's directory is removed. MPS clients and their server exchange shared memory
//! there, and a client's page-locked host memory is bounded by it; a bounded tmpfs keeps a
//! client that fills its `/dev/shm` from filling the node's disk, and its pages are charged to
//! the memory cgroup of the process that writes them (the kernel's tmpfs accounting).
//!
//! [`Shm`] and the parsers are pure; [`ensure_mounted`], [`unmount`] and [`usage`] do the
//! mount(2), umount(2) and statvfs(3) calls, through `rustix`.

use std::path::{Path, PathBuf};

use rustix::mount::{MountFlags, UnmountFlags};

/// How a daemon's shm directory is backed (`--mps-shm-size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shm {
    /// A tmpfs of `size_bytes` bytes (mode 1777, `nosuid,nodev,noexec`).
    Tmpfs {
        /// Its size in bytes, a whole number of 4 KiB pages.
        size_bytes: u64,
    },
    /// A plain directory on the state dir's file system (`--mps-shm-size=0`): unbounded, not
    /// counted anywhere. Only for development without `CAP_SYS_ADMIN`.
    Directory,
}

/// The default size of a daemon's tmpfs: 8 GiB (`--mps-shm-size`, chart `mps.shmSize`). A
/// ceiling, not a reservation: a tmpfs holds memory only for what is written to it. Large enough
/// for PyTorch DataLoader workers, which pass batches through `/dev/shm` (a container runtime's
/// default of 64 MiB is a known cause of their `Bus error`), and for the page-locked host memory
/// of the clients of one MIG instance; small enough that one claim cannot take most of a GPU node's
/// memory through it.
pub const DEFAULT_SIZE: &str = "8Gi";

/// The smallest tmpfs size accepted (below it an MPS server would not start).
pub(crate) const MIN_SIZE_BYTES: u64 = 1 << 20;

/// Bytes of a page: a tmpfs size is rounded up to whole pages.
const PAGE: u64 = 4096;

/// A `--mps-shm-size` that is no valid size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "--mps-shm-size {value:?} is not valid: {why}; valid: a Kubernetes quantity of at least 1Mi such as 8Gi or 512Mi, or 0 for a plain directory on the state dir (unbounded: development only)"
)]
pub struct ShmSizeError {
    /// The value given.
    pub value: String,
    /// What is wrong with it.
    pub why: String,
}

impl Shm {
    /// Reads `--mps-shm-size`: a Kubernetes quantity (`8Gi`), rounded up to whole pages; `0` is
    /// [`Shm::Directory`].
    ///
    /// # Errors
    /// Not a quantity, or above 0 but below [`MIN_SIZE_BYTES`].
    pub fn parse(value: &str) -> Result<Self, ShmSizeError> {
        let bad = |why: String| ShmSizeError {
            value: value.to_string(),
            why,
        };
        let bytes =
            das_api::device_config::quantity_bytes(value).map_err(|e| bad(e.to_string()))?;
        match bytes {
            0 => Ok(Shm::Directory),
            b if b < MIN_SIZE_BYTES => Err(bad(format!("{b} bytes is less than 1Mi"))),
            b => Ok(Shm::Tmpfs {
                size_bytes: b.div_ceil(PAGE) * PAGE,
            }),
        }
    }

    /// The size of the tmpfs, if there is one.
    pub fn size_bytes(&self) -> Option<u64> {
        match self {
            Shm::Tmpfs { size_bytes } => Some(*size_bytes),
            Shm::Directory => None,
        }
    }
}

/// The mount options of a daemon's tmpfs of `size_bytes` (the `data` of mount(2)): its size and
/// the mode of `/dev/shm`, which every user may write and only an owner may unlink from.
pub(crate) fn mount_data(size_bytes: u64) -> String {
    format!("size={size_bytes},mode=1777")
}

/// One line of `/proc/self/mountinfo` (proc(5)), as far as DAS reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Where it is mounted (field 5, unescaped).
    pub mount_point: PathBuf,
    /// Its optional fields (`shared:N`, `master:N`, ...): its propagation.
    pub optional: Vec<String>,
    /// Its file system type (after the ` - ` separator).
    pub fs_type: String,
    /// Its super block options (`rw,size=8388608k,mode=1777`).
    pub super_options: String,
}

/// Undoes the octal escapes mountinfo writes for a space, tab, newline and backslash (`\040`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            let s = std::str::from_utf8(d).ok()?;
            u8::from_str_radix(s, 8).ok()
        });
        match (bytes[i], octal) {
            (b'\\', Some(b)) => {
                out.push(b);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The entries of a mountinfo text; lines it cannot read are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (head, tail) = line.split_once(" - ")?;
            let head: Vec<&str> = head.split(' ').collect();
            let mut tail = tail.split(' ');
            let fs_type = tail.next()?.to_string();
            let _source = tail.next()?;
            Some(MountEntry {
                mount_point: PathBuf::from(unescape(head.get(4)?)),
                optional: head.get(6..)?.iter().map(|s| s.to_string()).collect(),
                fs_type,
                super_options: tail.next().unwrap_or_default().to_string(),
            })
        })
        .collect()
}

/// The mount on `path` itself (the last one listed: the one on top), if there is one.
pub(crate) fn mount_on<'a>(entries: &'a [MountEntry], path: &Path) -> Option<&'a MountEntry> {
    entries.iter().rev().find(|e| e.mount_point == path)
}

/// The mount `path` lies on: the one with the longest mount point above it (the last listed
/// among equals).
pub(crate) fn mount_containing<'a>(
    entries: &'a [MountEntry],
    path: &Path,
) -> Option<&'a MountEntry> {
    entries
        .iter()
        .enumerate()
        .filter(|(_, e)| path.starts_with(&e.mount_point))
        .max_by_key(|(i, e)| (e.mount_point.components().count(), *i))
        .map(|(_, e)| e)
}

/// Whether a mount propagates mounts made below it to its peers (`shared:N`): the host and the
/// container runtime see a tmpfs the plugin mounts under its state dir only then.
pub(crate) fn is_shared(entry: &MountEntry) -> bool {
    entry.optional.iter().any(|o| o.starts_with("shared:"))
}

/// Why a daemon's tmpfs could not be mounted, read or unmounted.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// `/proc/self/mountinfo` could not be read.
    #[error("read /proc/self/mountinfo: {0}")]
    Mountinfo(std::io::Error),
    /// The shm directory's path could not be resolved.
    #[error("resolve {path}: {source}")]
    Resolve {
        /// The directory.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// mount(2) refused for lack of privilege.
    #[error(
        "mount a {size_bytes}-byte tmpfs on {path}: {source}: mounting needs CAP_SYS_ADMIN; run the plugin privileged (the chart does on GPU nodes, and with emulated GPUs when mps.shmOnEmulatedGpus is true) or pass --mps-shm-size=0 (an unbounded plain directory, development only)"
    )]
    NotPermitted {
        /// The shm directory.
        path: String,
        /// The size asked for.
        size_bytes: u64,
        /// The kernel's answer.
        source: rustix::io::Errno,
    },
    /// mount(2) failed otherwise.
    #[error("mount a {size_bytes}-byte tmpfs on {path} (--mps-shm-size): {source}")]
    Mount {
        /// The shm directory.
        path: String,
        /// The size asked for.
        size_bytes: u64,
        /// The kernel's answer.
        source: rustix::io::Errno,
    },
    /// umount(2) failed.
    #[error("unmount the tmpfs on {path}: {source}")]
    Unmount {
        /// The shm directory.
        path: String,
        /// The kernel's answer.
        source: rustix::io::Errno,
    },
}

fn mounts() -> Result<Vec<MountEntry>, ShmError> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse_mountinfo(&t))
        .map_err(ShmError::Mountinfo)
}

fn resolve(dir: &Path) -> Result<PathBuf, ShmError> {
    std::fs::canonicalize(dir).map_err(|source| ShmError::Resolve {
        path: dir.display().to_string(),
        source,
    })
}

/// What [`ensure_mounted`] found or did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mounted {
    /// A tmpfs of the size was mounted now.
    Now,
    /// A tmpfs was there already (a daemon started again, or a plugin restarted): kept as it
    /// is, whatever its size.
    Already,
    /// [`Shm::Directory`]: nothing to mount.
    NotConfigured,
}

/// Mounts a tmpfs of `shm`'s size on the existing directory `dir`, unless a tmpfs is mounted
/// there already (checked in `/proc/self/mountinfo`: never twice).
///
/// # Errors
/// The mount table could not be read, or mount(2) failed (the error says what to do).
pub(crate) fn ensure_mounted(dir: &Path, shm: Shm) -> Result<Mounted, ShmError> {
    let Shm::Tmpfs { size_bytes } = shm else {
        return Ok(Mounted::NotConfigured);
    };
    let path = resolve(dir)?;
    if mount_on(&mounts()?, &path).is_some_and(|e| e.fs_type == "tmpfs") {
        return Ok(Mounted::Already);
    }
    let data = std::ffi::CString::new(mount_data(size_bytes)).expect("no NUL in the options");
    let flags = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
    rustix::mount::mount("das-mps-shm", &path, "tmpfs", flags, data.as_c_str()).map_err(
        |source| {
            let path = path.display().to_string();
            if source == rustix::io::Errno::PERM || source == rustix::io::Errno::ACCESS {
                ShmError::NotPermitted {
                    path,
                    size_bytes,
                    source,
                }
            } else {
                ShmError::Mount {
                    path,
                    size_bytes,
                    source,
                }
            }
        },
    )?;
    Ok(Mounted::Now)
}

/// Whether a tmpfs is mounted on `dir` now.
pub(crate) fn is_mounted(dir: &Path) -> bool {
    let (Ok(path), Ok(entries)) = (resolve(dir), mounts()) else {
        return false;
    };
    mount_on(&entries, &path).is_some_and(|e| e.fs_type == "tmpfs")
}

/// Unmounts every tmpfs on `dir` (normally one); a mount still busy is detached (lazily: it goes
/// once its last user does). Nothing mounted, or no directory, is fine.
///
/// # Errors
/// umount(2) failed, detached included.
pub fn unmount(dir: &Path) -> Result<(), ShmError> {
    let Ok(path) = std::fs::canonicalize(dir) else {
        return Ok(());
    };
    // Bounded: a directory cannot hold more stacked mounts than were made, and each pass
    // removes one or fails.
    for _ in 0..16 {
        if mount_on(&mounts()?, &path).is_none_or(|e| e.fs_type != "tmpfs") {
            return Ok(());
        }
        let failed = |source| ShmError::Unmount {
            path: path.display().to_string(),
            source,
        };
        match rustix::mount::unmount(&path, UnmountFlags::empty()) {
            Ok(()) => {}
            Err(rustix::io::Errno::BUSY) => {
                rustix::mount::unmount(&path, UnmountFlags::DETACH).map_err(failed)?
            }
            Err(e) => return Err(failed(e)),
        }
    }
    Ok(())
}

/// The size and the bytes in use of the file system `dir` is on (statvfs(3)), if it can be read.
pub fn usage(dir: &Path) -> Option<(u64, u64)> {
    let s = rustix::fs::statvfs(dir).ok()?;
    let size = s.f_blocks.saturating_mul(s.f_frsize);
    let used = s
        .f_blocks
        .saturating_sub(s.f_bfree)
        .saturating_mul(s.f_frsize);
    Some((size, used))
}

/// At start-up, with a tmpfs configured: whether the mount `state_dir` lies on propagates
/// mounts to its peers (`shared:` in mountinfo). A plugin in a container whose state-dir mount
/// is not `mountPropagation: Bidirectional` mounts each tmpfs in its own mount namespace only:
/// the container runtime would bind the plain directory under it into the containers while the
/// daemon uses the tmpfs. `None` when the mount table cannot be read.
pub fn state_dir_propagates(state_dir: &Path) -> Option<bool> {
    let path = std::fs::canonicalize(state_dir).ok()?;
    let entries = mounts().ok()?;
    mount_containing(&entries, &path).map(is_shared)
}
