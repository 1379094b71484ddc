//! DAS's CDI spec files: one per claim, `das.com-mig_<claimUID>.json` in the node's CDI
//! directory, written atomically (a temp file without the `.json` suffix, then a rename, as
//! container-device-interface `pkg/cdi/spec.go` does), and listed and cleaned up at start-up.
//! [`CdiWriter`] is a node's directory with what every spec it writes carries. All of
//! [`super`]'s file I/O is here.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use das_runtime::fs::write_atomically;

use super::CdiError;
use super::schema::{Mount, Spec, validate_claim_uid};
use super::spec::{
    ClaimSpec, DeviceNodes, SpecDevice, add_spec_mounts, build_claim_spec, place_device_nodes,
};

/// The dynamic CDI directory the kubelet plugin writes to by default (CDI `DefaultDynamicDir`).
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> CdiError + '_ {
    move |source| CdiError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// File name of a claim's spec: `<vendor>-<class>_<claimUID>.json`, e.g.
/// `das.com-mig_<uid>.json` (the dra-example-driver convention).
pub fn spec_file_name(claim_uid: &str) -> String {
    format!("{}{claim_uid}.json", spec_file_prefix())
}

fn spec_file_prefix() -> String {
    format!("{}_", das_api::CDI_KIND.replace('/', "-"))
}

/// Path of a claim's spec in `dir`.
pub fn spec_path(dir: &Path, claim_uid: &str) -> PathBuf {
    dir.join(spec_file_name(claim_uid))
}

/// Name of the temp file a write goes through: hidden and without a `.json` suffix, so the CDI
/// cache never scans it; unique per write so two writers never share one.
pub(super) fn temp_file_name(claim_uid: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        ".{}{claim_uid}.{}-{n}.tmp",
        spec_file_prefix(),
        std::process::id()
    )
}

/// Writes a claim's spec to `dir/das.com-mig_<claimUID>.json` atomically: validate, write a temp
/// file, rename it over the target. A reader (the container runtime) sees the old file or the
/// new one, never a partial one. No fsync: the CDI dir is a tmpfs on real nodes and a spec means
/// nothing after a reboot. Returns the path written.
///
/// # Errors
/// [`CdiError::InvalidName`] / [`CdiError::InvalidSpec`] when the spec is not valid (nothing is
/// written); [`CdiError::Io`] when a file step fails (the temp file is removed).
pub fn write_spec(dir: &Path, claim_uid: &str, spec: &Spec) -> Result<PathBuf, CdiError> {
    validate_claim_uid(claim_uid)?;
    spec.validate()?;
    let mut bytes = serde_json::to_vec_pretty(spec)
        .map_err(|e| CdiError::InvalidSpec(format!("cannot serialize: {e}")))?;
    bytes.push(b'\n');
    let path = spec_path(dir, claim_uid);
    // The CDI dir is a tmpfs on real nodes: it may be gone after a reboot of the node.
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let temp = dir.join(temp_file_name(claim_uid));
    write_atomically(&path, &temp, &bytes).map_err(io_err(&path))?;
    Ok(path)
}

/// Deletes a claim's spec. Idempotent: returns `Ok(false)` when there was no file.
///
/// # Errors
/// [`CdiError::Io`] when the file exists and cannot be removed.
pub fn delete_spec(dir: &Path, claim_uid: &str) -> Result<bool, CdiError> {
    validate_claim_uid(claim_uid)?;
    let path = spec_path(dir, claim_uid);
    match fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_err(&path)(e)),
    }
}

/// A DAS spec file found in a CDI directory.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SpecFile {
    /// The claim UID from the file name.
    pub claim_uid: String,
    /// The file.
    pub path: PathBuf,
}

/// Lists DAS's spec files in `dir` (names `das.com-mig_<uid>.json`), sorted by claim UID, so
/// start-up can delete those of claims that no longer exist. Other vendors' files and temp files
/// are skipped. A missing directory lists as empty.
///
/// # Errors
/// [`CdiError::Io`] when the directory cannot be read.
pub fn list_specs(dir: &Path) -> Result<Vec<SpecFile>, CdiError> {
    let prefix = spec_file_prefix();
    let mut found = Vec::new();
    for name in dir_file_names(dir)? {
        let uid = name
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix(".json"));
        if let Some(uid) = uid.filter(|u| validate_claim_uid(u).is_ok()) {
            found.push(SpecFile {
                claim_uid: uid.to_string(),
                path: dir.join(&name),
            });
        }
    }
    found.sort();
    Ok(found)
}

