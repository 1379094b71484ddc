//! The NVIDIA driver's user-space files a workload container needs (`libcuda.so.1`, NVML, the
//! PTX JIT, `nvidia-smi` …), found under the node's driver root and put into every claim's CDI
//! spec as read-only bind mounts.
//!
//! Why DAS mounts them itself: its specs set `NVIDIA_VISIBLE_DEVICES=void` so that the NVIDIA
//! container runtime adds no GPUs of its own ([`super::cdi`]), and with `void` that runtime adds
//! no libraries either. Without these mounts a pod holding a MIG instance would see its MIG devices
//! but could not load `libcuda.so.1`. NVIDIA's own DRA driver copies the driver files into its
//! claim specs too (through the toolkit's CDI library, with an `nvidia-cdi-hook` that updates the
//! container's linker cache); DAS needs no hook binary on the node:
//!
//! - each library is mounted under its SONAME (`libcuda.so.1`, `libnvidia-nvvm.so.4`, …) in
//!   [`CONTAINER_LIB_DIR`], `/usr/local/nvidia/lib64`, and each tool in [`CONTAINER_BIN_DIR`],
//!   `/usr/local/nvidia/bin`: the layout NVIDIA's CUDA images expect (their `LD_LIBRARY_PATH`
//!   and `PATH` list these directories; GKE injects its driver the same way). Other images add
//!   them to `LD_LIBRARY_PATH` and `PATH` themselves.
//! - the SONAME is the name of the link the driver's installer (ldconfig) made next to the
//!   versioned file (`libcuda.so.1 -> libcuda.so.580.95.05`); a library without such a link
//!   (e.g. `libnvidia-gpucomp.so.580.95.05`, whose SONAME is versioned) keeps its file name.
//!
//! Which files: the `utility` and `compute` driver capabilities of libnvidia-container
//! (`src/nvc_info.c`, `utility_libs`, `compute_libs`, `utility_bins`, `compute_bins`), the
//! capabilities CUDA images ask for. Graphics, video and display libraries are left out.
//!
//! Two roots, because the plugin runs in a container: [`DriverRoot::path`] is where the plugin
//! sees the driver's files (the chart mounts the host's driver root at `/driver-root`), and
//! [`DriverRoot::host_path`] is the same directory on the host (`/`, or `/run/nvidia/driver`
//! with the GPU Operator's driver container), which the container runtime resolves CDI mounts
//! against.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use super::cdi::Mount;

/// Where a container finds the driver's libraries (by SONAME).
pub(crate) const CONTAINER_LIB_DIR: &str = "/usr/local/nvidia/lib64";
/// Where a container finds the driver's tools.
pub(crate) const CONTAINER_BIN_DIR: &str = "/usr/local/nvidia/bin";

/// Library directories searched below the driver root, in order: Debian/Ubuntu multiarch,
/// RHEL-like, then the generic ones. A directory that is a symlink is skipped (its absolute
/// target would resolve inside the plugin's container, not below the driver root); the
/// directory it points to is in the list on its own.
pub(crate) const LIB_DIRS: [&str; 7] = [
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "lib64",
    "usr/lib",
];

/// Tool directories searched below the driver root, in order.
pub(crate) const BIN_DIRS: [&str; 3] = ["usr/bin", "usr/local/bin", "bin"];

/// Library name stems (`<stem>.so.<driver version>`) of the `utility` and `compute`
/// capabilities (libnvidia-container `src/nvc_info.c`).
pub(crate) const LIBRARIES: [&str; 12] = [
    "libnvidia-ml",
    "libnvidia-cfg",
    "libcuda",
    "libcudadebugger",
    "libnvidia-opencl",
    "libnvidia-gpucomp",
    "libnvidia-ptxjitcompiler",
    "libnvidia-fatbinaryloader",
    "libnvidia-allocator",
    "libnvidia-compiler",
    "libnvidia-nvvm",
    "libnvidia-pkcs11-openssl3",
];

/// Tools of the `utility` and `compute` capabilities (libnvidia-container `src/nvc_info.c`),
/// without the daemons a container has no use for.
pub(crate) const TOOLS: [&str; 4] = [
    NVIDIA_SMI,
    "nvidia-debugdump",
    MPS_CONTROL,
    "nvidia-cuda-mps-server",
];

/// NVIDIA's management tool: mounted for containers like the other tools, and run by the plugin
/// to set a time-sliced whole GPU's time slice (docs/design.md §7, "Time-slicing").
pub const NVIDIA_SMI: &str = "nvidia-smi";

/// NVIDIA's MPS control binary: mounted for containers like the other tools, and run by the
/// plugin itself as the MPS control daemon of a MIG instance (docs/design.md §7, "MPS on a slice").
pub const MPS_CONTROL: &str = "nvidia-cuda-mps-control";

