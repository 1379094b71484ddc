// Command probe is the program in the DAS test images (no registry, no shell, static).
//
// As /probe (the workload image) it reports what the container runtime gave the container, one
// fact per line, so tests and `make demo` read it back with `kubectl logs`:
//
//	das-probe: start pid=<pid> hostname=<name>
//	das-probe: env <KEY>=<VALUE>          (variables named DAS_*, NVIDIA_* or CUDA_*, sorted)
//	das-probe: dev <path> c <major>:<minor>  (every character device below /dev except the
//	                                          container basics: null, zero, tty, ...)
//	das-probe: file <path> <first line>      (every file below /usr/local/nvidia, where DAS
//	                                          mounts the driver's libraries and tools)
//	das-probe: mps <fact> <value>            (only with CUDA_MPS_PIPE_DIRECTORY: what an MPS
//	                                          client can do, see mpsReport)
//	das-probe: ready
//
// then sleeps until SIGTERM or SIGINT. With `exit` as its first argument it exits 0 after the
// report (the classic init container of the tests).
//
// As /pause (the pod sandbox image, containerd's pinned `sandbox` image) it only waits for
// SIGTERM or SIGINT: the sandbox holds the pod's namespaces and runs nothing else.
package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// basicDevices are the nodes every OCI container gets (runtime-spec config-linux.md, "Default
// Devices"); they say nothing about what a device plugin injected.
var basicDevices = map[string]bool{
	"/dev/null": true, "/dev/zero": true, "/dev/full": true, "/dev/random": true,
	"/dev/urandom": true, "/dev/tty": true, "/dev/console": true, "/dev/ptmx": true,
}

func main() {
	if filepath.Base(os.Args[0]) == "pause" {
		waitForStop()
		return
	}
	report()
	if len(os.Args) > 1 && os.Args[1] == "exit" {
		return
	}
	waitForStop()
}

func report() {
	host, _ := os.Hostname()
	fmt.Printf("das-probe: start pid=%d hostname=%s\n", os.Getpid(), host)
	env := os.Environ()
	sort.Strings(env)
	for _, kv := range env {
		if strings.HasPrefix(kv, "DAS_") || strings.HasPrefix(kv, "NVIDIA_") || strings.HasPrefix(kv, "CUDA_") {
			fmt.Printf("das-probe: env %s\n", kv)
		}
	}
	for _, d := range charDevices("/dev") {
		fmt.Printf("das-probe: dev %s\n", d)
	}
	for _, f := range files(driverDir) {
		fmt.Printf("das-probe: file %s\n", f)
	}
	if dir := os.Getenv("CUDA_MPS_PIPE_DIRECTORY"); dir != "" {
		for _, f := range mpsReport(dir, os.Getenv("DAS_PROBE_FILL_SHM") == "1") {
			fmt.Printf("das-probe: mps %s\n", f)
		}
	}
	fmt.Println("das-probe: ready")
}

