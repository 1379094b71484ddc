use std::fs;
use std::os::unix::fs::symlink;

use super::*;
use crate::claims::testing::MemoryApi;

/// The head of the config the GPU Operator's toolkit container writes by default
/// (NVIDIA/nvidia-container-toolkit `cmd/nvidia-ctk-installer/main_test.go`, "no args").
const OPERATOR_DEFAULT: &str = r#"accept-nvidia-visible-devices-as-volume-mounts = false
accept-nvidia-visible-devices-envvar-when-unprivileged = true
disable-require = false
supported-driver-capabilities = "compat32,compute,display,graphics,ngx,utility,video"
swarm-resource = ""

[nvidia-container-cli]
  ldconfig = "@/run/nvidia/driver/sbin/ldconfig"
  load-kmods = true
  root = "/run/nvidia/driver"

[nvidia-container-runtime]
  log-level = "info"
  mode = "auto"
  runtimes = ["docker-runc", "runc", "crun"]
"#;

/// A package install's config without the key (the toolkit's default then applies).
const WITHOUT_KEY: &str = r#"#accept-nvidia-visible-devices-as-volume-mounts = false
disable-require = false

[nvidia-container-cli]
load-kmods = true
ldconfig = "@/sbin/ldconfig.real"
"#;

fn refusing() -> String {
    OPERATOR_DEFAULT.replace(
        "accept-nvidia-visible-devices-envvar-when-unprivileged = true",
        "accept-nvidia-visible-devices-envvar-when-unprivileged = false",
    )
}

/// Writes `contents` at `rel` below `root`.
fn put(root: &Path, rel: &str, contents: &[u8]) {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, contents).unwrap();
}

const ETC: &str = TOOLKIT_CONFIG_FILES[0];
const OPERATOR: &str = TOOLKIT_CONFIG_FILES[1];

#[test]
fn the_setting_is_read_from_the_top_level_key() {
    assert_eq!(
        envvar_setting(OPERATOR_DEFAULT),
        EnvvarSetting::Accepted { explicit: true }
    );
    assert_eq!(envvar_setting(&refusing()), EnvvarSetting::Refused);
    assert_eq!(
        envvar_setting(WITHOUT_KEY),
        EnvvarSetting::Accepted { explicit: false }
    );
    assert_eq!(
        envvar_setting(""),
        EnvvarSetting::Accepted { explicit: false },
        "an empty file leaves the toolkit's default"
    );
    // The same name inside a table is not the setting.
    let nested = format!("[nvidia-container-cli]\n{ACCEPT_ENVVAR_UNPRIVILEGED} = false\n");
    assert_eq!(
        envvar_setting(&nested),
        EnvvarSetting::Accepted { explicit: false }
    );
}

#[test]
fn a_config_the_toolkit_cannot_load_is_malformed() {
    let EnvvarSetting::Malformed(why) = envvar_setting("disable-require = false\n[broken\n") else {
        panic!("not malformed");
    };
    assert!(why.contains("invalid TOML at line 2"), "{why}");
    let quoted = format!("{ACCEPT_ENVVAR_UNPRIVILEGED} = \"false\"\n");
    let EnvvarSetting::Malformed(why) = envvar_setting(&quoted) else {
        panic!("a string is not a boolean");
    };
    assert!(why.contains("is a string, not a boolean"), "{why}");
}

#[test]
fn a_config_that_accepts_the_envvar_is_posted() {
    let root = tempfile::tempdir().unwrap();
    put(root.path(), OPERATOR, OPERATOR_DEFAULT.as_bytes());
    let problems = check_toolkit_configs(root.path());
    assert_eq!(problems.len(), 1, "{problems:?}");
    let p = &problems[0];
    assert_eq!(p.check, Check::VisibleDevicesEnvvar);
    assert!(p.event);
    for want in [
        "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml",
        "is true",
        "NVIDIA_VISIBLE_DEVICES=all",
        "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED=false",
    ] {
        assert!(p.note.contains(want), "{want} missing: {}", p.note);
    }
    assert!(
        !p.note.contains(&root.path().display().to_string()),
        "the note names the host's file, not the plugin's view of it: {}",
        p.note
    );
    assert!(p.note.len() < 1000, "over the Events API's 1 kB");
}

#[test]
fn an_absent_key_is_the_toolkits_default_true() {
    let root = tempfile::tempdir().unwrap();
    put(root.path(), ETC, WITHOUT_KEY.as_bytes());
    let problems = check_toolkit_configs(root.path());
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].event);
    assert!(
        problems[0]
            .note
            .contains("/etc/nvidia-container-runtime/config.toml: accept-nvidia-visible-devices-envvar-when-unprivileged is unset, which the toolkit reads as true"),
        "{}",
        problems[0].note
    );
}

