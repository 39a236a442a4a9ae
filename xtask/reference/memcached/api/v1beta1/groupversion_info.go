// Package v1beta1 contains the API types of the cache.example.com/v1beta1 group, the version
// the API server stores: the same Memcached resource as crates/apis/src/memcached, seen from
// Go, with the fields the seed's controller acts on (size and image). Reading and writing the
// stored version needs no conversion webhook, so the reference runs without one. The CRD
// installed in the cluster is the one the Rust workspace generates (deploy/crds); nothing here
// renders a CRD.
// +kubebuilder:object:generate=true
// +groupName=cache.example.com
package v1beta1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group version used to register these objects.
	GroupVersion = schema.GroupVersion{Group: "cache.example.com", Version: "v1beta1"}

	// SchemeBuilder is used to add go types to the GroupVersionKind scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types in this group-version to the given scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
