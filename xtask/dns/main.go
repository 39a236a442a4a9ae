// CoreDNS with the plugins the local cluster's Corefile uses, as kubeadm's Corefile has them
// minus forwarding: names outside the cluster are not answered, so nothing a pod asks leaves
// the machine. Building only these keeps the cloud providers' SDKs out of the build.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	// The order a query passes the plugins in, as CoreDNS's own plugin.cfg orders them.
	dnsserver.Directives = []string{"ready", "health", "errors", "loadbalance", "cache", "kubernetes"}
	coremain.Run()
}
