//! Atomic file writes: a reader (a container runtime reading a CDI spec, a restarted plugin
//! reading its checkpoint) sees the old content or the new, never a mix.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::path::Path;

/// What a write of [`write_atomically`] must survive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Also a power loss: the file and its directory are fsynced (the checkpoint).
    Durable,
    /// Only a crash of the process: readers see the old or the new content, never a mix, but
    /// the write may be lost with the host. For files a reboot makes meaningless anyway: CDI
    /// specs (in `/var/run/cdi`, a tmpfs on real nodes) and the emulated GPUs' MIG state (MIG
    /// instances never survive a reboot). Saves two fsyncs per write.
    Atomic,
}

/// Replaces `path` with `bytes` atomically: write `temp_path` (same directory, truncated if it
/// exists), rename it over `path`; with [`Durability::Durable`] the file is fsynced before the
/// rename and the directory after it. After a crash at most a stale temp file is left. On error
/// the temp file is removed.
///
/// # Errors
/// The first failing step's I/O error.
pub fn write_atomically(
    path: &Path,
    temp_path: &Path,
    bytes: &[u8],
    durability: Durability,
) -> io::Result<()> {
    let result = write_and_rename(path, temp_path, bytes, durability);
    if result.is_err() {
        let _ = fs::remove_file(temp_path);
    }
    result
}

fn write_and_rename(
    path: &Path,
    temp_path: &Path,
    bytes: &[u8],
    durability: Durability,
) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(temp_path)?;
    file.write_all(bytes)?;
    if durability == Durability::Durable {
        file.sync_all()?;
    }
    drop(file);
    fs::rename(temp_path, path)?;
    if durability == Durability::Durable {
        sync_parent(path)?;
    }
    Ok(())
}

/// Fsyncs the directory holding `path`, so a rename in it survives a crash.
///
/// # Errors
/// The directory cannot be opened or synced.
pub fn sync_parent(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let (path, tmp) = (dir.path().join("f"), dir.path().join(".f.tmp"));
        for (content, d) in [
            (&b"one"[..], Durability::Durable),
            (b"two", Durability::Atomic),
        ] {
            write_atomically(&path, &tmp, content, d).unwrap();
            assert_eq!(fs::read(&path).unwrap(), content);
            assert!(!tmp.exists());
        }
        // A failing write (the temp file's directory is missing) leaves the old content.
        let bad_tmp = dir.path().join("missing/.f.tmp");
        assert!(write_atomically(&path, &bad_tmp, b"three", Durability::Atomic).is_err());
        assert_eq!(fs::read(&path).unwrap(), b"two");
    }
}
