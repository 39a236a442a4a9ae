package controller

import (
	"hash/fnv"
	"strings"
	"testing"
)

// The same cases as crates/kube-operator-runtime/src/labels.rs: both controllers must derive the same
// label values, or a Memcached with a long name gets a different selector from each.

func TestShortNamesAreKept(t *testing.T) {
	for _, name := range []string{"memcached-sample", strings.Repeat("a", 63)} {
		if got := labelValue(name); got != name {
			t.Errorf("labelValue(%q) = %q", name, got)
		}
	}
}

func TestLongNamesAreShortenedValidlyAndStably(t *testing.T) {
	long := "m" + strings.Repeat("x", 99)
	value := labelValue(long)
	if len(value) != 63 || !isValidLabelValue(value) || !strings.HasPrefix(value, "mxxx") {
		t.Errorf("labelValue(long) = %q", value)
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte("a"))
	if h.Sum64() != 0xaf63dc4c8601ec8c {
		t.Errorf("FNV-1a of %q = %x", "a", h.Sum64())
	}
	// The value the Rust label_value gives for this name.
	want := "m" + strings.Repeat("x", 51) + "-52ed3effdb"
	if value != want {
		t.Errorf("labelValue(long) = %q, want %q", value, want)
	}
}

func TestNamesSharingALongPrefixGetDifferentValues(t *testing.T) {
	base := strings.Repeat("y", 80)
	if labelValue(base+"-one") == labelValue(base+"-two") {
		t.Error("same value for different names")
	}
}

func TestThePrefixNeverEndsInPunctuation(t *testing.T) {
	name := strings.Repeat("a", 51) + "." + strings.Repeat("b", 40)
	value := labelValue(name)
	if !isValidLabelValue(value) || strings.Contains(value, ".-") {
		t.Errorf("labelValue(%q) = %q", name, value)
	}
}

func TestValidity(t *testing.T) {
	for value, valid := range map[string]bool{
		"": true, "a.b_c-d": true, "-a": false, "a.": false, "a/b": false, strings.Repeat("a", 64): false,
	} {
		if isValidLabelValue(value) != valid {
			t.Errorf("isValidLabelValue(%q) != %v", value, valid)
		}
	}
}