/// Removes temp files that an interrupted [`write_spec`] left in `dir`
/// (`.das.com-mig_*.tmp`). Call at start-up, before serving, when no write is in flight.
/// Returns how many were removed.
///
/// # Errors
/// [`CdiError::Io`] when the directory cannot be read or a temp file cannot be removed.
pub fn remove_temp_files(dir: &Path) -> Result<usize, CdiError> {
    let prefix = format!(".{}", spec_file_prefix());
    let mut removed = 0;
    for name in dir_file_names(dir)? {
        if name.starts_with(&prefix) && name.ends_with(".tmp") {
            let path = dir.join(&name);
            match fs::remove_file(&path) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&path)(e)),
            }
        }
    }
    Ok(removed)
}

/// UTF-8 names of the entries of `dir`; empty when `dir` does not exist.
pub(super) fn dir_file_names(dir: &Path) -> Result<Vec<String>, CdiError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(dir)(e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_err(dir))?;
        if let Ok(name) = entry.file_name().into_string() {
            names.push(name);
        }
    }
    Ok(names)
}

/// Reads and parses one spec file. Does not [`Spec::validate`] it.
///
/// # Errors
/// [`CdiError::Io`] when it cannot be read; [`CdiError::Parse`] when it is not a CDI spec
/// (corrupt, truncated, wrong shape).
pub fn read_spec(path: &Path) -> Result<Spec, CdiError> {
    let bytes = fs::read(path).map_err(io_err(path))?;
    serde_json::from_slice(&bytes).map_err(|source| CdiError::Parse {
        path: path.to_path_buf(),
        source,
    })
}

/// A node's CDI directory and what every claim spec written there carries beyond the claim's
/// instances: the `nvidia-caps` major of its capability nodes, where its device nodes are on the
/// host, and the driver's files it mounts. The request path writes every spec through one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdiWriter {
    dir: PathBuf,
    caps_major: u32,
    device_nodes: DeviceNodes,
    driver_mounts: Vec<Mount>,
}

impl CdiWriter {
    /// Specs in `dir`, with capability nodes of major `caps_major` (from `/proc/devices`; a
    /// fixed value when emulated), device nodes placed as `device_nodes` says, and
    /// `driver_mounts` (the driver's files, `crate::claims::driver_files`; empty without a
    /// driver root) in their spec-level edits.
    pub fn new(
        dir: PathBuf,
        caps_major: u32,
        device_nodes: DeviceNodes,
        driver_mounts: Vec<Mount>,
    ) -> Self {
        Self {
            dir,
            caps_major,
            device_nodes,
            driver_mounts,
        }
    }

    /// The CDI directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Major of the `nvidia-caps` character device, for the capability nodes of the claims'
    /// instances.
    pub fn caps_major(&self) -> u32 {
        self.caps_major
    }

    /// DAS's spec of claim `claim_uid` on this node ([`build_claim_spec`]), its device nodes
    /// placed and the driver's files added. Pure: writes nothing.
    ///
    /// # Errors
    /// As [`build_claim_spec`].
    pub(crate) fn claim_spec(
        &self,
        claim_uid: &str,
        devices: &[SpecDevice],
    ) -> Result<ClaimSpec, CdiError> {
        let mut built = build_claim_spec(claim_uid, devices)?;
        place_device_nodes(&mut built.spec, &self.device_nodes);
        add_spec_mounts(&mut built.spec, &self.driver_mounts);
        Ok(built)
    }

    /// Writes the claim's spec atomically ([`write_spec`]); returns the path written.
    ///
    /// # Errors
    /// As [`write_spec`].
    pub fn write(&self, claim_uid: &str, spec: &Spec) -> Result<PathBuf, CdiError> {
        write_spec(&self.dir, claim_uid, spec)
    }

    /// Reads the claim's spec file ([`read_spec`]).
    ///
    /// # Errors
    /// As [`read_spec`]: missing, unreadable or corrupt.
    pub fn read(&self, claim_uid: &str) -> Result<Spec, CdiError> {
        read_spec(&spec_path(&self.dir, claim_uid))
    }

    /// Deletes the claim's spec ([`delete_spec`]); `Ok(false)` when there was none.
    ///
    /// # Errors
    /// As [`delete_spec`].
    pub fn delete(&self, claim_uid: &str) -> Result<bool, CdiError> {
        delete_spec(&self.dir, claim_uid)
    }

    /// DAS's spec files in the directory ([`list_specs`]).
    ///
    /// # Errors
    /// As [`list_specs`].
    pub fn list(&self) -> Result<Vec<SpecFile>, CdiError> {
        list_specs(&self.dir)
    }

    /// Removes the temp files of interrupted writes ([`remove_temp_files`]); at start-up only.
    ///
    /// # Errors
    /// As [`remove_temp_files`].
    pub fn remove_temp_files(&self) -> Result<usize, CdiError> {
        remove_temp_files(&self.dir)
    }
}
