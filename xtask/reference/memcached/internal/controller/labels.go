package controller

import (
	"fmt"
	"hash/fnv"
	"strings"
)

// Labels on the Deployment and its pods, the same as the Rust controller's
// (crates/controllers/src/memcached.rs and crates/kube-operator-runtime/src/labels.rs), so both leave equivalent objects.
const (
	labelApp       = "app"
	appName        = "memcached"
	labelCR        = "memcached_cr"
	labelName      = "app.kubernetes.io/name"
	labelInstance  = "app.kubernetes.io/instance"
	labelManagedBy = "app.kubernetes.io/managed-by"
	managedBy      = "operator-manager"
	labelPartOf    = "app.kubernetes.io/part-of"
	partOf         = "operator-platform"
)

// maxLabelValue is the longest label value Kubernetes accepts.
const maxLabelValue = 63

// hashDigits is how many hex digits of the name's hash a shortened label value ends with.
const hashDigits = 10

// selectorLabels select a Memcached's pods: app=memcached, memcached_cr=<name>.
func selectorLabels(memcachedName string) map[string]string {
	return map[string]string{
		labelApp: appName,
		labelCR:  labelValue(memcachedName),
	}
}

// objectLabels are every label of the Deployment and its pods: the selector plus the
// recommended app.kubernetes.io labels.
func objectLabels(memcachedName string) map[string]string {
	labels := selectorLabels(memcachedName)
	labels[labelName] = appName
	labels[labelInstance] = labelValue(memcachedName)
	labels[labelManagedBy] = managedBy
	labels[labelPartOf] = partOf
	return labels
}

// labelValue is a label value that stands for name: name itself when it fits in 63 characters,
// otherwise a prefix of it, "-" and 10 hex digits of its 64-bit FNV-1a hash. This is the Rust
// controller's labels::label_value, character for character: a Memcached whose name is longer
// than a label value allows gets the same selector from either controller.
func labelValue(name string) string {
	if len(name) <= maxLabelValue && isValidLabelValue(name) {
		return name
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	hash := fmt.Sprintf("%016x", h.Sum64())[:hashDigits]
	keep := maxLabelValue - hashDigits - 1
	var prefix strings.Builder
	n := 0
	for _, c := range name {
		if n == keep {
			break
		}
		if isASCIIAlphanumeric(c) || c == '-' || c == '_' || c == '.' {
			prefix.WriteRune(c)
		} else {
			prefix.WriteByte('-')
		}
		n++
	}
	trimmed := strings.TrimFunc(prefix.String(), func(c rune) bool { return !isASCIIAlphanumeric(c) })
	if trimmed == "" {
		return hash
	}
	return trimmed + "-" + hash
}

// isValidLabelValue reports whether value is empty, or at most 63 characters of [A-Za-z0-9-_.]
// beginning and ending with an alphanumeric character.
func isValidLabelValue(value string) bool {
	if value == "" {
		return true
	}
	if len(value) > maxLabelValue {
		return false
	}
	for _, c := range []byte(value) {
		if !isASCIIAlphanumeric(rune(c)) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return isASCIIAlphanumeric(rune(value[0])) && isASCIIAlphanumeric(rune(value[len(value)-1]))
}

func isASCIIAlphanumeric(c rune) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

// dnsLabel is a DNS label (RFC 1035) standing for the object name name, as Service names must
// be: name itself when it is one, otherwise a prefix of it, a "-" and the same hash as
// labelValue's (the Rust controller's labels::dns_label).
func dnsLabel(name string) string {
	isLabel := len(name) <= maxLabelValue && name != "" &&
		isLowerOrDigit(rune(name[0])) && !isDigit(rune(name[0])) &&
		isLowerOrDigit(rune(name[len(name)-1]))
	for _, c := range name {
		if !isLowerOrDigit(c) && c != '-' {
			isLabel = false
		}
	}
	if isLabel {
		return name
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	hash := fmt.Sprintf("%016x", h.Sum64())[:hashDigits]
	var prefix strings.Builder
	n := 0
	for _, c := range name {
		if n == maxLabelValue-hashDigits-1 {
			break
		}
		if isLowerOrDigit(c) {
			prefix.WriteRune(c)
		} else {
			prefix.WriteByte('-')
		}
		n++
	}
	trimmed := strings.TrimLeftFunc(prefix.String(), func(c rune) bool { return c < 'a' || c > 'z' })
	trimmed = strings.TrimRight(trimmed, "-")
	if trimmed == "" {
		return "x-" + hash
	}
	return trimmed + "-" + hash
}

func isLowerOrDigit(c rune) bool { return (c >= 'a' && c <= 'z') || isDigit(c) }

func isDigit(c rune) bool { return c >= '0' && c <= '9' }
