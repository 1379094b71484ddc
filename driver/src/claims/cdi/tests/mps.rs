//! The CDI edits of a device served with MPS (docs/design.md §7, "MPS on a slice"): the
//! variable, the pipe directory and the shm directory, only on that device.

use serde_json::json;

use super::super::*;
use super::{UID, one};
use crate::claims::checkpoint::RecordedDevice;
use crate::claims::layers::mps::cdi::add_mps_mounts;

fn mounts() -> MpsMounts {
    MpsMounts {
        pipe_dir: "/var/lib/das/mps/0123456789abcdef/pipe".into(),
        pipe_read_only: true,
        shm_dir: "/var/lib/das/mps/0123456789abcdef/shm".into(),
        share: None,
    }
}

#[test]
fn a_share_of_a_shared_slice_gets_its_limits_in_the_environment() {
    let mut share = one("share", 0, 1, 0);
    share.mps = Some(MpsMounts {
        share: Some(ShareLimits {
            thread_percentage: 25,
            pinned_memory_mib: 2560,
        }),
        ..mounts()
    });
    let built = build_claim_spec(UID, &[share]).unwrap();
    let value = serde_json::to_value(&built.spec).unwrap();
    let env = value["devices"][0]["containerEdits"]["env"]
        .as_array()
        .unwrap();
    let env: Vec<&str> = env.iter().filter_map(|v| v.as_str()).collect();
    assert!(
        env.contains(&"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"),
        "{env:?}"
    );
    assert!(
        env.contains(&"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25"),
        "{env:?}"
    );
    assert!(
        env.contains(&"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2560M"),
        "{env:?}"
    );
}

#[test]
fn an_mps_device_gets_the_pipe_directory_its_variable_and_the_shm_directory() {
    let mut shared = one("shared", 0, 1, 0);
    shared.mps = Some(mounts());
    let built = build_claim_spec(UID, &[shared, one("alone", 0, 2, 0)]).unwrap();
    let value = serde_json::to_value(&built.spec).unwrap();
    let edits = &value["devices"][0]["containerEdits"];
    assert_eq!(
        edits["env"][1],
        json!("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps")
    );
    assert_eq!(
        edits["mounts"],
        json!([
            {"hostPath": "/var/lib/das/mps/0123456789abcdef/pipe", "containerPath": "/tmp/nvidia-mps",
             "options": ["ro", "nosuid", "nodev", "bind"]},
            {"hostPath": "/var/lib/das/mps/0123456789abcdef/shm", "containerPath": "/dev/shm",
             "options": ["rw", "nosuid", "nodev", "noexec", "bind"]},
        ])
    );
    // The exclusive device of the same claim gets neither.
    let other = &value["devices"][1]["containerEdits"];
    assert_eq!(other["env"].as_array().unwrap().len(), 1);
    assert!(other.get("mounts").is_none(), "{other}");
    // Bind mounts without a type: the spec still needs no more than the version it had.
    assert_eq!(value["cdiVersion"], "0.5.0");
}

#[test]
fn the_pipe_directory_is_read_only_unless_the_escape_hatch_says_rw() {
    let ro = mounts().mounts();
    assert_eq!(ro[0].options, ["ro", "nosuid", "nodev", "bind"]);
    let rw = MpsMounts {
        pipe_read_only: false,
        ..mounts()
    }
    .mounts();
    assert_eq!(rw[0].options, ["rw", "nosuid", "nodev", "bind"]);
    // The shm directory is the containers' to write either way.
    assert_eq!(ro[1].options, ["rw", "nosuid", "nodev", "noexec", "bind"]);
    assert_eq!(rw[1].options, ro[1].options);
}

#[test]
fn only_the_devices_recorded_with_mps_get_the_mounts() {
    let device = |name: &str, mps: bool| RecordedDevice {
        time_slice: None,
        acquired: false,
        kind: Default::default(),
        request: "r".into(),
        pool: "n0".into(),
        device: name.into(),
        gpu_index: 0,
        gpu_uuid: "GPU-0".into(),
        profile: "1g.10gb".into(),
        placement_start: 0,
        placement_size: 1,
        instance: None,
        mps: mps.then(crate::mps::MpsLimits::default),
        share: None,
    };
    let devices = [
        device("gpu-0-mig-1g-10gb-1", true),
        device("gpu-0-mig-1g-10gb-2", false),
    ];
    let mut specs = vec![one("r", 0, 1, 0), one("r", 1, 2, 0)];
    add_mps_mounts(&mut specs, &devices, |d| {
        assert_eq!(d.device, "gpu-0-mig-1g-10gb-1");
        mounts()
    });
    assert_eq!(specs[0].mps, Some(mounts()));
    assert_eq!(specs[1].mps, None);
}
