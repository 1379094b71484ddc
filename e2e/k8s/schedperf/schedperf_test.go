// Package schedperf runs upstream's scheduler benchmark (k8s.io/kubernetes/test/integration/
// scheduler_perf, used as a library) on the workloads that `cargo bench -p das-e2e --bench
// scheduler` writes: nodes that are API objects only, ResourceSlices shaped like DAS's and its
// peers', and pods with one-device claims. scheduler_perf starts etcd (from PATH), and runs
// kube-apiserver, kube-scheduler and the ResourceClaim controller in this process.
//
//	DAS_SCHEDPERF_CONFIG=<dir>/config.yaml go test ./schedperf -run '^$' -bench . -benchtime 1x \
//	  -data-items-dir <dir> -perf-scheduling-label-filter=
//
// Without DAS_SCHEDPERF_CONFIG the benchmark is skipped (so `go vet ./...` and a plain
// `go test ./...` stay quick).
package schedperf

import (
	"fmt"
	"os"
	"testing"

	_ "k8s.io/component-base/logs/json/register"
	perf "k8s.io/kubernetes/test/integration/scheduler_perf"
)

func TestMain(m *testing.M) {
	if err := perf.InitTests(); err != nil {
		fmt.Fprintf(os.Stderr, "%v\n", err)
		os.Exit(1)
	}
	m.Run()
}

// BenchmarkPerfScheduling reports, per workload, the pods scheduled per second (average and
// percentiles over 1 s samples) and the scheduler's metrics, among them the DynamicResources
// plugin's Filter duration, into -data-items-dir as JSON.
func BenchmarkPerfScheduling(b *testing.B) {
	config := os.Getenv("DAS_SCHEDPERF_CONFIG")
	if config == "" {
		b.Skip("DAS_SCHEDPERF_CONFIG is not set: run `cargo bench -p das-e2e --bench scheduler`")
	}
	perf.RunBenchmarkPerfScheduling(b, config, "das", nil)
}
