//go:build !k8s_before_1_36

package main

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace/noop"
	internalapi "k8s.io/cri-api/pkg/apis"
	remote "k8s.io/cri-client/pkg"
)

// newRuntimeService connects to the CRI endpoint (since Kubernetes 1.36 the client takes a
// context and a streaming switch).
func newRuntimeService(ctx context.Context, endpoint string, timeout time.Duration) (internalapi.RuntimeService, error) {
	return remote.NewRemoteRuntimeService(ctx, endpoint, timeout, noop.NewTracerProvider(), false)
}
