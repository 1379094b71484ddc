//! Where things are on this machine: the repository, cargo's target dir and `.local`, where the
//! Makefile builds the tools the local cluster runs. The lowest layer of the crate: it uses no
//! other module of it.

use std::path::{Path, PathBuf};

/// The repository root (parent of this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ has a parent")
        .to_path_buf()
}

/// The workspace's cargo target dir: `$CARGO_TARGET_DIR`, else `target/` at the root.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// `.local` at the root: what the Makefile builds or downloads (Kubernetes, Helm, containerd,
/// Kueue, the image's package cache).
pub fn local_dir() -> PathBuf {
    workspace_root().join(".local")
}

/// `.local/bin`: the Kubernetes multi-call binary, `kubectl`, `helm`, etcd and the peers'
/// plugins.
pub fn local_bin() -> PathBuf {
    local_dir().join("bin")
}
