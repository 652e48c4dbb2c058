// Command netpol enforces NetworkPolicy on the test cluster: the NetworkPolicy
// controller of sigs.k8s.io/kube-network-policies, which decides each new
// connection from or to a pod that netfilter queues to it by the cluster's
// policies, run on the node's host with a kubeconfig. The module's own command
// reads only the in-cluster configuration of a DaemonSet pod, and the cluster
// has no registry to pull its image from.
//
// The controller also tries to install its nftables hook, which this kernel
// refuses (it has no nftables `queue` expression, CONFIG_NFT_QUEUE): it logs
// "syncing nftables rules" errors, and scripts/cluster.sh installs the same
// hook with the xtables NFQUEUE target instead.
package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"sigs.k8s.io/kube-network-policies/pkg/networkpolicy"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "the kubeconfig of the cluster's API server")
	node := flag.String("node", "", "the name of the Node whose pods' traffic this process decides")
	queue := flag.Int("nfqueue-id", 100, "the netfilter queue the rules send new connections to")
	klog.InitFlags(nil)
	flag.Parse()
	if *kubeconfig == "" || *node == "" {
		klog.Fatal("--kubeconfig and --node are required")
	}

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.Fatalf("reading %s: %v", *kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		klog.Fatalf("client: %v", err)
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	controller, err := networkpolicy.NewController(
		client,
		factory.Networking().V1().NetworkPolicies(),
		factory.Core().V1().Namespaces(),
		factory.Core().V1().Pods(),
		nil, nil, nil, nil, // no (Baseline)AdminNetworkPolicy
		networkpolicy.Config{
			QueueID:             *queue,
			NodeName:            *node,
			// The hook sends DNS with the rest; kernels from 6.12 on have the fix.
			NetfilterBug1766Fix: false,
		},
	)
	if err != nil {
		klog.Fatalf("controller: %v", err)
	}
	factory.Start(ctx.Done())
	// Run removes its nftables table when ctx ends; wait for that before exiting.
	if err := controller.Run(ctx); err != nil && ctx.Err() == nil {
		klog.Fatalf("controller stopped: %v", err)
	}
}
