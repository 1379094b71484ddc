//! The DAS image built here (`das_e2e::image`, `make image` without a container engine) against
//! `deploy/Containerfile`, which this machine cannot build (its base images are on registries
//! out of reach): both are listed and must give the same layout. From the Containerfile: the
//! binaries its build stage copies into `/out` and where the final stage puts them, its `USER`,
//! its `LABEL` keys, no `ENTRYPOINT`, and a distroless Debian 12 base (glibc and libgcc_s, no
//! shell). From the archive (`ociimage list`): the same, plus that every binary's loader and
//! shared libraries resolve inside the image.

use std::collections::BTreeSet;

use das_e2e::cluster::workspace_root;
use das_e2e::image::{self, ImageOptions};

/// What the Containerfile's final image holds, read from its text.
#[derive(Debug, Default)]
struct ContainerfileLayout {
    binaries: BTreeSet<String>,
    bin_dir: String,
    user: String,
    label_keys: BTreeSet<String>,
    entrypoint: bool,
    base: String,
}

/// Reads the Containerfile: backslash-continued lines joined, then the instructions of the
/// last stage plus the build stage's `cp target/release/...` list.
fn containerfile_layout(text: &str) -> ContainerfileLayout {
    let joined = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("\\\n", " ");
    let mut layout = ContainerfileLayout::default();
    for line in joined.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.first().copied() {
            Some("FROM") => layout.base = words[1].to_string(),
            Some("USER") => layout.user = words[1].to_string(),
            Some("ENTRYPOINT") | Some("CMD") => layout.entrypoint = true,
            Some("LABEL") => {
                for w in &words[1..] {
                    if let Some((key, _)) = w.split_once('=') {
                        layout.label_keys.insert(key.to_string());
                    }
                }
            }
            Some("COPY") if words.contains(&"--from=build") => {
                assert_eq!(
                    words[words.len() - 2],
                    "/out/",
                    "the build stage's output dir"
                );
                layout.bin_dir = words[words.len() - 1].trim_end_matches('/').to_string();
            }
            Some("RUN") => {
                // `cp target/release/a target/release/b /out/`
                for w in &words {
                    if let Some(bin) = w.strip_prefix("target/release/") {
                        layout.binaries.insert(bin.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    layout
}

#[test]
fn image_has_the_containerfile_layout_and_runs_without_a_shell() {
    let containerfile =
        std::fs::read_to_string(workspace_root().join("deploy/Containerfile")).unwrap();
    let want = containerfile_layout(&containerfile);
    assert!(
        want.base.starts_with("gcr.io/distroless/cc-debian12"),
        "the Containerfile's base changed to {}: das_e2e::image builds the distroless cc \
         Debian 12 layout; change both together",
        want.base
    );
    assert_eq!(want.binaries.len(), 3, "{want:?}");

    let dir = std::env::temp_dir().join(format!("das-image-test-{}", std::process::id()));
    let archive = image::build(&ImageOptions {
        name: "das.local/das:layout-test".into(),
        profile: "debug".into(),
        version: "0.0.0-test".into(),
        out: dir.join("das.oci.tar"),
    })
    .expect("build the image");
    let got = image::list(&archive).expect("list the image");
    std::fs::remove_dir_all(&dir).ok();

    assert_eq!(got.name, "das.local/das:layout-test");
    assert_eq!(got.user, want.user, "USER");
    assert_eq!(
        got.entrypoint.is_some(),
        want.entrypoint,
        "ENTRYPOINT: the chart sets each container's command"
    );
    let label_keys: BTreeSet<String> = got.labels.clone().unwrap_or_default().into_keys().collect();
    assert_eq!(label_keys, want.label_keys, "LABEL keys");

    let bin_dir = format!("{}/", want.bin_dir);
    let got_bins: BTreeSet<String> = got
        .files
        .iter()
        .filter(|f| f.kind == "file")
        .filter_map(|f| f.path.strip_prefix(&bin_dir))
        .map(str::to_string)
        .collect();
    assert_eq!(got_bins, want.binaries, "binaries in {}", want.bin_dir);

    // Distroless: no shell, so nothing in the image can run a script.
    for shell in ["/bin/sh", "/bin/bash", "/usr/bin/sh", "/bin/busybox"] {
        assert!(got.resolve(shell).is_none(), "{shell} in the image");
    }
    assert!(
        got.resolve("/etc/passwd").is_some() && got.resolve("/tmp").is_some(),
        "/etc/passwd and /tmp, as distroless has them"
    );

    // Every binary starts: its loader and each needed library are in the image.
    let lib_dirs = ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"];
    for bin in &want.binaries {
        let path = format!("{}/{bin}", want.bin_dir);
        let file = got.resolve(&path).unwrap();
        assert_eq!(file.mode & 0o111, 0o111, "{path} is executable by everyone");
        let loader = file
            .interpreter
            .as_deref()
            .expect("a dynamically linked binary");
        assert!(
            got.resolve(loader).is_some(),
            "{path}: loader {loader} missing"
        );
        for lib in file.needed.as_deref().unwrap_or_default() {
            assert!(
                lib_dirs
                    .iter()
                    .any(|d| got.resolve(&format!("{d}/{lib}")).is_some()),
                "{path} needs {lib}, which is not in {lib_dirs:?}"
            );
        }
    }
}

#[test]
fn containerfile_reader_sees_each_instruction() {
    let layout = containerfile_layout(
        "FROM rust AS build\nRUN cargo build \\\n && cp target/release/a target/release/b /out/\n\
         # COPY --from=build /x/ /nowhere/\nFROM base:tag\nLABEL k1=\"v\" \\\n      k2=\"w\"\n\
         COPY --from=build /out/ /usr/local/bin/\nUSER 1:1\n",
    );
    assert_eq!(layout.base, "base:tag");
    assert_eq!(layout.user, "1:1");
    assert_eq!(layout.bin_dir, "/usr/local/bin");
    assert_eq!(layout.binaries, ["a", "b"].map(String::from).into());
    assert_eq!(layout.label_keys, ["k1", "k2"].map(String::from).into());
    assert!(!layout.entrypoint);
}
