//! A stand-in NVIDIA driver install for emulated GPUs (with `--emulated-device-dir`).
//!
//! On a GPU node the plugin mounts the driver's user-space files into every claim's container
//! (`claims::driver_files`). Emulated GPUs get the same behaviour from a small tree of their
//! own, laid out as a driver installer leaves it: the versioned libraries of the compute and
//! utility capabilities in `usr/lib/x86_64-linux-gnu`, the SONAME links ldconfig makes
//! (`libcuda.so.1 -> libcuda.so.580.95.05`; `libnvidia-nvvm.so.4`; none for
//! `libnvidia-gpucomp`), the development link `libcuda.so`, a graphics library that is not a
//! compute library (`libGLX_nvidia.so.0`), and `nvidia-smi` / `nvidia-debugdump` in `usr/bin`.
//! Each file holds one line naming itself, so a test can read in a container which file it got.
//! They are not programs or libraries: nothing can load or run them.

use std::io;
use std::path::Path;

/// Library directory of the stand-in install (Debian/Ubuntu multiarch).
pub(crate) const LIB_DIR: &str = "usr/lib/x86_64-linux-gnu";
/// Tool directory of the stand-in install.
pub const BIN_DIR: &str = "usr/bin";

/// (library stem, SONAME suffix or `None` for a library whose SONAME is its versioned name).
const LIBRARIES: [(&str, Option<&str>); 8] = [
    ("libnvidia-ml", Some("1")),
    ("libnvidia-cfg", Some("1")),
    ("libcuda", Some("1")),
    ("libnvidia-ptxjitcompiler", Some("1")),
    ("libnvidia-nvvm", Some("4")),
    ("libnvidia-opencl", Some("1")),
    ("libnvidia-gpucomp", None),
    // A graphics library: present in every install, not of the compute or utility capability.
    ("libGLX_nvidia", Some("0")),
];
const TOOLS: [&str; 2] = ["nvidia-smi", "nvidia-debugdump"];

/// The one line a stand-in file holds: `stand-in <relative path> (NVIDIA driver <version>)`.
pub fn content(relative: &str, version: &str) -> String {
    format!("stand-in {relative} (NVIDIA driver {version})\n")
}

/// Writes the stand-in install of driver `version` below `root` (again if it is there: files
/// rewritten, links replaced).
///
/// # Errors
/// A directory, file or link cannot be made.
pub fn create_stand_in_driver(root: &Path, version: &str) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let lib = root.join(LIB_DIR);
    let bin = root.join(BIN_DIR);
    std::fs::create_dir_all(&lib)?;
    std::fs::create_dir_all(&bin)?;
    let link = |name: String, target: &str| -> io::Result<()> {
        let path = lib.join(name);
        let _ = std::fs::remove_file(&path);
        std::os::unix::fs::symlink(target, path)
    };
    for (stem, soname) in LIBRARIES {
        let file = format!("{stem}.so.{version}");
        std::fs::write(
            lib.join(&file),
            content(&format!("{LIB_DIR}/{file}"), version),
        )?;
        if let Some(n) = soname {
            link(format!("{stem}.so.{n}"), &file)?;
        }
    }
    // The development link the CUDA toolkit's linker uses; never a SONAME.
    link("libcuda.so".into(), "libcuda.so.1")?;
    for tool in TOOLS {
        let path = bin.join(tool);
        std::fs::write(&path, content(&format!("{BIN_DIR}/{tool}"), version))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}