#[test]
fn false_is_no_problem() {
    let root = tempfile::tempdir().unwrap();
    put(root.path(), ETC, refusing().as_bytes());
    put(root.path(), OPERATOR, refusing().as_bytes());
    assert_eq!(check_toolkit_configs(root.path()), []);
}

#[test]
fn a_missing_config_is_no_problem() {
    let root = tempfile::tempdir().unwrap();
    assert_eq!(check_toolkit_configs(root.path()), []);
}

#[test]
fn every_config_is_checked() {
    let root = tempfile::tempdir().unwrap();
    put(root.path(), ETC, refusing().as_bytes());
    put(root.path(), OPERATOR, OPERATOR_DEFAULT.as_bytes());
    let problems = check_toolkit_configs(root.path());
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].note.contains("/usr/local/nvidia/toolkit/"));
}

#[test]
fn a_malformed_or_unreadable_config_is_logged_with_the_file_and_the_error() {
    let root = tempfile::tempdir().unwrap();
    put(
        root.path(),
        ETC,
        b"accept-nvidia-visible-devices-envvar-when-unprivileged = \n",
    );
    // A directory where the file should be: the read fails (not with NotFound).
    fs::create_dir_all(root.path().join(OPERATOR)).unwrap();
    let problems = check_toolkit_configs(root.path());
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems
            .iter()
            .all(|p| !p.event && p.check == Check::VisibleDevicesEnvvar)
    );
    assert!(
        problems[0]
            .note
            .starts_with("NVIDIA container toolkit config /etc/nvidia-container-runtime/config.toml cannot be read (invalid TOML at line 1:"),
        "{}",
        problems[0].note
    );
    assert!(
        problems[1].note.contains("/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml cannot be read (")
            && problems[1].note.to_lowercase().contains("directory"),
        "{}",
        problems[1].note
    );

    let root = tempfile::tempdir().unwrap();
    put(root.path(), ETC, b"\xff\xfe = true\n");
    let problems = check_toolkit_configs(root.path());
    assert_eq!(problems.len(), 1);
    assert!(
        problems[0].note.contains("(not UTF-8)"),
        "{}",
        problems[0].note
    );
}

/// A stand-in for a device node: a link to `/dev/null` (a character device) that needs no root.
fn device_link(dir: &Path, name: &str) {
    symlink("/dev/null", dir.join(name)).unwrap();
}

#[test]
fn present_uvm_nodes_are_no_problem() {
    let dev = tempfile::tempdir().unwrap();
    for name in UVM_NODES {
        device_link(dev.path(), name);
    }
    assert_eq!(check_uvm_nodes(&[dev.path().to_path_buf()]), None);
}

#[test]
fn missing_uvm_nodes_are_posted() {
    let dev = tempfile::tempdir().unwrap();
    let p = check_uvm_nodes(&[dev.path().to_path_buf()]).expect("both are missing");
    assert_eq!(p.check, Check::NvidiaUvm);
    assert!(p.event);
    for want in [
        "/dev/nvidia-uvm (missing), /dev/nvidia-uvm-tools (missing) not usable",
        "ContainerCreating",
        "nvidia-modprobe -u -c=0",
    ] {
        assert!(p.note.contains(want), "{want} missing: {}", p.note);
    }
    assert!(p.note.len() < 1000, "over the Events API's 1 kB");

    device_link(dev.path(), "nvidia-uvm");
    let p = check_uvm_nodes(&[dev.path().to_path_buf()]).expect("the tools node is missing");
    assert!(
        p.note
            .starts_with("/dev/nvidia-uvm-tools (missing) not usable"),
        "{}",
        p.note
    );
}

#[test]
fn a_file_that_is_not_a_device_node_does_not_count() {
    let dev = tempfile::tempdir().unwrap();
    fs::write(dev.path().join("nvidia-uvm"), b"").unwrap();
    device_link(dev.path(), "nvidia-uvm-tools");
    let p = check_uvm_nodes(&[dev.path().to_path_buf()]).expect("a regular file");
    assert!(
        p.note
            .starts_with("/dev/nvidia-uvm (not a character device) not usable"),
        "{}",
        p.note
    );
}

