package main

// dra-kubelet: a kubemark-style hollow kubelet for DRA end-to-end tests.
//
// Stock kubemark runs the real kubelet against a fake container runtime, but with a stub
// container manager that has no DRA: a DRA driver can never register and NodePrepareResources is
// never called. Here the stub is wrapped so that the DRA-related methods go to the real kubelet
// DRA manager (k8s.io/kubernetes/pkg/kubelet/cm/dra), exactly as the Linux container manager
// wires it (pkg/kubelet/cm/container_manager_linux.go). The kubelet therefore runs its real plugin
// watcher, registration handshake, claim cache, checkpoint, prepare/unprepare batching and
// ResourceSlice wiping against the DRA driver's unix sockets.
//
// Because no container ever runs, the CDI device IDs that the kubelet hands to the runtime for
// each container are also written to <root-dir>/cdi-devices/<pod-uid>_<container>.json so tests
// can check what a container would get.

import (
	"context"
	"encoding/json"
	goflag "flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/version"
	fakeremote "k8s.io/cri-client/pkg/fake"
	"k8s.io/klog/v2"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	cadvisortest "k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/cm/resourceupdates"
	"k8s.io/kubernetes/pkg/kubelet/config"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
	"k8s.io/kubernetes/pkg/kubelet/status"
	"k8s.io/kubernetes/pkg/kubemark"

	internalapi "k8s.io/cri-api/pkg/apis"
)

type draKubeletOptions struct {
	kubeconfig  string
	nodeName    string
	rootDir     string
	kubeletPort int
	maxPods     int
	qps         float32
	burst       int
	nodeLabels  map[string]string
}

func newDRAKubeletCommand() *cobra.Command {
	o := &draKubeletOptions{nodeLabels: map[string]string{}}
	cmd := &cobra.Command{
		Use:          "dra-kubelet",
		Short:        "Hollow kubelet (fake container runtime) with the real kubelet DRA manager",
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDRAKubelet(cmd.Context(), o)
		},
	}
	fs := cmd.Flags()
	klogFlags := goflag.NewFlagSet("klog", goflag.ExitOnError)
	klog.InitFlags(klogFlags) // -v, --vmodule, ...
	fs.AddGoFlagSet(klogFlags)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path to the kubeconfig of the node's identity.")
	fs.StringVar(&o.nodeName, "name", "", "Name of the Node this kubelet registers.")
	fs.StringVar(&o.rootDir, "root-dir", "", "Kubelet root directory (plugins_registry/ and plugins/ live below it). Keep it short: unix socket paths are limited to 108 bytes.")
	fs.IntVar(&o.kubeletPort, "kubelet-port", 0, "Port of the kubelet's HTTPS server on 127.0.0.1; 0 disables the server.")
	fs.IntVar(&o.maxPods, "max-pods", 110, "Maximum number of pods on this node.")
	fs.Float32Var(&o.qps, "kube-api-qps", 50, "QPS towards the API server.")
	fs.IntVar(&o.burst, "kube-api-burst", 100, "Burst towards the API server.")
	fs.Var(cliflag.NewMapStringString(&o.nodeLabels), "node-labels", "Extra node labels, key=value,...")
	_ = cmd.MarkFlagRequired("kubeconfig")
	_ = cmd.MarkFlagRequired("name")
	_ = cmd.MarkFlagRequired("root-dir")
	return cmd
}

func runDRAKubelet(ctx context.Context, o *draKubeletOptions) error {
	if ctx == nil {
		ctx = context.Background()
	}
	klog.InfoS("Starting dra-kubelet", "version", version.Get().GitVersion, "node", o.nodeName, "rootDir", o.rootDir)
	rootDir, err := filepath.Abs(o.rootDir)
	if err != nil {
		return err
	}
	for _, d := range []string{"static-pods", "pod-logs", "pki", "cdi-devices"} {
		if err := os.MkdirAll(filepath.Join(rootDir, d), 0o755); err != nil {
			return err
		}
	}

	restConfig, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig %s: %w", o.kubeconfig, err)
	}
	restConfig.UserAgent = "dra-kubelet"
	restConfig.QPS, restConfig.Burst = o.qps, o.burst
	client, err := clientset.NewForConfig(restConfig)
	if err != nil {
		return err
	}

	flags, kcfg := kubemark.GetHollowKubeletConfig(&kubemark.HollowKubeletOptions{
		NodeName:    o.nodeName,
		KubeletPort: o.kubeletPort,
		MaxPods:     o.maxPods,
		NodeLabels:  o.nodeLabels,
	})
	// GetHollowKubeletConfig made a temp root dir; use ours (short, owned by the test) instead.
	_ = os.RemoveAll(flags.RootDirectory)
	flags.RootDirectory = rootDir
	flags.CertDirectory = filepath.Join(rootDir, "pki")
	kcfg.StaticPodPath = filepath.Join(rootDir, "static-pods")
	kcfg.PodLogsDir = filepath.Join(rootDir, "pod-logs")
	kcfg.Address = "127.0.0.1"
	kcfg.EnableServer = o.kubeletPort != 0
	kcfg.ReadOnlyPort = 0
	kcfg.HealthzPort = 0 // several hollow kubelets share the host: no fixed ports
	kcfg.NodeStatusUpdateFrequency.Duration = 5 * time.Second
	kcfg.SyncFrequency.Duration = 5 * time.Second

	heartbeatConfig := *restConfig
	heartbeatConfig.Timeout = kcfg.NodeStatusUpdateFrequency.Duration
	heartbeatConfig.QPS = -1
	heartbeatClient, err := clientset.NewForConfig(&heartbeatConfig)
	if err != nil {
		return err
	}

	draManager, err := dra.NewManager(klog.FromContext(ctx), client, rootDir)
	if err != nil {
		return fmt.Errorf("create DRA manager: %w", err)
	}
	containerManager := &draContainerManager{
		ContainerManager: cm.NewStubContainerManager(),
		dra:              draManager,
		cdiRecordDir:     filepath.Join(rootDir, "cdi-devices"),
	}

	endpoint, err := fakeremote.GenerateEndpoint()
	if err != nil {
		return fmt.Errorf("fake CRI endpoint: %w", err)
	}
	fakeRuntime := fakeremote.NewFakeRemoteRuntime()
	if err := fakeRuntime.Start(endpoint); err != nil {
		return fmt.Errorf("start fake CRI: %w", err)
	}
	defer fakeRuntime.Stop()
	runtimeService, err := newRuntimeService(ctx, endpoint, 15*time.Second)
	if err != nil {
		return fmt.Errorf("fake CRI client: %w", err)
	}

	hollow := kubemark.NewHollowKubelet(flags, kcfg, client, heartbeatClient,
		&cadvisortest.Fake{NodeName: o.nodeName},
		fakeRuntime.ImageService, runtimeService, containerManager)
	// kubemark records events into a FakeRecorder. Tests watch kubelet events such as
	// FailedPrepareDynamicResources, so let RunKubelet build the real recorder, which posts them
	// to the API server with the node's identity.
	hollow.KubeletDeps.Recorder = nil
	hollow.KubeletDeps.EventClient = client.CoreV1()
	hollow.Run(ctx) // never returns
	return nil
}