// mpsReport says what an MPS client of the container can do (docs/design.md §7, "MPS on a
// slice"), one "<fact> <value>" each:
//
//	shm fs=<tmpfs|other> size=<bytes>   /dev/shm's file system and size (statfs)
//	shm-fill wrote=<bytes> err=<errno>  with fill: bytes written into /dev/shm until the first
//	                                    error (ENOSPC at a tmpfs's size; only on a tmpfs, at most
//	                                    its size and 1 MiB), then removed
//	pipe mount=<ro|rw>                  the pipe directory's mount (statfs flags)
//	pipe-create err=<errno|none>        creating a file in it (removed again if it worked)
//	pipe-remove-control err=<errno>     removing its control socket, tried only on a read-only
//	                                    mount (where it cannot succeed)
//	connect answer=<answer>|err=<err>   the daemon's answer to
//	                                    get_default_active_thread_percentage on its control socket
func mpsReport(dir string, fill bool) []string {
	var out []string
	var shm unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &shm); err == nil {
		fs := "other"
		if shm.Type == unix.TMPFS_MAGIC {
			fs = "tmpfs"
		}
		size := shm.Blocks * uint64(shm.Bsize)
		out = append(out, fmt.Sprintf("shm fs=%s size=%d", fs, size))
		if fill && fs == "tmpfs" {
			wrote, err := fillFile("/dev/shm/das-probe-fill", size+1<<20)
			out = append(out, fmt.Sprintf("shm-fill wrote=%d err=%s", wrote, errName(err)))
			_ = os.Remove("/dev/shm/das-probe-fill")
		}
	}
	var pipe unix.Statfs_t
	readOnly := unix.Statfs(dir, &pipe) == nil && pipe.Flags&unix.ST_RDONLY != 0
	mount := "rw"
	if readOnly {
		mount = "ro"
	}
	out = append(out, "pipe mount="+mount)
	planted := filepath.Join(dir, "das-probe-planted")
	f, err := os.Create(planted)
	if err == nil {
		f.Close()
		_ = os.Remove(planted)
	}
	out = append(out, "pipe-create err="+errName(err))
	if readOnly {
		out = append(out, "pipe-remove-control err="+errName(os.Remove(filepath.Join(dir, "control"))))
	}
	out = append(out, "connect "+askDaemon(filepath.Join(dir, "control")))
	return out
}

// fillFile writes up to limit bytes into path, 64 KiB at a time; it returns the bytes written
// and the error that stopped it (nil if it wrote them all).
func fillFile(path string, limit uint64) (uint64, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	var wrote uint64
	for wrote < limit {
		n, err := f.Write(chunk)
		wrote += uint64(n)
		if err != nil {
			return wrote, err
		}
	}
	return wrote, f.Sync()
}

// askDaemon asks the MPS control socket at socket for its active thread percentage (the
// stand-in daemon of emulated GPUs answers as NVIDIA's control daemon does); "answer=<it>" or
// "err=<why>".
func askDaemon(socket string) string {
	conn, err := net.DialTimeout("unix", socket, 5*time.Second)
	if err != nil {
		return "err=" + errName(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("get_default_active_thread_percentage\n")); err != nil {
		return "err=" + errName(err)
	}
	_ = conn.(*net.UnixConn).CloseWrite()
	answer, err := io.ReadAll(conn)
	if err != nil {
		return "err=" + errName(err)
	}
	return "answer=" + strings.TrimSpace(string(answer))
}

// errName names err by its errno (ENOSPC, EROFS), "none" for nil, else its text.
func errName(err error) string {
	if err == nil {
		return "none"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return unix.ErrnoName(errno)
	}
	return strings.ReplaceAll(err.Error(), " ", "_")
}

// charDevices lists the character devices below root as "<path> c <major>:<minor>", sorted,
// without the basic ones and without /dev/pts (terminals).
func charDevices(root string) []string {
	var out []string
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // an unreadable entry is not a device the container was given
		}
		if d.IsDir() && path == filepath.Join(root, "pts") {
			return filepath.SkipDir
		}
		if d.Type()&fs.ModeCharDevice == 0 || basicDevices[path] {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			return nil
		}
		out = append(out, fmt.Sprintf("%s c %d:%d", path, unix.Major(st.Rdev), unix.Minor(st.Rdev)))
		return nil
	})
	sort.Strings(out)
	return out
}

// driverDir is where DAS's CDI specs mount the NVIDIA driver's libraries and tools.
const driverDir = "/usr/local/nvidia"

// files lists the regular files below root as "<path> <first line>", sorted; the first line is
// cut at 120 bytes (the stand-in driver files of emulated GPUs are one line naming themselves).
func files(root string) []string {
	var out []string
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			out = append(out, fmt.Sprintf("%s (unreadable: %v)", path, err))
			return nil
		}
		line, _, _ := strings.Cut(string(data), "\n")
		if len(line) > 120 {
			line = line[:120]
		}
		out = append(out, fmt.Sprintf("%s %s", path, line))
		return nil
	})
	sort.Strings(out)
	return out
}

func waitForStop() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
