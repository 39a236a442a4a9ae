// Command memcached-reference is the Memcached controller written the idiomatic
// controller-runtime way, in the layout of a Kubebuilder v4 project (cmd/main.go is main.go
// here: the module builds one binary). It exists so that `cargo xtask bench` can compare the
// Rust manager with what a Go operator author would write; it is never shipped.
//
// It takes the flags of the Rust manager that the bench passes, with the same meaning.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	// Import all Kubernetes client auth plugins (e.g. Azure, GCP, OIDC, etc.)
	// to ensure that exec-entrypoint and run can make use of them.
	_ "k8s.io/client-go/plugin/pkg/client/auth"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	cachev1beta1 "operator-manager.dev/reference/memcached/api/v1beta1"
	"operator-manager.dev/reference/memcached/internal/controller"
)

var (
	scheme   = runtime.NewScheme()
	setupLog = ctrl.Log.WithName("setup")
)

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(cachev1beta1.AddToScheme(scheme))
}

// inClusterNamespacePath holds the pod's namespace in a cluster (controller-runtime's default
// leader-election namespace).
const inClusterNamespacePath = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

func main() {
	var metricsAddr, probeAddr string
	var enableLeaderElection bool
	var leaderElectionID, leaderElectionNamespace string
	var leaseDuration, renewDeadline, retryPeriod time.Duration
	var maxConcurrentReconciles int
	logFormat := "auto"
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8080",
		"The address the metrics endpoint binds to (plain HTTP). Use 0 to disable the metrics service.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "The address the probe endpoint binds to.")
	flag.BoolVar(&enableLeaderElection, "leader-elect", false,
		"Enable leader election for controller manager. "+
			"Enabling this will ensure there is only one active controller manager.")
	flag.StringVar(&leaderElectionID, "leader-election-id", "operator-manager-reference",
		"The name of the leader-election Lease.")
	flag.StringVar(&leaderElectionNamespace, "leader-election-namespace", "",
		"The namespace of the leader-election Lease (default: the pod's namespace in a cluster).")
	flag.DurationVar(&leaseDuration, "lease-duration", 15*time.Second,
		"How long a non-leader waits after the last observed renewal before taking over.")
	flag.DurationVar(&renewDeadline, "renew-deadline", 10*time.Second,
		"How long the leader keeps trying to renew before giving up leadership.")
	flag.DurationVar(&retryPeriod, "retry-period", 2*time.Second,
		"Interval between acquire and renew attempts.")
	flag.IntVar(&maxConcurrentReconciles, "max-concurrent-reconciles", 4,
		"How many Memcacheds are reconciled at once.")
	flag.Func("log-format", "Log format: json, text, or auto (json unless standard error is a terminal).",
		func(value string) error {
			switch value {
			case "auto", "json", "text":
				logFormat = value
				return nil
			default:
				return fmt.Errorf("%q is not one of auto, json, text", value)
			}
		})
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()

	if err := validate(flag.Args(), maxConcurrentReconciles, leaseDuration, renewDeadline, retryPeriod); err != nil {
		fmt.Fprintf(os.Stderr, "memcached-reference: %v\n", err)
		flag.Usage()
		os.Exit(2)
	}
	encoder := zap.JSONEncoder()
	if logFormat == "text" || (logFormat == "auto" && stderrIsTerminal()) {
		encoder = zap.ConsoleEncoder()
	}
	logger := zap.New(zap.UseFlagOptions(&opts), encoder)
	ctrl.SetLogger(logger)
	// client-go's leader election logs through klog: send it the same way, so every line is in
	// the chosen format.
	klog.SetLogger(logger)

	config := ctrl.GetConfigOrDie()

	// controller-runtime names the leader hostname_<uuid>. In a cluster the pod name is the
	// identity people (and the bench's failover check) look for in the Lease, so use POD_NAME
	// when the downward API sets it; v0.24 has no option for the identity alone, so the Lease
	// lock is built here the way controller-runtime builds it, with that identity.
	var lock resourcelock.Interface
	if podName := os.Getenv("POD_NAME"); enableLeaderElection && podName != "" {
		var err error
		lock, err = newLeaseLock(config, leaderElectionNamespace, leaderElectionID, podName, renewDeadline)
		if err != nil {
			setupLog.Error(err, "Failed to set up leader election")
			os.Exit(1)
		}
	}

	mgr, err := ctrl.NewManager(config, ctrl.Options{
		Scheme: scheme,
		Metrics: metricsserver.Options{
			BindAddress:   metricsAddr,
			SecureServing: false,
		},
		HealthProbeBindAddress:              probeAddr,
		LeaderElection:                      enableLeaderElection,
		LeaderElectionID:                    leaderElectionID,
		LeaderElectionNamespace:             leaderElectionNamespace,
		LeaderElectionResourceLockInterface: lock,
		LeaseDuration:                       &leaseDuration,
		RenewDeadline:                       &renewDeadline,
		RetryPeriod:                         &retryPeriod,
		// Step down voluntarily when the manager stops (SIGTERM), so that a standby takes over
		// at once instead of waiting out the lease duration; the Rust manager releases its
		// Lease on SIGTERM too. It is safe because the process exits as soon as Start returns:
		// nothing runs after the controllers have stopped.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		setupLog.Error(err, "Failed to start manager")
		os.Exit(1)
	}

	if err := (&controller.MemcachedReconciler{
		Client:                  mgr.GetClient(),
		Scheme:                  mgr.GetScheme(),
		Recorder:                mgr.GetEventRecorder("memcached-controller"),
		MaxConcurrentReconciles: maxConcurrentReconciles,
	}).SetupWithManager(mgr); err != nil {
		setupLog.Error(err, "Failed to create controller", "controller", "Memcached")
		os.Exit(1)
	}

	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		setupLog.Error(err, "Failed to set up health check")
		os.Exit(1)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		setupLog.Error(err, "Failed to set up ready check")
		os.Exit(1)
	}

	setupLog.Info("Starting manager")
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		setupLog.Error(err, "Failed to run manager")
		os.Exit(1)
	}
}

