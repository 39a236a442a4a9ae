// Package controller holds the Memcached controller written the way the Kubebuilder tutorial
// writes it: a reconciler with a Get / Create-or-Update / Status().Update loop, registered with
// controller-runtime's builder.
//
// It is a reference for `cargo xtask bench` only, never shipped: it does the same observable
// job as the Rust controller (crates/controllers/src/memcached.rs), so the bench can run both
// against the same cluster, with the same RBAC, and compare them.
package controller

import (
	"context"
	"maps"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	cachev1beta1 "operator-manager.dev/reference/memcached/api/v1beta1"
)

// The Deployment's pod template, the same as the Rust controller's.
const (
	memcachedContainerName = "memcached"
	memcachedPort          = 11211
	memcachedPortName      = "memcached"
	// memcachedUser is the memcache user of the official image, by number: the kubelet can only
	// verify a numeric user against runAsNonRoot.
	memcachedUser int64 = 11211
)

// memcachedCommand: 64 MB of memory, modern defaults, verbose ("-m 64": memcached's getopt would
// read the tutorial's "-m=64" as "=64", i.e. 0 MB).
var memcachedCommand = []string{"memcached", "-m", "64", "-o", "modern", "-v"}

// foreignRecheck is how often a Memcached blocked by a Deployment it does not control checks again.
const foreignRecheck = 2 * time.Minute

// MemcachedReconciler reconciles a Memcached object.
type MemcachedReconciler struct {
	client.Client
	Scheme   *runtime.Scheme
	Recorder events.EventRecorder
	// MaxConcurrentReconciles is how many Memcacheds are reconciled at once.
	MaxConcurrentReconciles int
}

// The permissions are those of the ClusterRole the Rust workspace generates (deploy/rbac), which
// is what this controller runs with; these markers document them (no controller-gen runs here).
// +kubebuilder:rbac:groups=cache.example.com,resources=memcacheds,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=cache.example.com,resources=memcacheds/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=cache.example.com,resources=memcacheds/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=core,resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups=core,resources=services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=policy,resources=poddisruptionbudgets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile makes the Memcached's Deployment match its spec and reports the Deployment and its
// pods in the Memcached's status.
func (r *MemcachedReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	memcached := &cachev1beta1.Memcached{}
	if err := r.Get(ctx, req.NamespacedName, memcached); err != nil {
		// Not found: deleted meanwhile; the garbage collector removes its Deployment.
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !memcached.DeletionTimestamp.IsZero() {
		// Being deleted: the garbage collector removes the Deployment; creating or updating it
		// now would only fight it.
		return ctrl.Result{}, nil
	}

	result, err := r.reconcile(ctx, memcached)
	if apierrors.IsConflict(err) {
		// The cache was behind the API server (typically: our own status update of a moment ago
		// has not reached the informer yet). Not a failure: try again with the newer object,
		// rate-limited, the way the Kubebuilder tutorial requeues.
		logf.FromContext(ctx).V(1).Info("Conflict; requeueing", "error", err.Error())
		return ctrl.Result{Requeue: true}, nil //nolint:staticcheck // the tutorial's rate-limited requeue
	}
	if err != nil {
		r.Recorder.Eventf(memcached, nil, corev1.EventTypeWarning, "ReconcileFailed", "Reconcile",
			"Reconciling failed, will retry: %s", err.Error())
	}
	return result, err
}

func (r *MemcachedReconciler) reconcile(ctx context.Context, memcached *cachev1beta1.Memcached) (ctrl.Result, error) {
	log := logf.FromContext(ctx)

	// The Deployment: create it when missing, put it back when it drifted from the spec, and
	// never touch one of the same name that this Memcached does not control.
	deployment := &appsv1.Deployment{}
	err := r.Get(ctx, client.ObjectKeyFromObject(memcached), deployment)
	switch {
	case apierrors.IsNotFound(err):
		deployment, err = r.deploymentForMemcached(memcached)
		if err != nil {
			return ctrl.Result{}, err
		}
		log.Info("Creating a new Deployment", "Deployment.Namespace", deployment.Namespace,
			"Deployment.Name", deployment.Name)
		if err := r.Create(ctx, deployment); err != nil {
			if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
				// The namespace goes, and the Memcached with it.
				return ctrl.Result{}, nil
			}
			return ctrl.Result{}, err
		}
		r.Recorder.Eventf(memcached, nil, corev1.EventTypeNormal, "Created", "CreateDeployment",
			"Created Deployment %s with %d replicas of %s", deployment.Name, memcached.Spec.Size, memcached.Spec.Image)
	case err != nil:
		return ctrl.Result{}, err
	case !metav1.IsControlledBy(deployment, memcached):
		return r.reportNotOwned(ctx, memcached)
	default:
		if err := r.updateDeployment(ctx, memcached, deployment); err != nil {
			return ctrl.Result{}, err
		}
	}

	// The Service in front of the pods, and a PodDisruptionBudget when there is more than one.
	service, err := r.ensureService(ctx, memcached)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.ensureBudget(ctx, memcached); err != nil {
		return ctrl.Result{}, err
	}

	// The status: the pods, how far the Deployment has rolled out, the conditions.
	nodes, err := r.podNames(ctx, memcached)
	if err != nil {
		return ctrl.Result{}, err
	}
	status := memcached.Status.DeepCopy()
	status.Nodes = nodes
	status.Service = service
	status.ReadyReplicas = deployment.Status.ReadyReplicas
	setConditions(status, rolloutOf(memcached.Spec.Size, deployment).conditions(), memcached.Generation)
	if err := r.updateStatus(ctx, memcached, status); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, nil
}

