//go:build k8s_before_1_37

package main

// The container-manager methods as Kubernetes 1.34 to 1.36 declare them (no logger argument);
// `make k8s K8S_VERSION=v1.3x.y` builds with the k8s_before_1_37 tag.

import (
	v1 "k8s.io/api/core/v1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

func (m *draContainerManager) UpdateAllocatedResourcesStatus(pod *v1.Pod, st *v1.PodStatus) {
	m.dra.UpdateAllocatedResourcesStatus(pod, st)
}

func (m *draContainerManager) GetDynamicResources(_ *v1.Pod, _ *v1.Container) []*podresourcesapi.DynamicResource {
	return nil
}
