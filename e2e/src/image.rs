//! The DAS container image, built on this machine without a registry or a daemon: the three
//! DAS binaries in `/usr/local/bin` on a distroless-like root filesystem (glibc and libgcc_s
//! unpacked from this machine's Debian packages, `/etc/passwd` with the `nonroot` user, `/tmp`,
//! no shell), written by `ociimage` (go-containerregistry) as an OCI image archive that
//! `ctr images import` and `podman load` read.
//!
//! It has the layout `deploy/Containerfile` gives (its base, gcr.io/distroless/cc-debian12, is
//! Debian 12's glibc and libgcc_s with a `nonroot` user of UID 65532 and no shell); the
//! `image` test lists both and compares them.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use crate::binaries::{DasBinary, containerd_bin_dir};
use crate::paths::{local_dir, target_dir};
use crate::runtime;

/// Where the binaries go in the image (the Containerfile's `COPY --from=build /out/ ...`).
pub const BIN_DIR: &str = "/usr/local/bin";
/// The user every process of the image runs as unless the pod says otherwise (the
/// Containerfile's `USER`, distroless's `nonroot`).
pub const USER: &str = "65532:65532";
/// Debian packages whose shared libraries the binaries need (`libc.so.6`, `libm.so.6`, the
/// loader; `libgcc_s.so.1`): what distroless/cc adds to its static base.
pub const DEBIAN_PACKAGES: &[&str] = &["libc6", "libgcc-s1"];
/// The DAS binaries of the image.
pub const BINARIES: [DasBinary; 3] = [DasBinary::Plugin, DasBinary::Controller, DasBinary::Webhook];

/// What to build.
#[derive(Clone, Debug)]
pub struct ImageOptions {
    /// Image name with tag, e.g. `ghcr.io/das-project/das:0.1.0`.
    pub name: String,
    /// Cargo profile whose binaries go in (`release` for users, `debug` for the tests).
    pub profile: String,
    /// The `org.opencontainers.image.version` label.
    pub version: String,
    /// The OCI archive to write.
    pub out: PathBuf,
}

/// Builds the image archive. Errors name what is missing: a binary (with the cargo command),
/// `make containerd` (ociimage), or a Debian package that `apt-get download` could not fetch.
pub fn build(opts: &ImageOptions) -> Result<PathBuf> {
    let ociimage = containerd_bin_dir().join("ociimage");
    if !ociimage.exists() {
        bail!("{} not found: run `make containerd`", ociimage.display());
    }
    let binaries = BINARIES
        .iter()
        .map(|b| Ok((b.in_target_dir(&opts.profile)?, b.name())))
        .collect::<Result<Vec<_>>>()?;
    let work = image_work_dir();
    // Per process: two builds at once (parallel tests) never share a staging dir.
    let rootfs = work.join(format!("rootfs-{}", std::process::id()));
    if rootfs.exists() {
        std::fs::remove_dir_all(&rootfs)?;
    }
    std::fs::create_dir_all(&rootfs)?;
    for deb in debian_packages(&work.join("debs"))? {
        run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&rootfs))?;
    }
    finish_rootfs(&rootfs)?;
    if let Some(dir) = opts.out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut cmd = Command::new(ociimage);
    cmd.args(["--name", &opts.name, "--user", USER])
        .arg("--rootfs")
        .arg(&rootfs)
        .arg("--out")
        .arg(&opts.out);
    for (path, name) in &binaries {
        cmd.arg("--file")
            .arg(format!("{}:{BIN_DIR}/{name}:0755", path.display()));
    }
    for (key, value) in labels(&opts.version) {
        cmd.arg("--label").arg(format!("{key}={value}"));
    }
    let built = run(&mut cmd);
    std::fs::remove_dir_all(&rootfs).ok();
    built?;
    Ok(opts.out.clone())
}