// updateDeployment updates the owned Deployment when its replicas, labels or pod template differ
// from what the Memcached asks for, and says so with Events.
func (r *MemcachedReconciler) updateDeployment(ctx context.Context, memcached *cachev1beta1.Memcached, found *appsv1.Deployment) error {
	desired, err := r.deploymentForMemcached(memcached)
	if err != nil {
		return err
	}
	hadReplicas := ptr.Deref(found.Spec.Replicas, 1)
	hadImage := containerImage(found)
	// DeepDerivative ignores what the desired object leaves unset, i.e. the fields the API
	// server defaults (imagePullPolicy, terminationMessagePath, ...).
	if hadReplicas == *desired.Spec.Replicas &&
		equality.Semantic.DeepDerivative(desired.Labels, found.Labels) &&
		equality.Semantic.DeepDerivative(desired.Spec.Template, found.Spec.Template) {
		return nil
	}

	if found.Labels == nil {
		found.Labels = map[string]string{}
	}
	maps.Copy(found.Labels, desired.Labels)
	found.Spec.Replicas = desired.Spec.Replicas
	found.Spec.Template = desired.Spec.Template
	logf.FromContext(ctx).Info("Updating the Deployment", "Deployment.Namespace", found.Namespace,
		"Deployment.Name", found.Name)
	if err := r.Update(ctx, found); err != nil {
		return err
	}
	if hadReplicas != memcached.Spec.Size {
		r.Recorder.Eventf(memcached, nil, corev1.EventTypeNormal, "Scaled", "ScaleDeployment",
			"Scaled Deployment %s from %d to %d replicas", found.Name, hadReplicas, memcached.Spec.Size)
	}
	if hadImage != memcached.Spec.Image {
		r.Recorder.Eventf(memcached, nil, corev1.EventTypeNormal, "Updated", "UpdateDeployment",
			"Set the image of Deployment %s to %s", found.Name, memcached.Spec.Image)
	}
	return nil
}

// reportNotOwned reports a Deployment of the Memcached's name that something else controls:
// Degraded in the status, a Warning Event the first time, and a recheck every few minutes.
func (r *MemcachedReconciler) reportNotOwned(ctx context.Context, memcached *cachev1beta1.Memcached) (ctrl.Result, error) {
	if !meta.IsStatusConditionPresentAndEqual(memcached.Status.Conditions, typeDegraded, metav1.ConditionTrue) ||
		meta.FindStatusCondition(memcached.Status.Conditions, typeDegraded).Reason != reasonNotOwned {
		r.Recorder.Eventf(memcached, nil, corev1.EventTypeWarning, reasonNotOwned, "Reconcile",
			"Deployment %s/%s exists and is not controlled by this Memcached; it is left untouched. "+
				"Delete or rename it, or rename the Memcached.", memcached.Namespace, memcached.Name)
	}
	nodes, err := r.podNames(ctx, memcached)
	if err != nil {
		return ctrl.Result{}, err
	}
	status := memcached.Status.DeepCopy()
	status.Nodes = nodes
	status.ReadyReplicas = 0
	setConditions(status, notOwnedConditions(memcached.Namespace, memcached.Name), memcached.Generation)
	if err := r.updateStatus(ctx, memcached, status); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: foreignRecheck}, nil
}