// validate rejects what the flag package lets through: stray arguments and values out of range.
func validate(args []string, maxConcurrentReconciles int, leaseDuration, renewDeadline, retryPeriod time.Duration) error {
	var errs []error
	if len(args) > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments: %s", strings.Join(args, " ")))
	}
	if maxConcurrentReconciles < 1 {
		errs = append(errs, fmt.Errorf("--max-concurrent-reconciles must be at least 1, got %d", maxConcurrentReconciles))
	}
	for _, d := range []struct {
		name  string
		value time.Duration
	}{{"--lease-duration", leaseDuration}, {"--renew-deadline", renewDeadline}, {"--retry-period", retryPeriod}} {
		if d.value <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %s", d.name, d.value))
		}
	}
	if renewDeadline >= leaseDuration {
		errs = append(errs, fmt.Errorf("--renew-deadline (%s) must be shorter than --lease-duration (%s)", renewDeadline, leaseDuration))
	}
	if retryPeriod >= renewDeadline {
		errs = append(errs, fmt.Errorf("--retry-period (%s) must be shorter than --renew-deadline (%s)", retryPeriod, renewDeadline))
	}
	return errors.Join(errs...)
}

// newLeaseLock is controller-runtime's leaderelection.NewResourceLock for a Lease, with
// identity as the holder identity: its own user agent, a client timeout of half the renew
// deadline so one hung request cannot cost the lease, and the namespace defaulting to the
// pod's own in a cluster.
func newLeaseLock(config *rest.Config, namespace, name, identity string, renewDeadline time.Duration) (resourcelock.Interface, error) {
	if namespace == "" {
		data, err := os.ReadFile(inClusterNamespacePath)
		if err != nil {
			return nil, fmt.Errorf("not running in-cluster, please specify --leader-election-namespace: %w", err)
		}
		namespace = strings.TrimSpace(string(data))
	}
	config = rest.AddUserAgent(rest.CopyConfig(config), "leader-election")
	config.Timeout = max(renewDeadline/2, time.Second)
	coreClient, err := corev1client.NewForConfig(config)
	if err != nil {
		return nil, err
	}
	coordinationClient, err := coordinationv1client.NewForConfig(config)
	if err != nil {
		return nil, err
	}
	return resourcelock.New(resourcelock.LeasesResourceLock, namespace, name, coreClient, coordinationClient,
		resourcelock.ResourceLockConfig{Identity: identity})
}

// stderrIsTerminal reports whether standard error is a terminal (a person is reading).
func stderrIsTerminal() bool {
	info, err := os.Stderr.Stat()
	return err == nil && info.Mode()&os.ModeCharDevice != 0
}