/// NVML's library, which every driver install has: where it is decides the library directory
/// and, without a version from NVML, the driver version.
const NVML_STEM: &str = "libnvidia-ml";

/// The driver root as the plugin sees it and as the host has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverRoot {
    /// Where this process finds the driver's files, e.g. `/driver-root`.
    pub path: PathBuf,
    /// The same directory on the host, e.g. `/` or `/run/nvidia/driver`.
    pub host_path: PathBuf,
}

/// One driver file to mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverFile {
    /// Path below the driver root, e.g. `usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05`.
    pub relative: PathBuf,
    /// Where the container sees it, e.g. `/usr/local/nvidia/lib64/libcuda.so.1`.
    pub container_path: String,
}

/// The driver files found under a root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverFiles {
    /// The root they were found under.
    pub root: DriverRoot,
    /// The driver version of the libraries, e.g. `580.95.05`.
    pub version: String,
    /// Libraries, then tools.
    pub files: Vec<DriverFile>,
}

/// Why the driver files could not be found.
#[derive(Debug)]
pub enum DriverFilesError {
    /// No `libnvidia-ml.so.<version>` (of the wanted version) in any library directory.
    NoDriver {
        /// The plugin's view of the root.
        root: PathBuf,
        /// The version NVML reports, if known.
        version: Option<String>,
        /// Versions found instead.
        found: Vec<String>,
    },
    /// Several driver versions' libraries and no version to choose by.
    AmbiguousVersion {
        /// The plugin's view of the root.
        root: PathBuf,
        /// Every version found.
        found: Vec<String>,
    },
    /// A directory could not be read.
    Io {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

impl fmt::Display for DriverFilesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoDriver {
                root,
                version,
                found,
            } => {
                write!(
                    f,
                    "no {NVML_STEM}.so.{} in {} below the driver root {}",
                    version.as_deref().unwrap_or("<version>"),
                    LIB_DIRS.join(", "),
                    root.display()
                )?;
                if !found.is_empty() {
                    write!(f, " (found versions {})", found.join(", "))?;
                }
                write!(
                    f,
                    "; point --driver-root (chart value kubeletPlugin.driverRoot) at the root of \
                     the NVIDIA driver install: / for a host install, /run/nvidia/driver for \
                     the GPU Operator's driver container"
                )
            }
            Self::AmbiguousVersion { root, found } => write!(
                f,
                "driver libraries of several versions below {} ({}): cannot tell which one \
                 the kernel module runs",
                root.display(),
                found.join(", ")
            ),
            Self::Io { path, source } => write!(f, "read {}: {source}", path.display()),
        }
    }
}

impl std::error::Error for DriverFilesError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The version in a file name `<stem>.so.<version>`, if the name has that form and the version
/// is a driver version (digits and at least one dot, like `580.95.05`; a bare `1` is a SONAME).
fn versioned(name: &str, stem: &str) -> Option<String> {
    let v = name.strip_prefix(stem)?.strip_prefix(".so.")?;
    let ok = v.contains('.')
        && v.split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    ok.then(|| v.to_string())
}

/// Entries of `dir`: (file name, whether it is a regular file, the link target's file name if
/// it is a symlink). `None` when `dir` is missing or itself a symlink.
type Entry = (String, bool, Option<String>);

fn entries(dir: &Path) -> Result<Option<Vec<Entry>>, DriverFilesError> {
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(DriverFilesError::Io {
                path: dir.into(),
                source,
            });
        }
    }
    let io_err = |source| DriverFilesError::Io {
        path: dir.into(),
        source,
    };
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io_err)? {
        let e = e.map_err(io_err)?;
        let name = e.file_name().to_string_lossy().into_owned();
        let kind = e.file_type().map_err(io_err)?;
        let target = if kind.is_symlink() {
            std::fs::read_link(e.path())
                .ok()
                .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
        } else {
            None
        };
        out.push((name, kind.is_file(), target));
    }
    out.sort();
    Ok(Some(out))
}

/// Finds the driver files under `root`. `version` is the driver version NVML reports; without
/// it the root must hold one version's libraries.
///
/// # Errors
/// [`DriverFilesError::NoDriver`] when no NVML library (of `version`) is there,
/// [`DriverFilesError::AmbiguousVersion`] for several versions and no `version`, and
/// [`DriverFilesError::Io`] for a directory that cannot be read.
pub fn discover(root: &DriverRoot, version: Option<&str>) -> Result<DriverFiles, DriverFilesError> {
    let mut candidates: Vec<(&str, String, Vec<Entry>)> = Vec::new();
    for dir in LIB_DIRS {
        let Some(list) = entries(&root.path.join(dir))? else {
            continue;
        };
        let versions: Vec<String> = list
            .iter()
            .filter(|(_, file, _)| *file)
            .filter_map(|(n, _, _)| versioned(n, NVML_STEM))
            .collect();
        for v in versions {
            candidates.push((dir, v, list.clone()));
        }
    }
    let mut found: Vec<String> = candidates.iter().map(|(_, v, _)| v.clone()).collect();
    found.sort();
    found.dedup();
    let pick = match version {
        Some(want) => candidates.iter().find(|(_, v, _)| v == want),
        None if found.len() > 1 => {
            return Err(DriverFilesError::AmbiguousVersion {
                root: root.path.clone(),
                found,
            });
        }
        None => candidates.first(),
    };
    let Some((dir, version, list)) = pick else {
        return Err(DriverFilesError::NoDriver {
            root: root.path.clone(),
            version: version.map(str::to_string),
            found,
        });
    };
    let mut files = libraries(dir, version, list);
    files.extend(tools(&root.path)?);
    Ok(DriverFiles {
        root: root.clone(),
        version: version.clone(),
        files,
    })
}

