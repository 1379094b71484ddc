# DAS: the two commands a newcomer needs are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
.DEFAULT_GOAL := help

LOCAL     := $(CURDIR)/.local
BIN       := $(LOCAL)/bin
K8S_BIN   := $(BIN)/k8s
# Pinned upstream Kubernetes: keep in step with e2e/k8s/go.mod.
K8S_VERSION := v1.36.3
K8S_COMMIT  := $(shell grep -m1 'k8s.io/kubernetes v' e2e/k8s/go.mod | awk '{print $$2}')
K8S_LDFLAGS := -s -w \
  -X k8s.io/component-base/version.gitVersion=$(K8S_VERSION) \
  -X k8s.io/component-base/version.gitMajor=1 \
  -X k8s.io/component-base/version.gitMinor=36 \
  -X k8s.io/component-base/version.gitTreeState=clean \
  -X k8s.io/client-go/pkg/version.gitVersion=$(K8S_VERSION) \
  -X k8s.io/client-go/pkg/version.gitMajor=1 \
  -X k8s.io/client-go/pkg/version.gitMinor=36 \
  -X k8s.io/client-go/pkg/version.gitTreeState=clean
K8S_COMPONENTS := etcd kube-apiserver kube-controller-manager kube-scheduler kubectl dra-kubelet

CARGO ?= cargo
KUBECTL := KUBECONFIG=$(LOCAL)/cluster/kubeconfig $(BIN)/kubectl

.PHONY: help
help: ## list targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-14s %s\n",$$1,$$2}'

.PHONY: k8s
k8s: ## build upstream Kubernetes (multi-call binary) into .local/bin (incremental)
	@mkdir -p $(BIN)
	cd e2e/k8s && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" \
	  go build -trimpath -ldflags "$(K8S_LDFLAGS)" -o $(K8S_BIN).new . && \
	  { cmp -s $(K8S_BIN).new $(K8S_BIN) && rm $(K8S_BIN).new || mv $(K8S_BIN).new $(K8S_BIN); }
	@for c in $(K8S_COMPONENTS); do ln -sf k8s $(BIN)/$$c; done
	@$(K8S_BIN) version

.PHONY: build
build: ## build every Rust crate (debug)
	$(CARGO) build --workspace --all-targets

.PHONY: test
test: k8s ## run every test: unit tests and end-to-end tests against the local cluster
	cd e2e/k8s && GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" go vet ./...
	# das-controller's and das-webhook's e2e tests run the node plugin (the webhook's also
	# das-controller) from the same target dir.
	$(CARGO) build -p das-driver --bin das-kubelet-plugin -p das-controller --bin das-controller
	$(CARGO) test --workspace --no-fail-fast

.PHONY: e2e
e2e: k8s ## run only the end-to-end tests (real control plane + hollow DRA kubelets)
	$(CARGO) test -p das-e2e --no-fail-fast

.PHONY: cluster-up
cluster-up: k8s ## start the local cluster with DAS on emulated GPUs in the background (.local/cluster/kubeconfig)
	$(CARGO) build -q -p das-driver --bin das-kubelet-plugin -p das-controller --bin das-controller
	$(CARGO) run -q -p das-e2e --bin das-cluster -- up --plugin-bin target/debug/das-kubelet-plugin \
	  --controller-bin target/debug/das-controller $(if $(NODES),--nodes $(NODES))

.PHONY: cluster-down
cluster-down: ## stop the local cluster and remove its files
	$(CARGO) run -q -p das-e2e --bin das-cluster -- down

.PHONY: demo
demo: cluster-up ## the main job on the local cluster with emulated GPUs: pods get MIG slices
	$(KUBECTL) apply -f docs/examples/
	@echo "waiting for the example pods to run..."
	$(KUBECTL) wait --for=condition=Ready pod --all --timeout=120s
	@echo
	$(KUBECTL) get pods -o wide
	@echo
	$(KUBECTL) wait --for=jsonpath='{.status.state}'=inUse allocationclaims --all -A --timeout=60s >/dev/null
	$(KUBECTL) get allocationclaims -A
	@echo
	@$(CARGO) run -q -p das-e2e --bin das-cluster -- report
	@echo
	@echo "Keep exploring:  export KUBECONFIG=$(LOCAL)/cluster/kubeconfig; $(BIN)/kubectl get resourceslices"
	@echo "Stop it all:     make cluster-down"

.PHONY: fmt
fmt: ## format Rust and Go sources
	$(CARGO) fmt --all
	gofmt -w e2e/k8s

.PHONY: lint
lint: ## formatting check, clippy with warnings as errors, go vet
	$(CARGO) fmt --all -- --check
	@test -z "$$(gofmt -l e2e/k8s)" || { gofmt -l e2e/k8s; echo "gofmt needed"; exit 1; }
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	cd e2e/k8s && GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" go vet ./...

.PHONY: clean
clean: ## remove build outputs (target/ and .local/)
	-$(CARGO) run -q -p das-e2e --bin das-cluster -- down 2>/dev/null
	rm -rf target .local
