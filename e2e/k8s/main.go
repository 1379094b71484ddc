// Command k8s is a multi-call binary holding the upstream Kubernetes components that the DAS
// end-to-end tests and `make demo` run on one machine without a container engine:
//
//	k8s etcd | kube-apiserver | kube-controller-manager | kube-scheduler | kubectl | kubelet | kube-proxy | dra-kubelet  [flags]
//
// It can also be invoked through a symlink named after a component (e.g. `.local/bin/kubectl`).
// Every component except dra-kubelet is the unmodified upstream command; dra-kubelet is a hollow
// kubelet (fake container runtime) whose container manager runs the real kubelet DRA manager.
// kubelet is the real one: the real-runtime node runs it against containerd (e2e/containerd);
// kube-proxy gives that node's pods (and the API server's webhook calls) Service routing.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	_ "time/tzdata" // CronJob time zones, as upstream kube-apiserver and kube-controller-manager do

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // --logging-format=json
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as upstream mains register them
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	"k8s.io/component-base/version"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

// components maps a component name to its entry point. Each entry point sees os.Args as if it
// were its own binary: os.Args[0] is the component name, os.Args[1:] its flags.
var components = map[string]func() int{
	"etcd": func() int {
		etcdmain.Main(os.Args)
		return 0
	},
	"kube-apiserver":          func() int { return cli.Run(apiserver.NewAPIServerCommand()) },
	"kube-controller-manager": func() int { return cli.Run(controllermanager.NewControllerManagerCommand()) },
	"kube-scheduler":          func() int { return cli.Run(scheduler.NewSchedulerCommand()) },
	"kubectl":                 runKubectl,
	"kubelet":                 func() int { return cli.Run(kubelet.NewKubeletCommand(context.Background())) },
	"kube-proxy":              func() int { return cli.Run(proxy.NewProxyCommand()) },
	"dra-kubelet":             func() int { return cli.Run(newDRAKubeletCommand()) },
	"version": func() int {
		fmt.Println(version.Get().GitVersion)
		return 0
	},
}

func runKubectl() int {
	// As upstream cmd/kubectl: set verbosity before the command is built so plugin lookup logs too.
	_, _ = logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args))
	if err := cli.RunNoErrOutput(kubectlcmd.NewDefaultKubectlCommand()); err != nil {
		kubectlutil.CheckErr(err)
	}
	return 0
}

func main() {
	name := filepath.Base(os.Args[0])
	if _, ok := components[name]; !ok {
		if len(os.Args) < 2 {
			usage()
		}
		name = os.Args[1]
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	run, ok := components[name]
	if !ok {
		usage()
	}
	os.Exit(run())
}

func usage() {
	names := make([]string, 0, len(components))
	for n := range components {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(os.Stderr, "usage: k8s <component> [flags]\ncomponents: %v\n", names)
	os.Exit(2)
}