/// The libraries of [`LIBRARIES`] at `version` in `dir` (listed as `list`), each under its
/// SONAME link's name, or its own name when it has none.
fn libraries(dir: &str, version: &str, list: &[Entry]) -> Vec<DriverFile> {
    let mut out = Vec::new();
    for stem in LIBRARIES {
        let file = format!("{stem}.so.{version}");
        if !list.iter().any(|(n, is_file, _)| *is_file && *n == file) {
            continue;
        }
        let soname = list
            .iter()
            .filter(|(n, _, target)| target.as_deref() == Some(file.as_str()) && *n != file)
            .map(|(n, _, _)| n)
            .find(|n| {
                n.strip_prefix(stem)
                    .and_then(|r| r.strip_prefix(".so."))
                    .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
            })
            .cloned()
            .unwrap_or_else(|| file.clone());
        out.push(DriverFile {
            relative: Path::new(dir).join(&file),
            container_path: format!("{CONTAINER_LIB_DIR}/{soname}"),
        });
    }
    out
}

/// The tools of [`TOOLS`] found in [`BIN_DIRS`] below `root` (regular files; the first
/// directory that has one wins).
fn tools(root: &Path) -> Result<Vec<DriverFile>, DriverFilesError> {
    let mut out = Vec::new();
    for tool in TOOLS {
        for dir in BIN_DIRS {
            let Some(list) = entries(&root.join(dir))? else {
                continue;
            };
            if list.iter().any(|(n, is_file, _)| *is_file && n == tool) {
                out.push(DriverFile {
                    relative: Path::new(dir).join(tool),
                    container_path: format!("{CONTAINER_BIN_DIR}/{tool}"),
                });
                break;
            }
        }
    }
    Ok(out)
}

/// Mount options of every driver file: read-only bind mounts without set-uid or device files,
/// as NVIDIA's toolkit mounts them.
pub(crate) const MOUNT_OPTIONS: [&str; 4] = ["ro", "nosuid", "nodev", "bind"];

impl DriverFiles {
    /// Where this process finds tool `name` (one of [`TOOLS`], e.g. `nvidia-cuda-mps-control`,
    /// which MPS devices run: docs/design.md §7, "MPS on a slice"), if the driver has it.
    pub fn tool(&self, name: &str) -> Option<PathBuf> {
        let container_path = format!("{CONTAINER_BIN_DIR}/{name}");
        self.files
            .iter()
            .find(|f| f.container_path == container_path)
            .map(|f| self.root.path.join(&f.relative))
    }

    /// The directory of the driver's libraries as this process sees it.
    pub fn library_dir(&self) -> Option<PathBuf> {
        let lib = self
            .files
            .iter()
            .find(|f| f.container_path.starts_with(CONTAINER_LIB_DIR))?;
        self.root
            .path
            .join(&lib.relative)
            .parent()
            .map(Path::to_path_buf)
    }

    /// Where the host has tool `name` (below [`DriverRoot::host_path`]): what a program the
    /// container runtime runs on the host, a CDI hook, names.
    pub fn host_tool(&self, name: &str) -> Option<PathBuf> {
        let seen = self.tool(name)?;
        let relative = seen.strip_prefix(&self.root.path).ok()?;
        Some(self.root.host_path.join(relative))
    }

    /// The directory of the driver's libraries on the host (below [`DriverRoot::host_path`]).
    pub fn host_library_dir(&self) -> Option<PathBuf> {
        let seen = self.library_dir()?;
        let relative = seen.strip_prefix(&self.root.path).ok()?;
        Some(self.root.host_path.join(relative))
    }

    /// The CDI mounts: each file's host path (below [`DriverRoot::host_path`]) at its container
    /// path.
    pub fn mounts(&self) -> Vec<Mount> {
        self.files
            .iter()
            .map(|f| Mount {
                host_path: self.root.host_path.join(&f.relative).display().to_string(),
                container_path: f.container_path.clone(),
                options: MOUNT_OPTIONS.iter().map(|o| o.to_string()).collect(),
                mount_type: None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
