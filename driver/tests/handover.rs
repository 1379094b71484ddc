//! The hand-over between plugin instances as the binary and the chart do it (issue 30 item 4),
//! without a cluster:
//!
//! - `das-kubelet-plugin` checks what can fail on its node (the GPU backend, the inventory, the
//!   driver's files) before it asks the node's active instance to hand over. The tests hold
//!   `plugin.lock` as an active instance would, and run the binary against a stand-in API server
//!   that answers `/version` (the binary's first, node-independent check);
//! - the chart's grace period covers the plugin's longest shutdown.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use das_driver::plugin::handover::{Active, SHUTDOWN_LIMIT};

/// How long a start-up that fails its checks may take (it fails at once; the bound is slack).
const FAIL_WITHIN: Duration = Duration::from_secs(30);

/// An HTTP server on 127.0.0.1 answering every request with a Kubernetes 1.34 `/version`.
fn version_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let body = r#"{"major":"1","minor":"34","gitVersion":"v1.34.0","gitCommit":"0","gitTreeState":"clean","buildDate":"2025-01-01T00:00:00Z","goVersion":"go1.24","compiler":"gc","platform":"linux/amd64"}"#;
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    address
}

fn kubeconfig(dir: &Path, server: &str) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    path
}

/// Starts the plugin for node `n0` with its state dir at `<dir>/state` and `extra` flags.
fn start_plugin(dir: &Path, extra: &[&str]) -> Child {
    let kubeconfig = kubeconfig(dir, &version_server());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_das-kubelet-plugin"));
    for var in [
        "NODE_NAME",
        "KUBECONFIG",
        "DAS_EMULATED_GPUS",
        "DAS_EMULATED_DEVICE_DIR",
        "DAS_DRIVER_ROOT",
        "DAS_HOST_DRIVER_ROOT",
        "DAS_PROC_ROOT",
        "DAS_STATE_DIR",
        "DAS_METRICS_ADDRESS",
    ] {
        cmd.env_remove(var);
    }
    cmd.arg("--node-name=n0")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--state-dir={}", dir.join("state").display()))
        .arg(format!("--cdi-dir={}", dir.join("cdi").display()))
        .arg(format!(
            "--kubelet-registry-dir={}",
            dir.join("registry").display()
        ))
        .arg(format!(
            "--kubelet-plugins-dir={}",
            dir.join("plugins").display()
        ))
        .arg("--metrics-address=127.0.0.1:0")
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs")
}

/// Waits for the plugin to exit, at most `limit`, and returns its exit code and output; panics
/// (the plugin killed) when it asks `active` to hand over first, or still runs after `limit`.
fn exit_without_asking(mut child: Child, active: &Active, limit: Duration) -> (i32, String) {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        let asked = active.handover_requested();
        if asked || Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{}",
                if asked {
                    "the plugin asked the active instance to hand over before its GPUs were open"
                } else {
                    "the plugin still runs"
                }
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    (out.status.code().unwrap_or(-1), text)
}

/// An active instance on the node: holds `<dir>/state/plugin.lock`.
fn active_instance(dir: &Path) -> Active {
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    Active::try_acquire(&state).unwrap().expect("free lock")
}

fn fails_before_asking(extra: &[&str], expected: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let active = active_instance(dir.path());
    let plugin = start_plugin(dir.path(), extra);
    let (code, text) = exit_without_asking(plugin, &active, FAIL_WITHIN);
    assert_ne!(code, 0, "{text}");
    assert!(
        expected.iter().any(|e| text.contains(e)),
        "fails on its GPUs, not elsewhere: {text}"
    );
    assert!(!text.contains("waiting for it to hand over"), "{text}");
    assert!(
        !active.handover_requested(),
        "the active instance was never asked to hand over"
    );
}

/// A bad emulated GPU spec: the emulated backend cannot be opened.
#[test]
fn a_plugin_whose_emulated_gpus_cannot_be_opened_never_asks_for_the_node() {
    fails_before_asking(&["--emulated-gpus=V100:1"], &["unknown GPU model V100"]);
}

/// Real GPUs: without the NVIDIA driver NVML cannot be initialised; with it (a GPU machine), the
/// `nvidia-caps` major cannot be read from a procfs root that does not exist. Either way the
/// backend fails to open, read-only, before the node is asked for.
#[test]
fn a_plugin_whose_nvml_backend_cannot_be_opened_never_asks_for_the_node() {
    fails_before_asking(
        &["--proc-root=/nonexistent-das-proc"],
        &["initialise NVML", "nvidia-caps"],
    );
}

/// The control: with GPUs that open, the same set-up reaches the hand-over (so the failures
/// above are the GPUs', not the stand-in API server's).
#[test]
fn a_plugin_whose_gpus_open_asks_the_active_instance_to_hand_over() {
    let dir = tempfile::tempdir().unwrap();
    let active = active_instance(dir.path());
    let mut plugin = start_plugin(dir.path(), &["--emulated-gpus=A100-SXM4-40GB:1"]);
    let deadline = Instant::now() + FAIL_WITHIN;
    while !active.handover_requested() {
        if let Some(status) = plugin.try_wait().unwrap() {
            let out = plugin.wait_with_output().unwrap();
            panic!(
                "the plugin exited ({status}) instead of waiting: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(Instant::now() < deadline, "the plugin never asked");
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = plugin.kill();
    let _ = plugin.wait();
}

/// The kubelet must not kill a plugin that is still draining: the chart's
/// `terminationGracePeriodSeconds` exceeds the plugin's longest shutdown (calls in flight, then
/// background tasks), with room for its gRPC servers to stop.
#[test]
fn the_charts_grace_period_covers_the_plugins_longest_shutdown() {
    let chart = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/helm/das/templates/kubeletplugin-daemonset.yaml"
    );
    let text = std::fs::read_to_string(chart).unwrap();
    let grace: Vec<u64> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("terminationGracePeriodSeconds:"))
        .map(|v| v.trim().parse().expect("a number of seconds"))
        .collect();
    assert_eq!(grace.len(), 1, "one grace period in {chart}");
    let room = Duration::from_secs(10);
    assert!(
        Duration::from_secs(grace[0]) >= SHUTDOWN_LIMIT + room,
        "terminationGracePeriodSeconds {} < {SHUTDOWN_LIMIT:?} + {room:?}",
        grace[0]
    );
}