// ensureService creates or updates the Memcached's Service (port memcached to its pods), the
// idiomatic controllerutil way, and returns its name; "" when a Service of that name belongs to
// something else (it is left alone).
func (r *MemcachedReconciler) ensureService(ctx context.Context, memcached *cachev1beta1.Memcached) (string, error) {
	service := &corev1.Service{ObjectMeta: metav1.ObjectMeta{
		Name: dnsLabel(memcached.Name), Namespace: memcached.Namespace,
	}}
	existing := &corev1.Service{}
	err := r.Get(ctx, client.ObjectKeyFromObject(service), existing)
	if err == nil && !metav1.IsControlledBy(existing, memcached) {
		return "", nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return "", err
	}
	op, err := controllerutil.CreateOrUpdate(ctx, r.Client, service, func() error {
		if service.Labels == nil {
			service.Labels = map[string]string{}
		}
		maps.Copy(service.Labels, objectLabels(memcached.Name))
		service.Spec.Selector = selectorLabels(memcached.Name)
		service.Spec.Ports = []corev1.ServicePort{{
			Name:       memcachedPortName,
			Port:       memcachedPort,
			TargetPort: intstr.FromString(memcachedPortName),
			Protocol:   corev1.ProtocolTCP,
		}}
		return ctrl.SetControllerReference(memcached, service, r.Scheme)
	})
	if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
		return "", nil
	}
	if op == controllerutil.OperationResultCreated {
		r.Recorder.Eventf(memcached, nil, corev1.EventTypeNormal, "Created", "CreateService",
			"Created Service %s", service.Name)
	}
	return service.Name, err
}

// ensureBudget keeps a PodDisruptionBudget of at most one unavailable pod while the Memcached
// has more than one, and deletes it (when it is the Memcached's own) otherwise.
func (r *MemcachedReconciler) ensureBudget(ctx context.Context, memcached *cachev1beta1.Memcached) error {
	budget := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{
		Name: memcached.Name, Namespace: memcached.Namespace,
	}}
	if memcached.Spec.Size <= 1 {
		existing := &policyv1.PodDisruptionBudget{}
		err := r.Get(ctx, client.ObjectKeyFromObject(budget), existing)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil || !metav1.IsControlledBy(existing, memcached) {
			return err
		}
		return client.IgnoreNotFound(r.Delete(ctx, existing))
	}
	op, err := controllerutil.CreateOrUpdate(ctx, r.Client, budget, func() error {
		if budget.CreationTimestamp.IsZero() || metav1.IsControlledBy(budget, memcached) {
			if budget.Labels == nil {
				budget.Labels = map[string]string{}
			}
			maps.Copy(budget.Labels, objectLabels(memcached.Name))
			budget.Spec.MaxUnavailable = new(intstr.FromInt32(1))
			budget.Spec.Selector = &metav1.LabelSelector{MatchLabels: selectorLabels(memcached.Name)}
			return ctrl.SetControllerReference(memcached, budget, r.Scheme)
		}
		return nil
	})
	if apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
		return nil
	}
	if op == controllerutil.OperationResultCreated {
		r.Recorder.Eventf(memcached, nil, corev1.EventTypeNormal, "Created", "CreatePodDisruptionBudget",
			"Created PodDisruptionBudget %s", budget.Name)
	}
	return err
}

// podNames are the sorted names of the Memcached's pods, leaving out pods being deleted.
func (r *MemcachedReconciler) podNames(ctx context.Context, memcached *cachev1beta1.Memcached) ([]string, error) {
	pods := &metav1.PartialObjectMetadataList{}
	pods.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("PodList"))
	if err := r.List(ctx, pods, client.InNamespace(memcached.Namespace),
		client.MatchingLabels(selectorLabels(memcached.Name))); err != nil {
		return nil, err
	}
	var names []string
	for _, pod := range pods.Items {
		if pod.DeletionTimestamp.IsZero() {
			names = append(names, pod.Name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// setConditions sets the status's observed generation and conditions; a condition whose status
// holds keeps its lastTransitionTime (meta.SetStatusCondition's rule).
func setConditions(status *cachev1beta1.MemcachedStatus, conditions []metav1.Condition, generation int64) {
	status.ObservedGeneration = generation
	for _, c := range conditions {
		c.ObservedGeneration = generation
		meta.SetStatusCondition(&status.Conditions, c)
	}
}

// updateStatus writes status when it differs from what the Memcached reports.
func (r *MemcachedReconciler) updateStatus(ctx context.Context, memcached *cachev1beta1.Memcached, status *cachev1beta1.MemcachedStatus) error {
	if equality.Semantic.DeepEqual(&memcached.Status, status) {
		return nil
	}
	memcached.Status = *status
	return r.Status().Update(ctx, memcached)
}

// deploymentForMemcached returns the Deployment a Memcached asks for.
func (r *MemcachedReconciler) deploymentForMemcached(memcached *cachev1beta1.Memcached) (*appsv1.Deployment, error) {
	labels := objectLabels(memcached.Name)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{
			Name:      memcached.Name,
			Namespace: memcached.Namespace,
			Labels:    labels,
		},
		Spec: appsv1.DeploymentSpec{
			Replicas: new(memcached.Spec.Size),
			Selector: &metav1.LabelSelector{
				MatchLabels: selectorLabels(memcached.Name),
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels: maps.Clone(labels),
				},
				Spec: corev1.PodSpec{
					// Restricted Pod Security Standard.
					// More info: https://kubernetes.io/docs/concepts/security/pod-security-standards/#restricted
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot: new(true),
						RunAsUser:    new(memcachedUser),
						SeccompProfile: &corev1.SeccompProfile{
							Type: corev1.SeccompProfileTypeRuntimeDefault,
						},
					},
					Containers: []corev1.Container{{
						Name:    memcachedContainerName,
						Image:   memcached.Spec.Image,
						Command: memcachedCommand,
						Ports: []corev1.ContainerPort{{
							ContainerPort: memcachedPort,
							Name:          memcachedPortName,
							Protocol:      corev1.ProtocolTCP,
						}},
						SecurityContext: &corev1.SecurityContext{
							RunAsNonRoot:             new(true),
							RunAsUser:                new(memcachedUser),
							AllowPrivilegeEscalation: new(false),
							Capabilities: &corev1.Capabilities{
								Drop: []corev1.Capability{"ALL"},
							},
							SeccompProfile: &corev1.SeccompProfile{
								Type: corev1.SeccompProfileTypeRuntimeDefault,
							},
						},
					}},
				},
			},
		},
	}
	// The controller owner reference: deleting the Memcached garbage-collects the Deployment.
	if err := ctrl.SetControllerReference(memcached, dep, r.Scheme); err != nil {
		return nil, err
	}
	return dep, nil
}

