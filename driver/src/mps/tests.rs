//! Unit tests of the pure parts of [`super`]: the directory layout, the daemon's environment,
//! the limit commands and their check against the MIG instance, and the limits of a config. The
//! daemon's life with the stand-in is `driver/tests/mps_daemon.rs` (it runs the plugin's
//! binary).

use std::path::Path;

use super::commands::{
    LimitAboveInstance, check_against_instance, client_env, daemon_env, limit_commands,
};
use super::layout::{MpsDirs, daemon_id};
use super::*;

const MIG: &str = "MIG-5e4e8557-21de-9c5c-2c37-4564df28091f";

#[test]
fn a_daemon_has_short_distinct_directories_under_the_state_dir() {
    let uid = "0b7e8c4d-1111-2222-3333-444455556666";
    let id = daemon_id(uid, "gpu-0-mig-1g-10gb-6");
    assert_eq!(id.len(), 16);
    assert_eq!(id, daemon_id(uid, "gpu-0-mig-1g-10gb-6"), "stable");
    assert_ne!(id, daemon_id(uid, "gpu-0-mig-1g-10gb-4"));
    assert_ne!(id, daemon_id("another-uid", "gpu-0-mig-1g-10gb-6"));
    let d = MpsDirs::new(Path::new("/var/lib/das"), &id);
    assert_eq!(d.root, Path::new("/var/lib/das/mps").join(&id));
    assert_eq!(d.pipe, d.root.join("pipe"));
    assert_eq!(d.log, d.root.join("log"));
    assert_eq!(d.shm, d.root.join("shm"));
    assert_eq!(d.pid_file, d.root.join("daemon.pid"));
    assert_eq!(d.control_socket(), d.pipe.join("control"));
    // The default state dir leaves room in a unix socket address (108 bytes with its NUL).
    assert!(d.control_socket().as_os_str().len() < 80);
}

#[test]
fn the_daemon_sees_only_its_slice_and_its_own_directories() {
    let d = MpsDirs::new(Path::new("/s"), "abc");
    let env = daemon_env(&d, MIG);
    assert_eq!(
        env,
        [
            ("CUDA_VISIBLE_DEVICES".to_string(), MIG.to_string()),
            (
                "CUDA_MPS_PIPE_DIRECTORY".to_string(),
                "/s/mps/abc/pipe".to_string()
            ),
            (
                "CUDA_MPS_LOG_DIRECTORY".to_string(),
                "/s/mps/abc/log".to_string()
            ),
        ]
    );
    assert_eq!(client_env(&d), env[1..]);
}

#[test]
fn limits_become_nvidias_control_commands() {
    let both = MpsLimits {
        active_thread_percentage: Some(50),
        pinned_device_memory_limit_mib: Some(2048),
    };
    // The memory limit names device 0, the MIG instance, the one device the daemon sees.
    assert_eq!(
        limit_commands(&both),
        [
            "set_default_active_thread_percentage 50".to_string(),
            "set_default_device_pinned_mem_limit 0 2048M".to_string(),
        ]
    );
    assert!(limit_commands(&MpsLimits::default()).is_empty());
    let memory_only = MpsLimits {
        pinned_device_memory_limit_mib: Some(1),
        ..MpsLimits::default()
    };
    assert_eq!(
        limit_commands(&memory_only),
        ["set_default_device_pinned_mem_limit 0 1M".to_string()]
    );
}

#[test]
fn a_pinned_limit_above_the_slice_is_refused_with_the_valid_range() {
    let limits = |mib| MpsLimits {
        pinned_device_memory_limit_mib: Some(mib),
        ..MpsLimits::default()
    };
    assert_eq!(
        check_against_instance(&limits(9984), "1g.10gb", 9984),
        Ok(())
    );
    assert_eq!(
        check_against_instance(&limits(20480), "1g.10gb", 9984),
        Err(LimitAboveInstance {
            limit_mib: 20480,
            profile: "1g.10gb".into(),
            instance_mib: 9984
        })
    );
    assert_eq!(
        check_against_instance(&limits(20480), "1g.10gb", 9984)
            .unwrap_err()
            .to_string(),
        "sharing.mps.pinnedDeviceMemoryLimit is 20480Mi, more than the 9984Mi of a 1g.10gb slice; valid: 1Mi to 9984Mi"
    );
    assert_eq!(
        check_against_instance(&MpsLimits::default(), "1g.10gb", 1),
        Ok(())
    );
}