/// The image's OCI labels (the Containerfile's `LABEL`).
pub fn labels(version: &str) -> Vec<(&'static str, String)> {
    vec![
        ("org.opencontainers.image.title", "das".into()),
        (
            "org.opencontainers.image.description",
            "DAS (Dynamic Accelerator Slicer): Kubernetes DRA driver that carves NVIDIA MIG \
             slices on demand; das-kubelet-plugin, das-controller and das-webhook"
                .into(),
        ),
        (
            "org.opencontainers.image.source",
            "https://github.com/das-project/das".into(),
        ),
        ("org.opencontainers.image.licenses", "Apache-2.0".into()),
        ("org.opencontainers.image.version", version.into()),
    ]
}

/// `.local/image` (or `$DAS_IMAGE_WORK_DIR`): the package cache and the staged root filesystem.
fn image_work_dir() -> PathBuf {
    std::env::var_os("DAS_IMAGE_WORK_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| local_dir().join("image"))
}

/// The `.deb` files of [`DEBIAN_PACKAGES`] at the versions installed on this machine (the
/// binaries were linked against them), downloaded once into `cache`.
fn debian_packages(cache: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(cache)?;
    let arch = output(Command::new("dpkg").arg("--print-architecture"))
        .context("the image's libraries come from Debian packages: dpkg is required")?;
    let mut debs = Vec::new();
    for pkg in DEBIAN_PACKAGES {
        let version = output(Command::new("dpkg-query").args(["-W", "-f=${Version}", pkg]))
            .with_context(|| format!("Debian package {pkg} is not installed"))?;
        // apt's file name escapes the epoch's colon.
        let deb = cache.join(format!("{pkg}_{}_{arch}.deb", version.replace(':', "%3a")));
        if !deb.exists() {
            let download = |spec: &str| {
                run(Command::new("apt-get")
                    .args(["download", "-q", spec])
                    .current_dir(cache))
            };
            let pinned = format!("{pkg}={version}");
            // A fresh machine may have no package lists yet: update them once and retry. A
            // mirror that dropped the installed version serves the newer point release
            // (glibc and libgcc_s keep their ABI within a Debian release).
            download(&pinned)
                .or_else(|_| {
                    run(Command::new("apt-get").args(["update", "-qq"]))?;
                    download(&pinned)
                })
                .or_else(|_| download(pkg))
                .with_context(|| {
                    format!(
                        "could not download Debian package {pkg} (needs root and the Debian \
                         mirror)"
                    )
                })?;
        }
        let deb = if deb.exists() {
            deb
        } else {
            newest_deb(cache, pkg, &arch)?
        };
        debs.push(deb);
    }
    Ok(debs)
}

/// The `.deb` of `pkg` in `cache` that sorts last (the only one, unless the cache holds
/// several point releases).
fn newest_deb(cache: &Path, pkg: &str, arch: &str) -> Result<PathBuf> {
    let prefix = format!("{pkg}_");
    let suffix = format!("_{arch}.deb");
    let mut found: Vec<PathBuf> = std::fs::read_dir(cache)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(&suffix))
        })
        .collect();
    found.sort();
    found
        .pop()
        .with_context(|| format!("no {pkg} package in {}", cache.display()))
}

/// Trims the unpacked packages to what runs (no documentation, no lintian overrides, no iconv
/// modules: Rust strings need none) and adds what distroless's base has: the users and groups,
/// `/tmp`.
fn finish_rootfs(rootfs: &Path) -> Result<()> {
    for unused in ["usr/share", "usr/lib/x86_64-linux-gnu/gconv"] {
        let dir = rootfs.join(unused);
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
    }
    let etc = rootfs.join("etc");
    std::fs::create_dir_all(&etc)?;
    std::fs::write(
        etc.join("passwd"),
        "root:x:0:0:root:/root:/sbin/nologin\n\
         nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n\
         nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
    )?;
    std::fs::write(
        etc.join("group"),
        "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n",
    )?;
    let tmp = rootfs.join("tmp");
    std::fs::create_dir_all(&tmp)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777))?;
    Ok(())
}

