//! Protocol 3 (NVIDIA's MPS v3 interface), pure parts: choosing the protocol, the names, the
//! commands, a namespace's limits, the directory a container mounts, and the stand-in's model
//! of the daemon.

use std::path::Path;

use crate::mps::MpsLimits;
use crate::mps::commands::*;
use crate::mps::layout::{MpsDirs, SOCKET_PATH_MAX, check_socket_path};
use crate::mps::stand_in::model::{self, Effect, Run, valid_name};

const MIG: &str = "MIG-5e4e8557-21de-9c5c-2c37-4564df28091f";

fn words(c: &[String]) -> String {
    c.join(" ")
}

#[test]
fn auto_picks_protocol_3_from_driver_615_on() {
    let auto = ProtocolChoice::parse("auto").unwrap();
    assert_eq!(auto, ProtocolChoice::Auto);
    assert_eq!(auto.resolve(Some("615.0.1")), Protocol::V3);
    assert_eq!(auto.resolve(Some("620.10")), Protocol::V3);
    assert_eq!(
        auto.resolve(Some("580.95.05")),
        Protocol::V2,
        "emulated GPUs"
    );
    assert_eq!(auto.resolve(None), Protocol::V2);
    assert_eq!(auto.resolve(Some("unknown")), Protocol::V2);
    let three = ProtocolChoice::parse(" 3 ").unwrap();
    assert_eq!(
        three.resolve(Some("580.95.05")),
        Protocol::V3,
        "the flag wins"
    );
    assert_eq!(
        ProtocolChoice::parse("2").unwrap().resolve(Some("620.1")),
        Protocol::V2
    );
    let e = ProtocolChoice::parse("v3").unwrap_err().to_string();
    assert!(e.contains("valid: auto") && e.contains("2 or 3"), "{e}");
}

#[test]
fn a_namespace_is_named_after_its_claim_and_device_as_nvidia_allows() {
    let a = namespace_name(
        "0b7e8c4d-1111-2222-3333-444455556666",
        "gpu-0-mig-1g-10gb-6",
    );
    assert_eq!(a.len(), 17);
    assert!(a.starts_with('c') && valid_name(&a), "{a}");
    assert!(valid_name(SERVER));
    assert_eq!(
        a,
        namespace_name(
            "0b7e8c4d-1111-2222-3333-444455556666",
            "gpu-0-mig-1g-10gb-6"
        )
    );
    assert_ne!(a, namespace_name("another", "gpu-0-mig-1g-10gb-6"));
    assert_ne!(
        a,
        namespace_name(
            "0b7e8c4d-1111-2222-3333-444455556666",
            "gpu-0-mig-1g-10gb-5"
        )
    );
    for bad in ["", "Upper", "with-dash", &"x".repeat(65)] {
        assert!(!valid_name(bad), "{bad}");
    }
}

#[test]
fn the_daemon_server_and_namespaces_get_nvidias_v3_commands() {
    assert_eq!(daemon_args(Protocol::V2), ["-f"]);
    assert_eq!(daemon_args(Protocol::V3), ["-f", "-p", "3"]);
    assert_eq!(words(&v3_server_list()), "server list");
    assert_eq!(
        words(&v3_server_create(MIG)),
        format!("server create slice --allowed-devices={MIG}")
    );
    let both = MpsLimits {
        active_thread_percentage: Some(40),
        pinned_device_memory_limit_mib: Some(2048),
    };
    assert_eq!(
        words(&v3_server_set(&both).unwrap()),
        "server set slice --active-thread-percentage=40 --pinned-memory-limit=2048M"
    );
    assert_eq!(v3_server_set(&MpsLimits::default()), None);
    let ns = Namespace {
        name: "c0123456789abcdef".into(),
        limits: both,
    };
    assert_eq!(
        words(&v3_namespace_create(&ns.name)),
        "namespace create c0123456789abcdef --server=slice"
    );
    assert_eq!(
        words(&v3_namespace_set(&ns).unwrap()),
        "namespace set c0123456789abcdef --server=slice --active-thread-percentage=40 --pinned-memory-limit=2048M"
    );
    assert_eq!(
        words(&v3_namespace_delete(&ns.name)),
        "namespace delete c0123456789abcdef --server=slice"
    );
    assert_eq!(words(&v3_namespace_list()), "namespace list --server=slice");
}

#[test]
fn a_list_names_a_server_only_as_a_whole_word() {
    assert!(listed("slice\nother", "slice"));
    assert!(listed("Servers: slice (running)", "slice"));
    assert!(!listed("slice_2", "slice"));
    assert!(!listed("", "slice"));
}

#[test]
fn a_shares_namespace_gets_the_tighter_of_its_slices_limits_and_its_part() {
    let config = MpsLimits {
        active_thread_percentage: Some(40),
        pinned_device_memory_limit_mib: Some(4096),
    };
    // A claim's own namespace: its config.
    assert_eq!(namespace_limits(&config, None), config);
    // A share of a quarter of a MIG instance with 2560 MiB: its part is tighter on memory, the
    // config on compute.
    assert_eq!(
        namespace_limits(&config, Some((25, 2560))),
        MpsLimits {
            active_thread_percentage: Some(25),
            pinned_device_memory_limit_mib: Some(2560),
        }
    );
    assert_eq!(
        namespace_limits(&config, Some((50, 8192))),
        MpsLimits {
            active_thread_percentage: Some(40),
            pinned_device_memory_limit_mib: Some(4096),
        }
    );
    // Without a config a share still gets its part: a namespace without limits would get the
    // whole MIG instance (named namespaces do not inherit the server's).
    assert_eq!(
        namespace_limits(&MpsLimits::default(), Some((25, 2560))),
        MpsLimits {
            active_thread_percentage: Some(25),
            pinned_device_memory_limit_mib: Some(2560),
        }
    );
}

