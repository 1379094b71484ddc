//go:build k8s_before_1_36

package main

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace/noop"
	internalapi "k8s.io/cri-api/pkg/apis"
	remote "k8s.io/cri-client/pkg"
	"k8s.io/klog/v2"
)

// newRuntimeService connects to the CRI endpoint (Kubernetes 1.34 and 1.35: the client takes a
// logger instead of a context).
func newRuntimeService(ctx context.Context, endpoint string, timeout time.Duration) (internalapi.RuntimeService, error) {
	logger := klog.FromContext(ctx)
	return remote.NewRemoteRuntimeService(endpoint, timeout, noop.NewTracerProvider(), &logger)
}
