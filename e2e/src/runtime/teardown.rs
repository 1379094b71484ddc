//! What a stopped real-runtime node leaves behind, removed: containers, shims, mounts and its
//! bridge.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{RUNC, RuntimeFiles, network_of};

/// Removes everything a node left running or mounted, after its kubelet and containerd
/// stopped: every container in its runc state (killed and deleted), the shims that served this
/// containerd, every mount below the node's directory (rootfs overlays, network namespaces,
/// the kubelet's volume tmpfs) and the node's bridge. Best effort: what fails is printed.
pub fn teardown(files: &RuntimeFiles) {
    let runc_root = files.runc_containers().display().to_string();
    if let Ok(out) = Command::new(RUNC)
        .args(["--root", &runc_root, "list", "-q"])
        .output()
    {
        for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new(RUNC)
                .args(["--root", &runc_root, "delete", "--force", id])
                .output();
        }
    }
    kill_shims(&files.socket());
    unmount_below(&files.root);
    let (bridge, _) = network_of(&files.root);
    let _ = Command::new("ip").args(["link", "del", &bridge]).output();
}

/// SIGKILLs the runc shims started by the containerd at `socket` (their command line names it).
fn kill_shims(socket: &Path) {
    let needle = socket.display().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for e in entries.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains("containerd-shim-runc-v2") && cmdline.contains(&needle) {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// SIGKILLs the emulated GPUs' stand-in MPS daemons (`das-kubelet-plugin mps-control-stand-in
/// -f`) working in a directory below `dir`: a plugin's daemons run in process groups of their
/// own and outlive it (for a restarted plugin to adopt), and one whose directory is kept (a
/// failed test) or whose mount is detached would run on, holding whatever descriptors it
/// inherited (the runtime-node tests' `flock`). Call it before [`unmount_below`]: a daemon's
/// working directory is its pipe directory, which must still be seen below `dir`.
pub fn kill_mps_stand_ins(dir: &Path) {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for e in entries.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let below = std::fs::read_link(e.path().join("cwd")).is_ok_and(|cwd| cwd.starts_with(dir));
        if cmdline.contains("mps-control-stand-in") && below {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Lazily unmounts every mount point below `dir`, deepest first (also what DAS plugins that ran
/// as processes left mounted there: the MPS daemons' shm tmpfs of claims never unprepared).
pub fn unmount_below(dir: &Path) {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mount_point)
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in points {
        let Ok(c) = std::ffi::CString::new(p.display().to_string()) else {
            continue;
        };
        // SAFETY: c is a valid NUL-terminated path that outlives the call.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
            eprintln!(
                "unmount {}: {}",
                p.display(),
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Mount points in mountinfo escape space, tab, newline and backslash as octal (`\040`).
fn unescape_mount_point(s: &str) -> PathBuf {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let code: String = chars.by_ref().take(3).collect();
            if let Ok(n) = u8::from_str_radix(&code, 8) {
                out.push(n as char);
                continue;
            }
            out.push('\\');
            out.push_str(&code);
        } else {
            out.push(c);
        }
    }
    PathBuf::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_unescaped() {
        assert_eq!(
            unescape_mount_point(r"/tmp/a\040b/c"),
            PathBuf::from("/tmp/a b/c")
        );
        assert_eq!(unescape_mount_point("/plain"), PathBuf::from("/plain"));
    }
}