#[test]
fn a_node_in_any_view_of_the_hosts_dev_counts() {
    let live = tempfile::tempdir().unwrap();
    let own = tempfile::tempdir().unwrap();
    for name in UVM_NODES {
        device_link(own.path(), name);
    }
    let dirs = [live.path().to_path_buf(), own.path().to_path_buf()];
    assert_eq!(check_uvm_nodes(&dirs), None);
}

#[test]
fn the_host_root_is_the_driver_root_only_when_it_is_the_hosts_slash() {
    let view = HostView::new(Some(Path::new("/driver-root")), Some(Path::new("/")), true);
    assert_eq!(view.root.as_deref(), Some(Path::new("/driver-root")));
    assert_eq!(
        view.dev,
        [PathBuf::from("/driver-root/dev"), PathBuf::from("/dev")]
    );
    assert!(view.uvm);
    // The GPU Operator's driver container: its root is not the host's.
    let view = HostView::new(
        Some(Path::new("/driver-root")),
        Some(Path::new("/run/nvidia/driver")),
        true,
    );
    assert_eq!(view.root, None);
    assert_eq!(view.dev, [PathBuf::from("/dev")]);
    // Without --host-driver-root the driver root is its own host path.
    assert_eq!(
        HostView::new(Some(Path::new("/")), None, false)
            .root
            .as_deref(),
        Some(Path::new("/"))
    );
    let view = HostView::new(None, None, false);
    assert_eq!(view.root, None);
    assert!(!view.uvm);
}

#[test]
fn run_does_the_checks_the_view_allows() {
    let root = tempfile::tempdir().unwrap();
    put(root.path(), OPERATOR, OPERATOR_DEFAULT.as_bytes());
    fs::create_dir(root.path().join("dev")).unwrap();
    let view = HostView {
        root: Some(root.path().to_path_buf()),
        dev: vec![root.path().join("dev")],
        uvm: true,
    };
    let checks = run(&view);
    assert_eq!(checks.ran, [Check::VisibleDevicesEnvvar, Check::NvidiaUvm]);
    let found: Vec<Check> = checks.problems.iter().map(|p| p.check).collect();
    assert_eq!(found, [Check::VisibleDevicesEnvvar, Check::NvidiaUvm]);

    let checks = run(&HostView {
        root: None,
        uvm: false,
        ..view
    });
    assert_eq!(checks, NodeChecks::default());
}

#[tokio::test]
async fn report_posts_the_events_and_sets_the_gauges() {
    let api = MemoryApi::default();
    let metrics = Metrics::new();
    let checks = NodeChecks {
        ran: vec![Check::VisibleDevicesEnvvar, Check::NvidiaUvm],
        problems: vec![Problem {
            check: Check::NvidiaUvm,
            note: "uvm missing".into(),
            event: true,
        }],
    };
    report(&checks, &api, &metrics).await;
    assert_eq!(
        *api.events.lock().unwrap(),
        [("NvidiaUvmMissing".to_string(), "uvm missing".to_string())]
    );
    let text = metrics.probe.encode();
    for want in [
        r#"das_kubelet_plugin_node_setup_warning{check="nvidia_uvm"} 1"#,
        r#"das_kubelet_plugin_node_setup_warning{check="visible_devices_envvar"} 0"#,
    ] {
        assert!(text.contains(want), "{want} missing:\n{text}");
    }

    // An unreadable config: the gauge says so, no event.
    let api = MemoryApi::default();
    let checks = NodeChecks {
        ran: vec![Check::VisibleDevicesEnvvar],
        problems: vec![unreadable_config(Path::new("/etc/x.toml"), "denied")],
    };
    report(&checks, &api, &metrics).await;
    assert!(api.events.lock().unwrap().is_empty());
    assert!(
        metrics
            .probe
            .encode()
            .contains(r#"das_kubelet_plugin_node_setup_warning{check="visible_devices_envvar"} 1"#)
    );
}

#[test]
fn the_event_reasons_and_labels() {
    assert_eq!(
        Check::VisibleDevicesEnvvar.reason(),
        "ToolkitAcceptsVisibleDevicesEnvvar"
    );
    assert_eq!(Check::NvidiaUvm.reason(), "NvidiaUvmMissing");
    assert_eq!(
        Check::VisibleDevicesEnvvar.label(),
        "visible_devices_envvar"
    );
    assert_eq!(Check::NvidiaUvm.label(), "nvidia_uvm");
    let spec_nodes = [
        crate::claims::cdi::NVIDIA_UVM_PATH,
        crate::claims::cdi::NVIDIA_UVM_TOOLS_PATH,
    ];
    assert_eq!(
        spec_nodes.map(String::from),
        UVM_NODES.map(|n| format!("/dev/{n}"))
    );
}
