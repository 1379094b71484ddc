//go:build !k8s_before_1_37

package main

// The container-manager methods whose signature gained a logger in Kubernetes 1.37.

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

func (m *draContainerManager) UpdateAllocatedResourcesStatus(logger klog.Logger, pod *v1.Pod, st *v1.PodStatus) {
	m.dra.UpdateAllocatedResourcesStatus(logger, pod, st)
}

func (m *draContainerManager) GetDynamicResources(_ klog.Logger, _ *v1.Pod, _ *v1.Container) []*podresourcesapi.DynamicResource {
	return nil
}
