//! Which MPS memory limits a real NVIDIA driver enforces (issue 43, "when a GPU is lent";
//! docs/design.md §7, "Memory slices of a whole GPU", the guarantees table). Ignored without a
//! GPU. It starts NVIDIA's MPS control daemon on one GPU (no MIG mode, compute mode or time
//! slice is changed, no GPU or compute instance is made), then runs an MPS client that calls
//! the CUDA driver API through `libcuda.so.1` and allocates 256 MiB blocks until the driver
//! refuses, under three limits: the daemon's default pinned limit
//! (`set_default_device_pinned_mem_limit`), the client's own `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`,
//! and none. It prints how much each client got and the CUDA error that stopped it.
//!
//! Run on a GPU node as root:
//! `DAS_REAL_GPU_UUID=GPU-… DAS_MPS_CONTROL=$(command -v nvidia-cuda-mps-control) cargo test -p
//! das-driver --test real_gpu_mps_limits -- --ignored --nocapture limits_on_a_real_gpu`.

use std::ffi::{c_int, c_uint, c_void};
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

/// The environment variable that makes [`mps_client_allocates_until_refused`] the client.
const CLIENT: &str = "DAS_MPS_PROBE_CLIENT";
/// One allocation, in MiB.
const BLOCK_MIB: usize = 256;
/// Most blocks a client tries (64 GiB): a limit not enforced stops here or at the GPU's memory.
const MOST_BLOCKS: usize = 256;

type CuInit = unsafe extern "C" fn(c_uint) -> c_int;
type CuDeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> c_int;
type CuCtxCreate = unsafe extern "C" fn(*mut *mut c_void, c_uint, c_int) -> c_int;
type CuMemAlloc = unsafe extern "C" fn(*mut u64, usize) -> c_int;

/// The client: allocates blocks until the driver refuses; prints `allocated <MiB> MiB, stopped
/// by CUDA error <code>` (code 0: it reached [`MOST_BLOCKS`]).
#[test]
#[ignore = "needs an NVIDIA GPU: run by limits_on_a_real_gpu"]
fn mps_client_allocates_until_refused() {
    if std::env::var_os(CLIENT).is_none() {
        return;
    }
    // SAFETY: libcuda.so.1 is NVIDIA's driver library; each symbol is called with the
    // signature of the CUDA driver API reference (cuInit, cuDeviceGet, cuCtxCreate_v2,
    // cuMemAlloc_v2), and its out-pointers point at live locals.
    unsafe {
        let lib = libloading::Library::new("libcuda.so.1").expect("libcuda.so.1 loads");
        let init: libloading::Symbol<CuInit> = lib.get(b"cuInit\0").unwrap();
        let device_get: libloading::Symbol<CuDeviceGet> = lib.get(b"cuDeviceGet\0").unwrap();
        let ctx_create: libloading::Symbol<CuCtxCreate> = lib.get(b"cuCtxCreate_v2\0").unwrap();
        let mem_alloc: libloading::Symbol<CuMemAlloc> = lib.get(b"cuMemAlloc_v2\0").unwrap();
        assert_eq!(init(0), 0, "cuInit");
        let mut device: c_int = 0;
        assert_eq!(device_get(&mut device, 0), 0, "cuDeviceGet");
        let mut ctx: *mut c_void = std::ptr::null_mut();
        assert_eq!(ctx_create(&mut ctx, 0, device), 0, "cuCtxCreate");
        let mut blocks = 0;
        let mut error = 0;
        while blocks < MOST_BLOCKS {
            let mut ptr: u64 = 0;
            error = mem_alloc(&mut ptr, BLOCK_MIB << 20);
            if error != 0 {
                break;
            }
            blocks += 1;
        }
        println!(
            "allocated {} MiB, stopped by CUDA error {error}",
            blocks * BLOCK_MIB
        );
    }
}

/// One run of the client with `env`: what it printed.
fn client(env: &[(&str, &str)]) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "mps_client_allocates_until_refused",
            "--nocapture",
        ])
        .env(CLIENT, "1")
        .envs(env.iter().copied())
        .output()
        .expect("the client runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.lines()
        .find(|l| l.starts_with("allocated"))
        .map_or_else(
            || format!("no result: {text}{}", String::from_utf8_lossy(&out.stderr)),
            str::to_string,
        )
}

/// Sends `command` to the daemon of `pipe` through the control binary's client mode.
fn control(bin: &str, pipe: &Path, command: &str) -> String {
    let mut child = Command::new(bin)
        .env("CUDA_MPS_PIPE_DIRECTORY", pipe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the control client runs");
    let _ = writeln!(child.stdin.take().unwrap(), "{command}");
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
#[ignore = "needs an NVIDIA GPU: DAS_REAL_GPU_UUID and DAS_MPS_CONTROL"]
fn limits_on_a_real_gpu() {
    let (Ok(uuid), Ok(bin)) = (
        std::env::var("DAS_REAL_GPU_UUID"),
        std::env::var("DAS_MPS_CONTROL"),
    ) else {
        panic!(
            "set DAS_REAL_GPU_UUID (the GPU's UUID) and DAS_MPS_CONTROL (nvidia-cuda-mps-control)"
        );
    };
    let dir = tempfile::tempdir().unwrap();
    let (pipe, log) = (dir.path().join("pipe"), dir.path().join("log"));
    std::fs::create_dir_all(&pipe).unwrap();
    std::fs::create_dir_all(&log).unwrap();
    let started = Command::new(&bin)
        .arg("-d")
        .env("CUDA_VISIBLE_DEVICES", &uuid)
        .env("CUDA_MPS_PIPE_DIRECTORY", &pipe)
        .env("CUDA_MPS_LOG_DIRECTORY", &log)
        .status()
        .expect("the MPS control daemon starts");
    assert!(started.success(), "{bin} -d: {started}");
    let set = control(&bin, &pipe, "set_default_device_pinned_mem_limit 0 2048M");
    let pipe_text = pipe.display().to_string();
    let mps = [
        ("CUDA_MPS_PIPE_DIRECTORY", pipe_text.as_str()),
        ("CUDA_VISIBLE_DEVICES", uuid.as_str()),
    ];
    let daemon_limit = client(&mps);
    let mut own = mps.to_vec();
    own.push(("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=1024M"));
    let client_limit = client(&own);
    println!("GPU {uuid}, MPS control daemon {bin} (set_default_device_pinned_mem_limit: {set:?})");
    println!("  daemon's default pinned limit 2048M: {daemon_limit}");
    println!("  client's CUDA_MPS_PINNED_DEVICE_MEM_LIMIT 0=1024M under it: {client_limit}");
    let quit = control(&bin, &pipe, "quit");
    let direct = client(&[("CUDA_VISIBLE_DEVICES", uuid.as_str())]);
    println!("  no MPS (daemon quit: {quit:?}), no limit: {direct}");
}