func containerImage(d *appsv1.Deployment) string {
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == memcachedContainerName {
			return c.Image
		}
	}
	return ""
}

// memcachedForPod maps a memcached pod to its Memcached by the memcached_cr label. The label is
// the Memcached's name unless the name is too long for a label value; then the Memcacheds of the
// namespace are searched for the one whose shortened name it is.
func (r *MemcachedReconciler) memcachedForPod(ctx context.Context, pod client.Object) []reconcile.Request {
	labels := pod.GetLabels()
	value, ok := labels[labelCR]
	if labels[labelApp] != appName || !ok {
		return nil
	}
	direct := types.NamespacedName{Namespace: pod.GetNamespace(), Name: value}
	if err := r.Get(ctx, direct, &cachev1beta1.Memcached{}); err == nil {
		return []reconcile.Request{{NamespacedName: direct}}
	}
	memcacheds := &cachev1beta1.MemcachedList{}
	if err := r.List(ctx, memcacheds, client.InNamespace(pod.GetNamespace())); err != nil {
		return nil
	}
	for _, mc := range memcacheds.Items {
		if labelValue(mc.Name) == value {
			return []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(&mc)}}
		}
	}
	return nil
}

// memcachedForNamesake maps a Deployment that no Memcached controls to the Memcached of the same
// name, if there is one: that Memcached reports the clash, and recovers as soon as it is gone.
// (Deployments a Memcached controls reach it through Owns.)
func (r *MemcachedReconciler) memcachedForNamesake(ctx context.Context, deployment client.Object) []reconcile.Request {
	if owner := metav1.GetControllerOf(deployment); owner != nil &&
		owner.Kind == "Memcached" && owner.APIVersion == cachev1beta1.GroupVersion.String() {
		return nil
	}
	key := client.ObjectKeyFromObject(deployment)
	if err := r.Get(ctx, key, &cachev1beta1.Memcached{}); err != nil {
		return nil
	}
	return []reconcile.Request{{NamespacedName: key}}
}

// podNamesChanged passes pod events that can change status.nodes: creations, deletions, and
// updates of labels or of the deletion timestamp (not the many status updates of a running pod).
var podNamesChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		return !maps.Equal(e.ObjectOld.GetLabels(), e.ObjectNew.GetLabels()) ||
			!e.ObjectOld.GetDeletionTimestamp().Equal(e.ObjectNew.GetDeletionTimestamp())
	},
}

// SetupWithManager sets up the controller with the Manager.
func (r *MemcachedReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&cachev1beta1.Memcached{}).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		Owns(&policyv1.PodDisruptionBudget{}).
		Watches(&appsv1.Deployment{}, handler.EnqueueRequestsFromMapFunc(r.memcachedForNamesake)).
		// Pods as metadata only: status.nodes needs their names and labels, not whole Pods.
		WatchesMetadata(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.memcachedForPod),
			builder.WithPredicates(podNamesChanged)).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.MaxConcurrentReconciles}).
		Named("memcached").
		Complete(r)
}
