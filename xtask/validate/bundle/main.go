// Command validate-bundle checks an OLM bundle directory with operator-framework's own
// validators (github.com/operator-framework/api), the ones that
// `operator-sdk bundle validate --select-optional suite=operatorframework` runs: the default
// bundle validators (CSV, CRDs, the bundle as a whole) and the operatorframework suite
// (operatorhubv2, capabilities, categories, alpha-deprecated-apis, good-practices). It also
// checks the required keys of metadata/annotations.yaml (as "annotations"), as operator-sdk's
// bundle format check does.
// `cargo xtask` builds and runs it; it is never shipped.
//
// Usage:
//
//	validate-bundle [--k8s-version VERSION] [--strict] BUNDLE_DIR
//
// BUNDLE_DIR has the usual layout: manifests/ (one CSV, its CRDs and other objects) and
// metadata/annotations.yaml. Each finding is printed on a line of its own,
// `error: <validator>: <message>` or `warning: <validator>: <message>`, then a summary line.
// The exit code is 0 when there is no error, 1 when there is one (or, with --strict, a
// warning), and 2 for bad usage or a bundle that cannot be read.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/operator-framework/api/pkg/manifests"
	"github.com/operator-framework/api/pkg/validation"
	apierrors "github.com/operator-framework/api/pkg/validation/errors"
	interfaces "github.com/operator-framework/api/pkg/validation/interfaces"
	"sigs.k8s.io/yaml"
)

// check is a validator and the name its findings are printed under: operator-sdk's name for
// the optional ones (`operator-sdk bundle validate --list-optional`).
type check struct {
	name      string
	validator interfaces.Validator
}

// checks are validation.DefaultBundleValidators, in its order, then the validators labelled
// suite=operatorframework in operator-sdk, in its order.
var checks = []check{
	{"csv", validation.ClusterServiceVersionValidator},
	{"crd", validation.CustomResourceDefinitionValidator},
	{"bundle", validation.BundleValidator},
	{"operatorhubv2", validation.OperatorHubV2Validator},
	{"capabilities", validation.StandardCapabilitiesValidator},
	{"categories", validation.StandardCategoriesValidator},
	{"alpha-deprecated-apis", validation.AlphaDeprecatedAPIsValidator},
	{"good-practices", validation.GoodPracticesValidator},
}

// finding is one error or warning of one validator.
type finding struct {
	validator string
	message   string
}

func main() {
	findings, strict, err := run(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "validate-bundle: %v\n", err)
		os.Exit(2)
	}
	for _, f := range findings.errors {
		fmt.Printf("error: %s: %s\n", f.validator, f.message)
	}
	for _, f := range findings.warnings {
		fmt.Printf("warning: %s: %s\n", f.validator, f.message)
	}
	errs, warns := len(findings.errors), len(findings.warnings)
	fmt.Printf("%s, %s\n", count(errs, "error"), count(warns, "warning"))
	if errs > 0 || (strict && warns > 0) {
		os.Exit(1)
	}
}

// findings holds what the validators found, errors and warnings apart.
type findings struct {
	errors, warnings []finding
}

func (f *findings) add(validator string, results []apierrors.ManifestResult) {
	for _, result := range results {
		for _, e := range result.Errors {
			f.errors = append(f.errors, finding{validator, message(e)})
		}
		for _, w := range result.Warnings {
			f.warnings = append(f.warnings, finding{validator, message(w)})
		}
	}
}

// run parses the arguments, loads the bundle and validates it. Flags may come before or after
// the bundle directory.
func run(args []string, stderr io.Writer) (f findings, strict bool, err error) {
	flags := flag.NewFlagSet("validate-bundle", flag.ContinueOnError)
	flags.SetOutput(stderr)
	k8sVersion := flags.String("k8s-version", "",
		"the Kubernetes version the bundle is meant for, e.g. 1.33 (passed to the validators as "+
			"the optional value k8s-version; without it alpha-deprecated-apis uses the CSV's "+
			"spec.minKubeVersion)")
	flags.BoolVar(&strict, "strict", false, "fail (exit 1) on warnings too")
	flags.Usage = func() {
		fmt.Fprintln(stderr, "usage: validate-bundle [--k8s-version VERSION] [--strict] BUNDLE_DIR")
		flags.PrintDefaults()
	}
	var dirs []string
	for {
		if err := flags.Parse(args); err != nil {
			return f, strict, fmt.Errorf("bad usage: %w", err)
		}
		args = flags.Args()
		if len(args) == 0 {
			break
		}
		dirs, args = append(dirs, args[0]), args[1:]
	}
	if len(dirs) != 1 {
		flags.Usage()
		return f, strict, fmt.Errorf("bad usage: expected one bundle directory, got %d", len(dirs))
	}
	dir := dirs[0]

	annotations, err := readLayout(dir)
	if err != nil {
		return f, strict, err
	}
	f.add("annotations", checkAnnotations(annotations))

	// manifests/, as operator-sdk loads it: the loader skips a directory whose name starts with
	// a dot, which the bundle directory's may (`.`, a temporary directory).
	manifestsDir := filepath.Join(dir, "manifests")
	bundle, err := manifests.GetBundleFromDir(manifestsDir)
	if err != nil {
		return f, strict, fmt.Errorf("cannot load the bundle in %s: %w", manifestsDir, err)
	}
	if bundle == nil || bundle.CSV == nil {
		return f, strict, fmt.Errorf("cannot load the bundle in %s: no ClusterServiceVersion found", manifestsDir)
	}
	// What the loader takes from annotations.yaml when it walks the bundle directory, and
	// good-practices checks.
	bundle.Package = annotations[packageKey]
	bundle.Channels = strings.Split(annotations[channelsKey], ",")
	bundle.DefaultChannel = annotations[defaultChannelKey]

	// What operator-sdk passes its optional validators: every object of the bundle, the bundle
	// itself, and the optional values.
	objs := bundle.ObjectsToValidate()
	optional := map[string]string{}
	if *k8sVersion != "" {
		optional["k8s-version"] = *k8sVersion
	}
	objs = append(objs, optional)
	for _, c := range checks {
		f.add(c.name, c.validator.Validate(objs...))
	}
	return f, strict, nil
}

