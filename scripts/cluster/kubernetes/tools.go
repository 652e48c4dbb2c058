//go:build tools

// The Kubernetes release the cluster tests run, as the commands this module
// builds in one `go build` (scripts/cluster.sh): the official sources at
// k8s.io/kubernetes v1.35.8, its staging modules pinned to the same release
// (the replace lines of go.mod), and the etcd release it is tested with.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
