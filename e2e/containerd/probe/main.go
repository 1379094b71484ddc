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
//	das-probe: ready
//
// then sleeps until SIGTERM or SIGINT. With `exit` as its first argument it exits 0 after the
// report (the classic init container of the tests).
//
// As /pause (the pod sandbox image, containerd's pinned `sandbox` image) it only waits for
// SIGTERM or SIGINT: the sandbox holds the pod's namespaces and runs nothing else.
package main

import (
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

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
	fmt.Println("das-probe: ready")
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