#[test]
fn limits_come_from_the_config_and_round_trip_as_the_checkpoint_writes_them() {
    let config: das_api::device_config::MpsConfig = serde_json::from_value(
        serde_json::json!({"activeThreadPercentage": 25, "pinnedDeviceMemoryLimit": "1.5Gi"}),
    )
    .unwrap();
    let limits = MpsLimits::from_config(&config).unwrap();
    assert_eq!(
        limits,
        MpsLimits {
            active_thread_percentage: Some(25),
            pinned_device_memory_limit_mib: Some(1536),
        }
    );
    let json = serde_json::to_value(&limits).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"activeThreadPercentage": 25, "pinnedDeviceMemoryLimitMiB": 1536})
    );
    assert_eq!(serde_json::from_value::<MpsLimits>(json).unwrap(), limits);
    assert_eq!(
        serde_json::to_value(MpsLimits::default()).unwrap(),
        serde_json::json!({})
    );
}

#[test]
fn the_stand_in_answers_the_percentage_it_was_given() {
    let mut record = stand_in::Record::default();
    record.runs.push(stand_in::Run::default());
    let ask = "get_default_active_thread_percentage";
    assert_eq!(stand_in_answer(&record, ask).as_deref(), Some("100.0"));
    record.runs[0]
        .commands
        .push("set_default_active_thread_percentage 30".into());
    assert_eq!(stand_in_answer(&record, ask).as_deref(), Some("30.0"));
    assert_eq!(stand_in_answer(&record, "quit"), None);
    assert_eq!(
        stand_in_answer(&record, "set_default_active_thread_percentage 40").as_deref(),
        Some("40.0")
    );
    assert_eq!(
        stand_in_answer(&record, "bogus 1").as_deref(),
        Some("Unknown command \"bogus 1\"")
    );
}

#[test]
fn the_stand_in_takes_a_pinned_limit_for_device_0_only_and_reads_it_back() {
    let mut record = stand_in::Record::default();
    record.runs.push(stand_in::Run::default());
    let ask = "get_default_device_pinned_mem_limit 0";
    assert_eq!(stand_in_answer(&record, ask).as_deref(), Some("0"));
    let set = "set_default_device_pinned_mem_limit 0 2048M";
    assert_eq!(stand_in_answer(&record, set), None);
    record.runs[0].commands.push(set.into());
    assert_eq!(stand_in_answer(&record, ask).as_deref(), Some("2048M"));
    // A UUID (or another ordinal) is refused: NVIDIA's daemon would take it and set nothing.
    for other in [
        format!("set_default_device_pinned_mem_limit {MIG} 2048M"),
        "get_default_device_pinned_mem_limit 1".to_string(),
    ] {
        let answer = stand_in_answer(&record, &other).unwrap();
        assert!(control::refused(&answer), "{other}: {answer}");
    }
}

#[test]
fn a_refusal_is_told_by_the_answer_not_the_status() {
    assert!(control::refused("Unknown command \"bogus_command\""));
    assert!(!control::refused("30.0"));
    assert!(!control::refused("2G"));
    assert!(!control::refused(""));
}

fn stand_in_answer(record: &stand_in::Record, command: &str) -> Option<String> {
    stand_in::answer_for_tests(record, command)
}

#[test]
fn a_state_dir_too_long_for_the_control_socket_is_refused_with_the_longest_that_fits() {
    use super::layout::{SOCKET_PATH_MAX, check_socket_path};
    // `<state dir>/mps/<16 hex digits>/pipe/control`: 34 bytes after the state dir.
    let fits = format!("/{}", "s".repeat(SOCKET_PATH_MAX - 34 - 1));
    assert_eq!(
        check_socket_path(std::path::Path::new(&fits), Protocol::V2),
        Ok(())
    );
    let long = format!("{fits}x");
    let e = check_socket_path(std::path::Path::new(&long), Protocol::V2).unwrap_err();
    assert_eq!((e.len, e.max_state_dir), (SOCKET_PATH_MAX + 1, fits.len()));
    assert!(e.to_string().contains("--state-dir"), "{e}");
}

mod shm;
mod v3;
