//! The hook's executable on the host: the container runtime runs CDI hooks by host path, so
//! the plugin copies its own binary into its kubelet plugin directory, which the chart mounts
//! from the host at the same path (`<kubelet plugins dir>/mig.das.com`).

use std::fs::{self, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

/// The installed hook's file name.
pub(crate) const INSTALLED_HOOK_NAME: &str = "das-kubelet-plugin";

/// Where the hook is installed: `<plugin_dir>/bin/das-kubelet-plugin`, `plugin_dir` being the
/// plugin's own directory under the kubelet's plugins directory (a host path).
pub fn installed_hook_path(plugin_dir: &Path) -> PathBuf {
    plugin_dir.join("bin").join(INSTALLED_HOOK_NAME)
}

/// Copies `exe` (the running binary) to `dest` unless `dest` already has the same bytes:
/// written to a temp file in `dest`'s directory (made if missing), mode 0755, then renamed over
/// `dest`, so a runtime starting the hook meanwhile runs the old binary or the new, never a
/// part. Returns whether it wrote.
///
/// # Errors
/// The failing step's I/O error, naming its path.
pub fn install_hook(exe: &Path, dest: &Path) -> io::Result<bool> {
    let named = |path: &Path| {
        let path = path.display().to_string();
        move |e: io::Error| io::Error::new(e.kind(), format!("{path}: {e}"))
    };
    let bytes = fs::read(exe).map_err(named(exe))?;
    if fs::read(dest).is_ok_and(|old| old == bytes) {
        return Ok(false);
    }
    let dir = dest.parent().unwrap_or(Path::new("/"));
    fs::create_dir_all(dir).map_err(named(dir))?;
    let temp = dir.join(format!(".{INSTALLED_HOOK_NAME}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o755)
            .open(&temp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        // The umask may have cleared bits of the mode given at open.
        fs::set_permissions(&temp, fs::Permissions::from_mode(0o755))?;
        fs::rename(&temp, dest)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&temp);
    }
    written.map_err(named(dest))?;
    Ok(true)
}
