use super::*;

#[test]
fn nvidia_smi_is_asked_as_nvidias_driver_asks_it() {
    assert_eq!(
        nvidia_smi_args("GPU-1", TimeSliceInterval::Medium),
        ["compute-policy", "-i", "GPU-1", "--set-timeslice", "2"]
    );
    assert_eq!(
        nvidia_smi_args("GPU-1", TimeSliceInterval::Default)
            .last()
            .map(String::as_str),
        Some("0")
    );
}

#[test]
fn nvidia_smis_exit_status_says_what_went_wrong() {
    let t = || Target::gpu(0);
    assert!(nvidia_smi_result(t(), Some(0), b"", b"").is_ok());
    match nvidia_smi_result(t(), Some(3), b"Setting time slice is not supported", b"") {
        Err(BackendError::NotSupported { reason, .. }) => {
            assert!(reason.contains("not supported"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    match nvidia_smi_result(t(), Some(4), b"", b"Insufficient Permissions") {
        Err(BackendError::Other { reason, .. }) => {
            assert_eq!(
                reason,
                "nvidia-smi compute-policy exited with status 4: Insufficient Permissions"
            )
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        nvidia_smi_result(t(), None, b"", b""),
        Err(BackendError::Other { reason, .. }) if reason.contains("a signal")
    ));
}

#[test]
fn a_program_that_cannot_run_is_an_error_and_none_is_refused() {
    let missing = TimeSlicer::NvidiaSmi {
        program: "/nonexistent/nvidia-smi".into(),
        library_dir: None,
    };
    assert!(matches!(
        missing.set(0, "GPU-1", TimeSliceInterval::Short),
        Err(BackendError::Other { reason, .. }) if reason.starts_with("run /nonexistent/nvidia-smi")
    ));
    assert!(!TimeSlicer::Unavailable.available());
    assert!(matches!(
        TimeSlicer::Unavailable.set(0, "GPU-1", TimeSliceInterval::Short),
        Err(BackendError::NotSupported { reason, .. }) if reason == NO_NVIDIA_SMI
    ));
}
