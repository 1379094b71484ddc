use super::*;
use crate::gpu::emulated::driver_files::create_stand_in_driver;

const V: &str = "580.95.05";

fn root(dir: &Path) -> DriverRoot {
    DriverRoot {
        path: dir.to_path_buf(),
        host_path: PathBuf::from("/run/nvidia/driver"),
    }
}

fn container_paths(f: &DriverFiles) -> Vec<&str> {
    f.files.iter().map(|f| f.container_path.as_str()).collect()
}

#[test]
fn libraries_are_mounted_under_their_soname_and_tools_in_the_bin_dir() {
    let dir = tempfile::tempdir().unwrap();
    create_stand_in_driver(dir.path(), V).unwrap();
    let found = discover(&root(dir.path()), Some(V)).unwrap();
    assert_eq!(found.version, V);
    assert_eq!(
        container_paths(&found),
        [
            "/usr/local/nvidia/lib64/libnvidia-ml.so.1",
            "/usr/local/nvidia/lib64/libnvidia-cfg.so.1",
            "/usr/local/nvidia/lib64/libcuda.so.1",
            "/usr/local/nvidia/lib64/libnvidia-opencl.so.1",
            // No SONAME link: its own name.
            "/usr/local/nvidia/lib64/libnvidia-gpucomp.so.580.95.05",
            "/usr/local/nvidia/lib64/libnvidia-ptxjitcompiler.so.1",
            "/usr/local/nvidia/lib64/libnvidia-nvvm.so.4",
            "/usr/local/nvidia/bin/nvidia-smi",
            "/usr/local/nvidia/bin/nvidia-debugdump",
        ],
        "compute and utility files only: no libGLX_nvidia, no libcuda.so development link"
    );
    let mounts = found.mounts();
    assert_eq!(
        mounts[2].host_path, "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05",
        "the host path is below the host's driver root, and names the versioned file"
    );
    assert_eq!(mounts[2].options, ["ro", "nosuid", "nodev", "bind"]);
    assert_eq!(mounts[7].host_path, "/run/nvidia/driver/usr/bin/nvidia-smi");
    // Where the plugin itself runs a tool (MPS devices run nvidia-cuda-mps-control), and finds
    // the libraries it loads.
    assert_eq!(
        found.tool("nvidia-smi"),
        Some(dir.path().join("usr/bin/nvidia-smi"))
    );
    assert_eq!(
        found.tool("nvidia-cuda-mps-control"),
        None,
        "not installed here"
    );
    assert_eq!(
        found.library_dir(),
        Some(dir.path().join("usr/lib/x86_64-linux-gnu"))
    );
    // What a CDI hook the runtime runs on the host names.
    assert_eq!(
        found.host_tool("nvidia-smi"),
        Some(PathBuf::from("/run/nvidia/driver/usr/bin/nvidia-smi"))
    );
    assert_eq!(found.host_tool("nvidia-cuda-mps-control"), None);
    assert_eq!(
        found.host_library_dir(),
        Some(PathBuf::from("/run/nvidia/driver/usr/lib/x86_64-linux-gnu"))
    );
}

#[test]
fn without_a_version_the_single_installed_one_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    create_stand_in_driver(dir.path(), V).unwrap();
    assert_eq!(discover(&root(dir.path()), None).unwrap().version, V);
}

#[test]
fn a_missing_or_other_driver_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let e = discover(&root(dir.path()), Some(V))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no libnvidia-ml.so.580.95.05") && e.contains("kubeletPlugin.driverRoot"),
        "{e}"
    );
    create_stand_in_driver(dir.path(), "570.1.2").unwrap();
    let e = discover(&root(dir.path()), Some(V))
        .unwrap_err()
        .to_string();
    assert!(e.contains("found versions 570.1.2"), "{e}");
}

#[test]
fn two_installed_versions_need_the_version_from_nvml() {
    let dir = tempfile::tempdir().unwrap();
    create_stand_in_driver(dir.path(), "570.1.2").unwrap();
    create_stand_in_driver(dir.path(), V).unwrap();
    let e = discover(&root(dir.path()), None).unwrap_err().to_string();
    assert!(e.contains("570.1.2, 580.95.05"), "{e}");
    let picked = discover(&root(dir.path()), Some(V)).unwrap();
    assert!(
        picked
            .mounts()
            .iter()
            .all(|m| !m.host_path.contains("570.1.2")),
        "only the running version's files"
    );
}

#[test]
fn a_symlinked_library_dir_is_not_followed() {
    // /lib64 -> /usr/lib64 on many hosts: an absolute link that, below /driver-root, would
    // point into the plugin's own container.
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("usr/lib64");
    std::fs::create_dir_all(&real).unwrap();
    std::fs::write(real.join(format!("libnvidia-ml.so.{V}")), "x").unwrap();
    std::os::unix::fs::symlink(&real, dir.path().join("lib64")).unwrap();
    let found = discover(&root(dir.path()), Some(V)).unwrap();
    assert_eq!(
        found.files[0].relative,
        PathBuf::from(format!("usr/lib64/libnvidia-ml.so.{V}"))
    );
    assert_eq!(found.files.len(), 1);
}

#[test]
fn version_suffixes() {
    assert_eq!(
        versioned("libcuda.so.580.95.05", "libcuda").as_deref(),
        Some(V)
    );
    assert_eq!(versioned("libcuda.so.1", "libcuda"), None, "a SONAME");
    assert_eq!(versioned("libcuda.so", "libcuda"), None);
    assert_eq!(versioned("libcudadebugger.so.580.95.05", "libcuda"), None);
    assert_eq!(versioned("libcuda.so.580..05", "libcuda"), None);
}
