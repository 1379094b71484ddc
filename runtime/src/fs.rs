//! Atomic file writes: a reader (a container runtime reading a CDI spec, a restarted plugin
//! reading its checkpoint) sees the old content or the new, never a mix.

use std::fs::{self, OpenOptions};
use std::io::{self, Write as _};
use std::path::Path;

/// Replaces `path` with `bytes` atomically: write `temp_path` (same directory, truncated if it
/// exists), rename it over `path`. A reader, or the writer restarted after a crash of its process,
/// sees the old content or the new, never a mix. Nothing is fsynced: a write can be lost only with
/// the host (kernel crash, power loss), and every file DAS writes this way is meaningless after a
/// reboot: CDI specs (in `/var/run/cdi`, a tmpfs on real nodes), the node plugin's checkpoint
/// (discarded on a new boot ID) and the emulated GPUs' MIG state (MIG instances never survive a
/// reboot). After a crash at most a stale temp file is left. On error the temp file is removed.
///
/// # Errors
/// The first failing step's I/O error.
pub fn write_atomically(path: &Path, temp_path: &Path, bytes: &[u8]) -> io::Result<()> {
    let result = write_and_rename(path, temp_path, bytes);
    if result.is_err() {
        let _ = fs::remove_file(temp_path);
    }
    result
}

fn write_and_rename(path: &Path, temp_path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(temp_path)?;
    file.write_all(bytes)?;
    drop(file);
    fs::rename(temp_path, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let (path, tmp) = (dir.path().join("f"), dir.path().join(".f.tmp"));
        for content in [&b"one"[..], b"two"] {
            write_atomically(&path, &tmp, content).unwrap();
            assert_eq!(fs::read(&path).unwrap(), content);
            assert!(!tmp.exists());
        }
        // A failing write (the temp file's directory is missing) leaves the old content.
        let bad_tmp = dir.path().join("missing/.f.tmp");
        assert!(write_atomically(&path, &bad_tmp, b"three").is_err());
        assert_eq!(fs::read(&path).unwrap(), b"two");
    }
}