/// An image as `ociimage list` prints it.
#[derive(Clone, Debug, Deserialize)]
pub struct ListedImage {
    pub name: String,
    pub entrypoint: Option<Vec<String>>,
    pub user: String,
    pub labels: Option<std::collections::BTreeMap<String, String>>,
    pub files: Vec<ListedFile>,
}

/// One path of an image's filesystem.
#[derive(Clone, Debug, Deserialize)]
pub struct ListedFile {
    pub path: String,
    /// `file`, `dir` or `symlink`.
    #[serde(rename = "type")]
    pub kind: String,
    pub mode: u32,
    pub size: u64,
    #[serde(default)]
    pub link: Option<String>,
    /// ELF program interpreter (the dynamic loader).
    #[serde(default)]
    pub interpreter: Option<String>,
    /// ELF DT_NEEDED sonames.
    #[serde(default)]
    pub needed: Option<Vec<String>>,
}

impl ListedImage {
    /// The entry at `path` after following symlinks (at most 16), or `None`.
    pub fn resolve(&self, path: &str) -> Option<&ListedFile> {
        let mut path = path.to_string();
        for _ in 0..16 {
            let file = self.files.iter().find(|f| f.path == path)?;
            match (&*file.kind, &file.link) {
                ("symlink", Some(link)) => {
                    path = if link.starts_with('/') {
                        link.clone()
                    } else {
                        let dir = Path::new(&path).parent().unwrap_or(Path::new("/"));
                        normalize(&dir.join(link))
                    };
                }
                _ => return Some(file),
            }
        }
        None
    }
}

/// `/a/b/../c` → `/a/c` (lexically, as the image has no `..` entries).
fn normalize(path: &Path) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::Normal(s) => parts.push(s.to_str().unwrap_or_default()),
            _ => {}
        }
    }
    format!("/{}", parts.join("/"))
}

/// Lists an OCI image archive (`ociimage list`).
pub fn list(archive: &Path) -> Result<ListedImage> {
    let out = output(
        Command::new(containerd_bin_dir().join("ociimage"))
            .arg("list")
            .arg(archive),
    )?;
    serde_json::from_str(&out).context("ociimage list printed no image JSON")
}

/// Where `make image` writes the archive by default: `<target>/image/das-<tag>.oci.tar`.
pub fn default_archive(tag: &str) -> PathBuf {
    target_dir()
        .join("image")
        .join(format!("das-{tag}.oci.tar"))
}

fn run(cmd: &mut Command) -> Result<()> {
    runtime::run(cmd).map(|_| ())
}

/// stdout of `cmd`, trimmed.
fn output(cmd: &mut Command) -> Result<String> {
    Ok(runtime::run(cmd)?.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, kind: &str, link: Option<&str>) -> ListedFile {
        ListedFile {
            path: path.into(),
            kind: kind.into(),
            mode: 0o755,
            size: 0,
            link: link.map(Into::into),
            interpreter: None,
            needed: None,
        }
    }

    #[test]
    fn resolve_follows_relative_and_absolute_links() {
        let image = ListedImage {
            name: "x".into(),
            entrypoint: None,
            user: String::new(),
            labels: None,
            files: vec![
                file(
                    "/lib64/ld-linux-x86-64.so.2",
                    "symlink",
                    Some("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
                ),
                file(
                    "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
                    "symlink",
                    Some("../x86_64-linux-gnu/ld-2.36.so"),
                ),
                file("/lib/x86_64-linux-gnu/ld-2.36.so", "file", None),
                file("/loop", "symlink", Some("/loop")),
            ],
        };
        let loader = image.resolve("/lib64/ld-linux-x86-64.so.2").unwrap();
        assert_eq!(loader.path, "/lib/x86_64-linux-gnu/ld-2.36.so");
        assert!(
            image.resolve("/loop").is_none(),
            "a symlink loop resolves to nothing"
        );
        assert!(image.resolve("/missing").is_none());
    }
}
