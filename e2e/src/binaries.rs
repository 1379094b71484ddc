//! The programs the harness runs and where they are: the DAS binaries in cargo's target dir
//! ([`DasBinary`], [`Binaries`]), the Kubernetes build of `make k8s` ([`k8s_binary`], its
//! version), `helm` and `kubectl` in `.local/bin`, and the containerd build of `make containerd`.
//! Uses only [`crate::paths`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::paths::{local_bin, local_dir, target_dir, workspace_root};

/// The default Kubernetes version, the one `e2e/k8s/go.mod` pins and `make k8s` builds into
/// `.local/bin` (kept in step with the Makefile's `K8S_DEFAULT_VERSION`). Older supported
/// versions build from `e2e/k8s/versions/` (`K8S_VERSION=... make k8s`).
pub const KUBERNETES_VERSION: &str = "v1.37.2";

/// One DAS binary, as cargo builds it into the workspace's target dir.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DasBinary {
    /// `das-kubelet-plugin` (package `das-driver`).
    Plugin,
    /// `das-controller` (package `das-controller`).
    Controller,
    /// `das-webhook` (package `das-webhook`).
    Webhook,
}

impl DasBinary {
    /// The binary's file name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Plugin => "das-kubelet-plugin",
            Self::Controller => "das-controller",
            Self::Webhook => "das-webhook",
        }
    }

    /// The package that builds it.
    pub fn package(self) -> &'static str {
        match self {
            Self::Plugin => "das-driver",
            Self::Controller => "das-controller",
            Self::Webhook => "das-webhook",
        }
    }

    /// The binary of cargo profile `profile` (`debug`, `release`) in the workspace's target dir
    /// (`$CARGO_TARGET_DIR` or `target/`). A missing binary is an error that names the cargo
    /// command that builds it: the cluster tests of `das-e2e` run the binaries of other packages,
    /// which `cargo test -p das-e2e` does not build (`make e2e` builds them first). A binary
    /// older than a source file of the workspace's crates is used, with a warning on stderr
    /// naming the same command: a benchmark must not report a stale build as this one.
    pub fn in_target_dir(self, profile: &str) -> Result<PathBuf> {
        let path = target_dir().join(profile).join(self.name());
        let build = format!(
            "cargo build{} -p {} --bin {}",
            match profile {
                "debug" => String::new(),
                "release" => " --release".into(),
                p => format!(" --profile {p}"),
            },
            self.package(),
            self.name()
        );
        if !path.exists() {
            bail!(
                "{} missing: run `{build}` (`make e2e` builds every DAS binary before the cluster \
                 tests)",
                path.display()
            );
        }
        if let Some(newer) = newer_source(&path) {
            eprintln!(
                "warning: {} is older than {}: run `{build}` to measure this tree",
                path.display(),
                newer.display()
            );
        }
        Ok(path)
    }

    /// The debug build, the one `make e2e` builds for the cluster tests.
    pub fn debug(self) -> Result<PathBuf> {
        self.in_target_dir("debug")
    }
}

/// A Rust source file of the DAS crates (every workspace member's `src/`) modified after
/// `binary` was, if any.
fn newer_source(binary: &Path) -> Option<PathBuf> {
    let built = std::fs::metadata(binary).and_then(|m| m.modified()).ok()?;
    let root = workspace_root();
    let mut dirs: Vec<PathBuf> = ["api", "proto", "runtime", "driver", "controller", "webhook"]
        .iter()
        .map(|c| root.join(c).join("src"))
        .collect();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs")
                && entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|m| m > built)
            {
                return Some(path);
            }
        }
    }
    None
}

/// The DAS binaries to run.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub plugin: PathBuf,
    pub controller: Option<PathBuf>,
    pub webhook: Option<PathBuf>,
}

impl Binaries {
    /// The plugin and the controller of `profile` (`debug`, `release`) in the workspace's
    /// target dir, and the webhook when `webhook`; see [`DasBinary::in_target_dir`].
    pub fn in_target_dir(profile: &str, webhook: bool) -> Result<Self> {
        Ok(Self {
            plugin: DasBinary::Plugin.in_target_dir(profile)?,
            controller: Some(DasBinary::Controller.in_target_dir(profile)?),
            webhook: if webhook {
                Some(DasBinary::Webhook.in_target_dir(profile)?)
            } else {
                None
            },
        })
    }
}

/// `<workspace>/.local/bin/k8s`, or `$DAS_K8S_BIN` (the Makefile sets it to the build of
/// `K8S_VERSION`, e.g. `.local/k8s/v1.35.4/k8s`).
/// A relative `$DAS_K8S_BIN` is taken from the repository root (cargo runs tests in `e2e/`).
pub fn k8s_binary() -> PathBuf {
    let root = workspace_root();
    std::env::var_os("DAS_K8S_BIN")
        .map(|p| root.join(p))
        .unwrap_or_else(|| local_bin().join("k8s"))
}

/// The version of the Kubernetes build in `bin`, e.g. `v1.35.4` (what `k8s version` prints).
/// Asked once per binary and process: every chart render and cluster start needs it.
pub fn k8s_version(bin: &Path) -> Result<String> {
    static SEEN: std::sync::Mutex<BTreeMap<PathBuf, String>> =
        std::sync::Mutex::new(BTreeMap::new());
    if let Some(v) = SEEN.lock().expect("version cache").get(bin) {
        return Ok(v.clone());
    }
    let out = std::process::Command::new(bin)
        .arg("version")
        .output()
        .with_context(|| format!("run {} version", bin.display()))?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    SEEN.lock()
        .expect("version cache")
        .insert(bin.to_path_buf(), version.clone());
    Ok(version)
}

/// The minor version of the Kubernetes build in `bin`.
pub fn k8s_minor_version(bin: &Path) -> Result<u32> {
    let version = k8s_version(bin)?;
    parse_minor(&version).with_context(|| {
        format!(
            "{} version printed {version:?}, not v1.MINOR.PATCH: build it with `make k8s`",
            bin.display()
        )
    })
}

fn parse_minor(version: &str) -> Option<u32> {
    let rest = version.strip_prefix("v1.")?;
    rest.split('.').next()?.parse().ok()
}

/// `.local/bin/helm`, built by `make helm`.
pub fn helm_binary() -> PathBuf {
    local_bin().join("helm")
}

/// `.local/bin/kubectl`, built by `make k8s`.
pub fn kubectl_binary() -> PathBuf {
    local_bin().join("kubectl")
}

/// Where `make containerd` puts its binaries: `.local/containerd/bin`, or `$DAS_CONTAINERD_BIN`.
pub fn containerd_bin_dir() -> PathBuf {
    let root = workspace_root();
    std::env::var_os("DAS_CONTAINERD_BIN")
        .map(|p| root.join(p))
        .unwrap_or_else(|| local_dir().join("containerd/bin"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_names_the_command_that_builds_it() {
        let err = DasBinary::Plugin
            .in_target_dir("no-such-profile")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no-such-profile/das-kubelet-plugin missing")
                && err.contains(
                    "`cargo build --profile no-such-profile -p das-driver --bin das-kubelet-plugin`"
                )
                && err.contains("`make e2e`"),
            "{err}"
        );
        let err = Binaries::in_target_dir("no-such-profile", true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("das-kubelet-plugin missing"), "{err}");
    }

    #[test]
    fn minor_version_follows_the_build() {
        assert_eq!(parse_minor("v1.35.4"), Some(35));
        assert_eq!(parse_minor("v1.37.2"), Some(37));
        assert_eq!(parse_minor("v0.0.0-master+$Format:%H$"), None);
    }
}