#[test]
fn a_container_mounts_the_daemons_pipe_directory_or_only_its_namespace() {
    let d = MpsDirs::new(Path::new("/var/lib/das"), "0123456789abcdef");
    assert_eq!(d.client_pipe_dir(Protocol::V2, "cx"), d.pipe);
    assert_eq!(
        d.client_pipe_dir(Protocol::V3, "cx"),
        Path::new("/var/lib/das/mps/0123456789abcdef/pipe/slice/cx")
    );
}

#[test]
fn protocol_3_needs_a_shorter_state_dir_for_the_namespaces_sockets() {
    // `<state dir>/mps/<16>/pipe/slice/c<16>/control`: 58 bytes after the state dir.
    let fits = format!("/{}", "s".repeat(SOCKET_PATH_MAX - 58 - 1));
    assert_eq!(check_socket_path(Path::new(&fits), Protocol::V3), Ok(()));
    let long = format!("{fits}x");
    let e = check_socket_path(Path::new(&long), Protocol::V3).unwrap_err();
    assert_eq!(e.max_state_dir, fits.len());
    assert_eq!(check_socket_path(Path::new(&long), Protocol::V2), Ok(()));
    // The default state dir fits either way.
    assert_eq!(
        check_socket_path(Path::new("/var/lib/das"), Protocol::V3),
        Ok(())
    );
}

fn v3_run() -> Run {
    Run {
        visible_devices: MIG.into(),
        protocol: 3,
        ..Run::default()
    }
}

fn ask(run: &mut Run, command: &str) -> (Option<String>, Vec<Effect>) {
    model::answer(run, command)
}

#[test]
fn the_stand_ins_server_runs_only_on_the_device_it_sees() {
    let mut run = v3_run();
    // Allowed a device it does not see: created, exits, not listed (NVIDIA's silent fallback).
    let (a, effects) = ask(&mut run, "server create slice --allowed-devices=GPU-absent");
    assert_eq!((a, effects), (None, Vec::new()));
    assert!(!run.servers["slice"].running);
    assert_eq!(ask(&mut run, "server list").0.as_deref(), Some(""));
    let mut run = v3_run();
    let (a, effects) = ask(
        &mut run,
        &format!("server create slice --allowed-devices={MIG}"),
    );
    assert_eq!(a, None);
    assert_eq!(effects, [Effect::Listen("slice".into())]);
    assert_eq!(ask(&mut run, "server list").0.as_deref(), Some("slice"));
    let again = ask(
        &mut run,
        &format!("server create slice --allowed-devices={MIG}"),
    )
    .0;
    assert!(again.unwrap().starts_with("Error"));
    assert!(
        ask(&mut run, "server create Bad-Name")
            .0
            .unwrap()
            .starts_with("Error"),
        "NVIDIA's name rules"
    );
}

#[test]
fn the_stand_in_keeps_each_namespaces_limits_and_answers_its_clients_with_them() {
    let mut run = v3_run();
    ask(
        &mut run,
        &format!("server create slice --allowed-devices={MIG}"),
    );
    assert_eq!(
        ask(&mut run, "server set slice --active-thread-percentage=50").0,
        None
    );
    let (a, effects) = ask(&mut run, "namespace create ca --server=slice");
    assert_eq!(
        (a, effects),
        (None, vec![Effect::Listen("slice/ca".into())])
    );
    assert_eq!(
        ask(
            &mut run,
            "namespace set ca --server=slice --active-thread-percentage=25 --pinned-memory-limit=2560M"
        )
        .0,
        None
    );
    ask(&mut run, "namespace create cb --server=slice");
    assert_eq!(
        ask(&mut run, "namespace list --server=slice").0.as_deref(),
        Some("ca\ncb")
    );
    let ns = &run.servers["slice"].namespaces["ca"];
    assert_eq!(ns.active_thread_percentage.as_deref(), Some("25"));
    assert_eq!(ns.pinned_memory_limit.as_deref(), Some("2560M"));
    let get = "get_default_active_thread_percentage";
    assert_eq!(model::answer_namespace(&run, "slice/ca", get), "25.0");
    assert_eq!(model::answer_namespace(&run, "slice/cb", get), "100.0");
    assert_eq!(model::answer_namespace(&run, "slice", get), "50.0");
    // Bad limits and unknown namespaces are errors, as the real daemon's would be.
    for bad in [
        "namespace set ca --server=slice --active-thread-percentage=0",
        "namespace set ca --server=slice --pinned-memory-limit=2Gi",
        "namespace set cz --server=slice --active-thread-percentage=10",
        "namespace create cc --server=other",
    ] {
        let a = ask(&mut run, bad).0.unwrap_or_default();
        assert!(a.starts_with("Error"), "{bad}: {a}");
    }
    let (a, effects) = ask(&mut run, "namespace delete ca --server=slice");
    assert_eq!(
        (a, effects),
        (None, vec![Effect::Unlisten("slice/ca".into())])
    );
    assert_eq!(
        ask(&mut run, "namespace list --server=slice").0.as_deref(),
        Some("cb")
    );
}

#[test]
fn a_protocol_3_stand_in_refuses_protocol_2_commands_and_the_reverse() {
    let mut run = v3_run();
    let a = ask(&mut run, "set_default_active_thread_percentage 30")
        .0
        .unwrap();
    assert!(crate::mps::control::refused(&a), "{a}");
    let mut v2 = Run {
        protocol: 2,
        ..Run::default()
    };
    let a = ask(&mut v2, "server list").0.unwrap();
    assert!(crate::mps::control::refused(&a), "{a}");
    assert_eq!(ask(&mut run, "quit").0, None);
}
