//! Bad command-line input to `das-kubelet-plugin`: refused at once, with a message that says
//! what is wrong and what is valid (no cluster needed).

use std::process::Command;

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_das-kubelet-plugin"))
        .args(args)
        .env_remove("NODE_NAME")
        .env_remove("DAS_EMULATED_GPUS")
        .env_remove("DAS_WHOLE_GPUS")
        .output()
        .expect("runs");
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn an_unknown_gpu_model_names_the_valid_ones() {
    let (code, text) = run(&["--print-inventory", "--emulated-gpus=V100:2"]);
    assert_ne!(code, 0);
    assert!(
        text.contains("unknown GPU model V100") && text.contains("H100"),
        "{text}"
    );
}

#[test]
fn a_bad_count_says_the_range() {
    let (code, text) = run(&["--print-inventory", "--emulated-gpus=A30:0"]);
    assert_ne!(code, 0);
    assert!(text.contains("not an integer in 1..=32"), "{text}");
}

#[test]
fn bad_flags_are_refused_by_the_parser() {
    let (code, text) = run(&["--metrics-address=not-an-address", "--node-name=n0"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("--metrics-address"), "{text}");
    let (code, text) = run(&["--cdi-device-nodes=maybe", "--node-name=n0"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("possible values") || text.contains("true"),
        "{text}"
    );
    let (code, text) = run(&[]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("--node-name"),
        "a missing node name is named: {text}"
    );
}

#[test]
fn the_emulated_inventory_prints_without_a_cluster() {
    let (code, text) = run(&["--print-inventory", "--emulated-gpus=A100-SXM4-40GB:1"]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("GPU 0: ") && text.contains("1g.5gb"),
        "{text}"
    );
}

#[test]
fn a_bad_log_filter_is_refused_not_ignored() {
    let (code, text) = run(&[
        "--print-inventory",
        "--emulated-gpus=A30:1",
        "--log-level=loud",
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("invalid log filter \"loud\"") && text.contains("levels: error"),
        "{text}"
    );
}

#[test]
fn a_bad_mig_mode_says_the_valid_form() {
    let (code, text) = run(&["--print-inventory", "--emulated-gpus=A30:1:whole"]);
    assert_ne!(code, 0);
    assert!(
        text.contains("MIG mode \"whole\" is not mig-on or mig-off")
            && text.contains("MODEL[:COUNT[:mig-on|mig-off]]"),
        "{text}"
    );
}

/// The devices `--print-resource-slices` prints with `args` and the environment `env`.
fn printed_devices(args: &[&str], env: &[(&str, &str)]) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_das-kubelet-plugin"))
        .arg("--print-resource-slices")
        .args(args)
        .env_remove("NODE_NAME")
        .env_remove("DAS_EMULATED_GPUS")
        .env_remove("DAS_WHOLE_GPUS")
        .envs(env.iter().copied())
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON List");
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .map(|d| d["name"].as_str().expect("a name").to_string())
        .collect()
}

#[test]
fn whole_gpus_are_published_only_with_the_flag() {
    let spec = "--emulated-gpus=A100-SXM4-40GB:1:mig-off,A30:1";
    let without = printed_devices(&[spec], &[]);
    assert!(!without.is_empty());
    assert!(
        without.iter().all(|n| n.starts_with("gpu-1-mig-")),
        "{without:?}"
    );
    let with = printed_devices(&[spec, "--whole-gpus"], &[]);
    assert_eq!(with.iter().filter(|n| *n == "gpu-0").count(), 1, "{with:?}");
    assert_eq!(with.len(), without.len() + 1);
    // The environment variable does the same.
    assert_eq!(
        printed_devices(&[spec], &[("DAS_WHOLE_GPUS", "true")]),
        with
    );
    assert_eq!(
        printed_devices(&[spec], &[("DAS_WHOLE_GPUS", "false")]),
        without
    );
}

#[test]
fn the_emulated_inventory_shows_what_each_gpu_serves() {
    let spec = "--emulated-gpus=A30:1:mig-off,A30:1";
    let (code, text) = run(&["--print-inventory", spec]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("MIG off") && text.contains("serves nothing (MIG off, no --whole-gpus)"),
        "{text}"
    );
    let (code, text) = run(&["--print-inventory", spec, "--whole-gpus"]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("serves whole GPU") && text.contains("serves MIG slices"),
        "{text}"
    );
}

/// A mixed node (`L4:1,H100-80GB:1`): the L4 has no MIG, so it serves nothing without
/// --whole-gpus and its whole GPU `gpu-0`, listed first, with it; `:mig-on` is refused for it.
#[test]
fn a_gpu_without_mig_is_served_whole_with_the_flag() {
    let spec = "--emulated-gpus=L4:1,H100-80GB:1";
    let (code, text) = run(&["--print-inventory", spec]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("NVIDIA L4")
            && text.contains("MIG none model L4 profiles none (no MIG: served whole)")
            && text.contains("serves nothing (no MIG, no --whole-gpus)"),
        "{text}"
    );
    let (code, text) = run(&["--print-inventory", spec, "--whole-gpus"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("serves whole GPU"), "{text}");
    let without = printed_devices(&[spec], &[]);
    assert!(
        !without.is_empty() && without.iter().all(|n| n.starts_with("gpu-1-mig-")),
        "{without:?}"
    );
    let with = printed_devices(&[spec, "--whole-gpus"], &[]);
    assert_eq!(with[0], "gpu-0", "{with:?}");
    assert_eq!(with[1..], without[..]);
    let (code, text) = run(&["--print-inventory", "--emulated-gpus=L4:1:mig-on"]);
    assert_ne!(code, 0);
    assert!(text.contains("L4 has no MIG"), "{text}");
}