// The annotations that say how the bundle is laid out, and their expected values.
const (
	mediatypeKey      = "operators.operatorframework.io.bundle.mediatype.v1"
	manifestsKey      = "operators.operatorframework.io.bundle.manifests.v1"
	metadataKey       = "operators.operatorframework.io.bundle.metadata.v1"
	packageKey        = "operators.operatorframework.io.bundle.package.v1"
	channelsKey       = "operators.operatorframework.io.bundle.channels.v1"
	defaultChannelKey = "operators.operatorframework.io.bundle.channel.default.v1"
)

// readLayout checks that dir has manifests/ and metadata/annotations.yaml, and returns the
// annotations.
func readLayout(dir string) (map[string]string, error) {
	info, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("cannot read the bundle: %w", err)
	}
	if !info.IsDir() {
		return nil, fmt.Errorf("cannot read the bundle: %s is not a directory", dir)
	}
	manifestsDir := filepath.Join(dir, "manifests")
	if info, err := os.Stat(manifestsDir); err != nil || !info.IsDir() {
		return nil, fmt.Errorf("cannot read the bundle: %s is not a directory (a bundle has manifests/ and metadata/annotations.yaml)", manifestsDir)
	}
	path := filepath.Join(dir, "metadata", "annotations.yaml")
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read the bundle's annotations: %w", err)
	}
	var file struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := yaml.Unmarshal(text, &file); err != nil {
		return nil, fmt.Errorf("cannot parse %s: %w", path, err)
	}
	if file.Annotations == nil {
		return nil, fmt.Errorf("cannot parse %s: no `annotations` map", path)
	}
	return file.Annotations, nil
}

// checkAnnotations checks the annotations that OLM needs to unpack the bundle (those of
// operator-registry's bundle format check): a registry+v1 bundle in manifests/ and metadata/,
// its package, its channels, and a default channel among them when one is named.
func checkAnnotations(annotations map[string]string) []apierrors.ManifestResult {
	result := apierrors.ManifestResult{Name: "metadata/annotations.yaml"}
	expect := func(key, want string) {
		got, ok := annotations[key]
		switch {
		case !ok:
			result.Add(apierrors.ErrFieldMissing(fmt.Sprintf("missing annotation, expected %q", want), key, nil))
		case got != want:
			result.Add(apierrors.ErrFailedValidation(fmt.Sprintf("annotation %s must be %q", key, want), got))
		}
	}
	expect(mediatypeKey, "registry+v1")
	expect(manifestsKey, "manifests/")
	expect(metadataKey, "metadata/")
	for _, key := range []string{packageKey, channelsKey} {
		if strings.TrimSpace(annotations[key]) == "" {
			result.Add(apierrors.ErrFieldMissing("missing or empty annotation", key, nil))
		}
	}
	channels := strings.Split(annotations[channelsKey], ",")
	for i := range channels {
		channels[i] = strings.TrimSpace(channels[i])
	}
	if def := annotations[defaultChannelKey]; def != "" && !slices.Contains(channels, def) {
		result.Add(apierrors.ErrFailedValidation(
			fmt.Sprintf("the default channel is not one of the bundle's channels (%s)", annotations[channelsKey]), def))
	}
	return []apierrors.ManifestResult{result}
}

// message is a finding's text on one line, without its level (the line already says it) and
// without the empty value that most CSV checks carry (`Value : (name) ...` in operator-sdk's
// output).
func message(e apierrors.Error) string {
	if value, ok := e.BadValue.(string); ok && value == "" {
		e.BadValue = nil
	}
	text := e.Detail
	if e.Field != "" || e.BadValue != nil || text == "" {
		text = strings.TrimPrefix(e.Error(), string(e.Level)+": ")
	}
	return strings.Join(strings.Fields(text), " ")
}

func count(n int, noun string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", noun)
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