// draContainerManager is the kubelet's stub container manager with the DRA methods delegated to
// the real DRA manager, as in containerManagerImpl.
type draContainerManager struct {
	cm.ContainerManager
	dra          *dra.Manager
	cdiRecordDir string
}

func (m *draContainerManager) Start(ctx context.Context, node *v1.Node, activePods cm.ActivePodsFunc, getNode cm.GetNodeFunc,
	sourcesReady config.SourcesReady, podStatusProvider status.PodStatusProvider, runtimeService internalapi.RuntimeService,
	localStorageCapacityIsolation bool) error {
	if err := m.ContainerManager.Start(ctx, node, activePods, getNode, sourcesReady, podStatusProvider, runtimeService, localStorageCapacityIsolation); err != nil {
		return err
	}
	if err := m.dra.Start(ctx, dra.ActivePodsFunc(activePods), dra.GetNodeFunc(getNode), sourcesReady); err != nil {
		return fmt.Errorf("start DRA manager: %w", err)
	}
	return nil
}

func (m *draContainerManager) GetPluginRegistrationHandlers() map[string]cache.PluginHandler {
	return map[string]cache.PluginHandler{pluginwatcherapi.DRAPlugin: m.dra.GetWatcherHandler()}
}

// Updates wakes the kubelet's sync loop for the pods whose device health changed (the DRA
// manager's health stream), as containerManagerImpl fans it in; the kubelet then writes the new
// health into the pod status.
func (m *draContainerManager) Updates() <-chan resourceupdates.Update {
	return m.dra.Updates()
}

func (m *draContainerManager) PrepareDynamicResources(ctx context.Context, pod *v1.Pod) error {
	return m.dra.PrepareResources(ctx, pod)
}

func (m *draContainerManager) UnprepareDynamicResources(ctx context.Context, pod *v1.Pod) error {
	return m.dra.UnprepareResources(ctx, pod)
}

func (m *draContainerManager) PodMightNeedToUnprepareResources(uid types.UID) bool {
	return m.dra.PodMightNeedToUnprepareResources(uid)
}

// cdiRecord is what a container would have received from the runtime: its CDI device IDs.
type cdiRecord struct {
	Namespace  string   `json:"namespace"`
	Pod        string   `json:"pod"`
	PodUID     string   `json:"podUID"`
	Container  string   `json:"container"`
	CDIDevices []string `json:"cdiDevices"`
}

func (m *draContainerManager) GetResources(ctx context.Context, pod *v1.Pod, container *v1.Container) (*kubecontainer.RunContainerOptions, error) {
	opts, err := m.ContainerManager.GetResources(ctx, pod, container)
	if err != nil {
		return nil, err
	}
	info, err := m.dra.GetResources(pod, container)
	if err != nil {
		return nil, err
	}
	opts.CDIDevices = append(opts.CDIDevices, info.CDIDevices...)
	rec := cdiRecord{Namespace: pod.Namespace, Pod: pod.Name, PodUID: string(pod.UID), Container: container.Name, CDIDevices: []string{}}
	for _, d := range opts.CDIDevices {
		rec.CDIDevices = append(rec.CDIDevices, d.Name)
	}
	if err := writeJSONAtomic(filepath.Join(m.cdiRecordDir, fmt.Sprintf("%s_%s.json", pod.UID, container.Name)), rec); err != nil {
		klog.FromContext(ctx).Error(err, "Recording CDI devices failed", "pod", klog.KObj(pod), "container", container.Name)
	}
	return opts, nil
}

func writeJSONAtomic(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
