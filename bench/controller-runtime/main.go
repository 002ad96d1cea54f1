// Command appservice-cr-baseline is a controller-runtime (kubebuilder-style) equivalent of
// the Rust AppService controller, kept as a benchmark baseline: the scale benchmark
// (controller/benches/scale.rs) runs it with `--controller-bin`.
//
// It takes the flags the benchmark passes to the Rust controller: --kubeconfig,
// --watch-namespace, --lease-namespace, --leader-election, --ops-addr (serving /healthz,
// /readyz once the caches are synced, and /metrics from controller-runtime's registry),
// --kube-api-qps, --kube-api-burst, --concurrency, --log-format.
package main

import (
	"flag"
	"fmt"
	"net/http"
	"os"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

func main() {
	var (
		watchNamespace string
		leaseNamespace string
		leaderElection bool
		opsAddr        string
		qps            float64
		burst          int
		concurrency    int
		logFormat      string
	)
	// --kubeconfig is registered by controller-runtime (pkg/client/config) and read by
	// ctrl.GetConfig.
	flag.StringVar(&watchNamespace, "watch-namespace", os.Getenv("WATCH_NAMESPACE"),
		"Watch (and cache) only this namespace; all namespaces when empty.")
	flag.StringVar(&leaseNamespace, "lease-namespace", "default", "Namespace of the leader-election Lease.")
	flag.BoolVar(&leaderElection, "leader-election", true,
		"Elect a leader on the Lease "+leaseName+" before reconciling.")
	flag.StringVar(&opsAddr, "ops-addr", "0.0.0.0:8080", "Address serving /healthz, /readyz and /metrics.")
	flag.Float64Var(&qps, "kube-api-qps", 50, "Client QPS towards the API server.")
	flag.IntVar(&burst, "kube-api-burst", 100, "Client burst towards the API server.")
	flag.IntVar(&concurrency, "concurrency", 16, "Reconciles running at once (MaxConcurrentReconciles).")
	flag.StringVar(&logFormat, "log-format", "json", "Log format: json or text.")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()

	opts.Development = false
	if logFormat == "text" {
		opts.Development = true
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("setup")

	if err := run(watchNamespace, leaseNamespace, leaderElection, opsAddr, qps, burst, concurrency); err != nil {
		log.Error(err, "controller failed")
		os.Exit(1)
	}
}

func run(watchNamespace, leaseNamespace string, leaderElection bool, opsAddr string, qps float64, burst, concurrency int) error {
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(SchemeBuilder.AddToScheme(scheme))

	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.QPS = float32(qps)
	cfg.Burst = burst

	var cacheOpts cache.Options
	if watchNamespace != "" {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{watchNamespace: {}}
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme,
		Cache:  cacheOpts,
		// One port for /metrics, /healthz and /readyz, as the Rust controller's ops server.
		Metrics:                       metricsserver.Options{BindAddress: opsAddr},
		HealthProbeBindAddress:        "0",
		LeaderElection:                leaderElection,
		LeaderElectionID:              leaseName,
		LeaderElectionNamespace:       leaseNamespace,
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}

	reconciler := &AppServiceReconciler{
		Client:   mgr.GetClient(),
		Scheme:   mgr.GetScheme(),
		Recorder: mgr.GetEventRecorder("appservice-controller"),
	}
	if err := reconciler.SetupWithManager(mgr, concurrency); err != nil {
		return fmt.Errorf("controller: %w", err)
	}

	healthzHandler := &healthz.Handler{Checks: map[string]healthz.Checker{"ping": healthz.Ping}}
	readyzHandler := &healthz.Handler{Checks: map[string]healthz.Checker{
		"informers": informersSynced(mgr.GetCache(), &AppService{}, &appsv1.Deployment{}, &corev1.Service{}, &policyv1.PodDisruptionBudget{}),
	}}
	for path, h := range map[string]http.Handler{"/healthz": healthzHandler, "/readyz": readyzHandler} {
		if err := mgr.AddMetricsServerExtraHandler(path, http.StripPrefix(path, h)); err != nil {
			return fmt.Errorf("ops handler %s: %w", path, err)
		}
	}

	ctrl.Log.WithName("setup").Info("starting manager", "namespace", watchNamespace, "qps", qps, "burst", burst,
		"concurrency", concurrency, "leaderElection", leaderElection)
	return mgr.Start(ctrl.SetupSignalHandler())
}

// informersSynced is ready once the informers of the controller's three kinds have
// completed their initial list (the informers the controller shares; asking for one
// that does not exist yet creates it, as the controller's watch would).
func informersSynced(c cache.Cache, objs ...client.Object) healthz.Checker {
	return func(req *http.Request) error {
		for _, obj := range objs {
			inf, err := c.GetInformer(req.Context(), obj, cache.BlockUntilSynced(false))
			if err != nil {
				return err
			}
			if !inf.HasSynced() {
				return fmt.Errorf("%T informer not synced", obj)
			}
		}
		return nil
	}
}
