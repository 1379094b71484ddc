//! What every DAS binary does with bad start-up input, before it touches a cluster: a malformed
//! log filter is refused with exit status 2 and a message that lists the valid levels, on stderr
//! (the three binaries share `das_runtime::process::start`). Needs the debug binaries
//! (`make e2e` builds them), no cluster.

use std::process::Command;

use das_e2e::install::DasBinary;

#[test]
fn every_binary_refuses_a_bad_log_filter_with_the_valid_levels() {
    for bin in [DasBinary::Plugin, DasBinary::Controller, DasBinary::Webhook] {
        let path = bin.debug().expect("built by make e2e");
        let out = Command::new(&path)
            .args(["--log-level=info,das=verbose", "--kubeconfig=/nonexistent"])
            .env_remove("DAS_LOG_LEVEL")
            // The plugin requires a node name before it reads the filter.
            .env("NODE_NAME", "n0")
            .output()
            .expect("runs");
        let text = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{}: {text}", bin.name());
        assert!(
            text.starts_with(&format!("{}: invalid log filter", bin.name()))
                && text.contains("levels: error, warn, info, debug, trace, off"),
            "{}: {text}",
            bin.name()
        );
        assert!(out.stdout.is_empty(), "{}: errors go to stderr", bin.name());
    }
}
