//! Bad command-line input to `das-controller`: refused at once with a message that says what is
//! valid, before it touches the cluster (no cluster needed).

use std::process::Command;

#[test]
fn a_bad_log_filter_is_refused_with_the_valid_levels() {
    let out = Command::new(env!("CARGO_BIN_EXE_das-controller"))
        .args([
            "--log-level=info,das_controller=verbose",
            "--kubeconfig=/nonexistent",
        ])
        .env_remove("DAS_LOG_LEVEL")
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("invalid log filter") && text.contains("levels: error, warn, info"),
        "{text}"
    );
    assert!(out.stdout.is_empty(), "logs and errors go to stderr");
}
