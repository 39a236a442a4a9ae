//! The OLM bundle validator: a small Go program in `xtask/validate/bundle/` built from
//! operator-framework's own module (`github.com/operator-framework/api` v0.45.0), so a bundle is
//! checked by the same code OLM's tooling uses rather than by a re-implementation. It runs what
//! `operator-sdk bundle validate --select-optional suite=operatorframework` runs: the default
//! bundle validators (CSV, CRDs, the bundle as a whole) and the operatorframework suite
//! (operatorhubv2, capabilities, categories, good-practices, alpha-deprecated-apis), plus the
//! required keys of `metadata/annotations.yaml`. It is never shipped.
//!
//! [`validate`] builds it once per version of its sources into the local cluster's cache
//! (`<cache>/bundle-validator/<hash of the sources>/validate-bundle`, see [`GoModule`]), runs
//! it on a bundle directory and returns its [`Findings`]. The program prints one finding a
//! line, `error: <validator>: <message>` or `warning: <validator>: <message>`, then a summary
//! line (`1 error, 2 warnings`); it exits 1 when it found an error and 2 when it could not read
//! the bundle.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

use crate::gomodule::GoModule;

/// The validator's Go module.
const MODULE: GoModule = GoModule {
    what: "the OLM bundle validator",
    cache_dir: "bundle-validator",
    repo_dir: "xtask/validate/bundle",
    binary: "validate-bundle",
    main_package: ".",
    ldflags: "",
    tags: "",
    cold_build: "about 2 minutes",
    sources: &[
        ("go.mod", include_str!("../validate/bundle/go.mod")),
        ("go.sum", include_str!("../validate/bundle/go.sum")),
        ("main.go", include_str!("../validate/bundle/main.go")),
    ],
};

/// What the validator found in a bundle, each finding as `<validator>: <message>`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Findings {
    /// What must be fixed before the bundle is published.
    pub errors: Vec<String>,
    /// What OperatorHub and the good practices recommend fixing.
    pub warnings: Vec<String>,
}

/// Validates the bundle in `bundle_dir` (`manifests/` and `metadata/annotations.yaml`), for a
/// cluster of `k8s_version` (`1.33`; empty to go by the CSV's `spec.minKubeVersion`), building
/// the validator first unless it is cached. `progress` receives a line per build step (nothing
/// when the validator is cached). Synchronous, like the build.
///
/// # Errors
/// When the validator cannot be built (see [`GoModule::build`]), when it cannot read the bundle
/// (a missing directory, no CSV, unparsable YAML), or when it crashes; the message holds its
/// output. Findings, errors included, are not an `Err`.
pub fn validate(
    bundle_dir: &Path,
    k8s_version: &str,
    progress: impl Fn(&str),
) -> anyhow::Result<Findings> {
    let binary = MODULE.build(progress)?;
    run(Command::new(&binary), bundle_dir, k8s_version)
}

/// Runs the validator `cmd` on `bundle_dir` and reads its findings.
fn run(mut cmd: Command, bundle_dir: &Path, k8s_version: &str) -> anyhow::Result<Findings> {
    if !k8s_version.is_empty() {
        cmd.arg("--k8s-version").arg(k8s_version);
    }
    let out = cmd
        .arg("--")
        .arg(bundle_dir)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", MODULE.what))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let output = || {
        [stdout.trim(), stderr.trim()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("\n")
    };
    // 0: no error; 1: errors found. Anything else (2 for an unreadable bundle, a Go panic, a
    // signal) means the bundle was not validated.
    let found_errors = match out.status.code() {
        Some(0) => false,
        Some(1) => true,
        _ => bail!(
            "{} could not validate {} ({}):\n{}",
            MODULE.what,
            bundle_dir.display(),
            out.status,
            output()
        ),
    };
    let findings = parse(&stdout).with_context(|| {
        format!(
            "reading what {} said about {}:\n{}",
            MODULE.what,
            bundle_dir.display(),
            output()
        )
    })?;
    if found_errors == findings.errors.is_empty() {
        bail!(
            "{} exited with {} but reported {} errors:\n{}",
            MODULE.what,
            out.status,
            findings.errors.len(),
            output()
        );
    }
    Ok(findings)
}

/// Reads the validator's output: finding lines, then the summary line, whose counts must match.
fn parse(stdout: &str) -> anyhow::Result<Findings> {
    let mut findings = Findings::default();
    let mut summary = None;
    for line in stdout.lines().filter(|l| !l.trim().is_empty()) {
        if summary.is_some() {
            bail!("a line after the summary: {line:?}");
        }
        if let Some(finding) = line.strip_prefix("error: ") {
            findings.errors.push(finding.to_owned());
        } else if let Some(finding) = line.strip_prefix("warning: ") {
            findings.warnings.push(finding.to_owned());
        } else {
            summary = Some(
                parse_summary(line)
                    .with_context(|| format!("neither a finding nor the summary: {line:?}"))?,
            );
        }
    }
    let Some((errors, warnings)) = summary else {
        bail!("no summary line (the output ended early)");
    };
    if (errors, warnings) != (findings.errors.len(), findings.warnings.len()) {
        bail!(
            "the summary counts {errors} errors and {warnings} warnings, the lines {} and {}",
            findings.errors.len(),
            findings.warnings.len()
        );
    }
    Ok(findings)
}

/// `1 error, 2 warnings` gives `(1, 2)`.
fn parse_summary(line: &str) -> Option<(usize, usize)> {
    let (errors, warnings) = line.trim().split_once(", ")?;
    let count = |part: &str, singular: &str, plural: &str| {
        let (n, noun) = part.split_once(' ')?;
        let n: usize = n.parse().ok()?;
        (noun == if n == 1 { singular } else { plural }).then_some(n)
    };
    Some((
        count(errors, "error", "errors")?,
        count(warnings, "warning", "warnings")?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_of_the_module_is_embedded() {
        MODULE.assert_every_file_is_embedded();
    }

    #[test]
    fn the_validator_uses_operator_framework_api_v0_45_0() {
        let go_mod = MODULE.go_mod();
        assert!(go_mod.starts_with(concat!(
            "module ",
            product::name!(),
            ".dev/validate/bundle\n"
        )));
        assert!(
            go_mod.lines().any(
                |l| l.trim() == "require github.com/operator-framework/api v0.45.0"
                    || l.trim() == "github.com/operator-framework/api v0.45.0"
            ),
            "{go_mod}"
        );
        let required = MODULE.go_line().expect("a go line");
        assert!(
            localcluster::toolchain::at_least("go1.26.8", required),
            "{required}"
        );
    }

    #[test]
    fn findings_are_read_by_level() {
        let out = "error: operatorhubv2: (memcached-operator.v0.1.0) csv.Spec.Version must be set\n\
                   warning: csv: (memcached-operator.v0.1.0) annotations not found\n\
                   warning: good-practices: Value memcached-operator.v0.1.0: owned CRD \"x\" has \
                   an empty description\n\
                   1 error, 2 warnings\n";
        assert_eq!(
            parse(out).expect("valid output"),
            Findings {
                errors: vec![
                    "operatorhubv2: (memcached-operator.v0.1.0) csv.Spec.Version must be set"
                        .to_owned()
                ],
                warnings: vec![
                    "csv: (memcached-operator.v0.1.0) annotations not found".to_owned(),
                    "good-practices: Value memcached-operator.v0.1.0: owned CRD \"x\" has an \
                     empty description"
                        .to_owned(),
                ],
            }
        );
        assert_eq!(
            parse("0 errors, 0 warnings\n").expect("a clean bundle"),
            Findings::default()
        );
    }

    #[test]
    fn the_summary_is_required_and_must_match() {
        let early = parse("error: csv: x\n").expect_err("no summary");
        assert!(early.to_string().contains("no summary"), "{early}");
        let mismatch = parse("error: csv: x\n0 errors, 0 warnings\n").expect_err("counts differ");
        assert!(
            mismatch.to_string().contains("summary counts"),
            "{mismatch}"
        );
        let after = parse("0 errors, 0 warnings\nwarning: csv: x\n").expect_err("after");
        assert!(after.to_string().contains("after the summary"), "{after}");
        let unknown = parse("panic: boom\n0 errors, 0 warnings\n").expect_err("unknown line");
        assert!(unknown.to_string().contains("panic: boom"), "{unknown}");
    }

    #[test]
    fn summaries_agree_in_number() {
        assert_eq!(parse_summary("1 error, 1 warning"), Some((1, 1)));
        assert_eq!(parse_summary("0 errors, 12 warnings"), Some((0, 12)));
        assert_eq!(parse_summary("2 error, 1 warning"), None);
        assert_eq!(parse_summary("1 errors, 0 warnings"), None);
        assert_eq!(parse_summary("some errors, 0 warnings"), None);
        assert_eq!(parse_summary("0 errors"), None);
    }

    /// A stand-in for the validator: `sh -c script`, which sees the arguments as `$@`.
    fn stand_in(script: &str) -> Command {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script, "validate-bundle"]);
        cmd
    }

    #[test]
    fn the_bundle_and_kubernetes_version_are_passed() {
        let findings = run(
            stand_in(r#"echo "warning: args: $*"; echo "0 errors, 1 warning""#),
            Path::new("out/bundle"),
            "1.33",
        )
        .expect("a clean run");
        assert_eq!(
            findings.warnings,
            ["args: --k8s-version 1.33 -- out/bundle"]
        );
        let findings = run(
            stand_in(r#"echo "warning: args: $*"; echo "0 errors, 1 warning""#),
            Path::new("out/bundle"),
            "",
        )
        .expect("a clean run");
        assert_eq!(findings.warnings, ["args: -- out/bundle"]);
    }

    #[test]
    fn errors_found_are_findings_not_an_err() {
        let findings = run(
            stand_in("echo 'error: csv: bad'; echo '1 error, 0 warnings'; exit 1"),
            Path::new("b"),
            "",
        )
        .expect("findings");
        assert_eq!(findings.errors, ["csv: bad"]);
        let confused = run(
            stand_in("echo '0 errors, 0 warnings'; exit 1"),
            Path::new("b"),
            "",
        )
        .expect_err("exit 1 without errors");
        assert!(
            confused.to_string().contains("reported 0 errors"),
            "{confused}"
        );
    }

    #[test]
    fn an_unreadable_bundle_or_a_crash_is_an_err_with_the_output() {
        let unreadable = run(
            stand_in(
                "echo 'validate-bundle: cannot read the bundle: stat b: no such file' >&2; exit 2",
            ),
            Path::new("b"),
            "",
        )
        .expect_err("exit 2");
        let message = format!("{unreadable:#}");
        assert!(message.contains("could not validate b"), "{message}");
        assert!(
            message.contains("cannot read the bundle: stat b"),
            "{message}"
        );
        let crash = run(
            stand_in("echo 'warning: csv: x'; kill -SEGV $$"),
            Path::new("b"),
            "",
        )
        .expect_err("a signal");
        assert!(crash.to_string().contains("warning: csv: x"), "{crash:#}");
    }

    /// A small bundle that passes: one owned CRD, a deployment, the annotations.
    fn write_bundle(dir: &Path, csv: &str) {
        let files = [
            ("metadata/annotations.yaml", ANNOTATIONS),
            (
                concat!("manifests/", product::group!(cache), "_memcacheds.yaml"),
                CRD,
            ),
            (
                "manifests/memcached-operator.clusterserviceversion.yaml",
                csv,
            ),
        ];
        for (name, text) in files {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("creating a dir");
            std::fs::write(&path, text).expect("writing a bundle file");
        }
    }

    const ANNOTATIONS: &str = "\
annotations:
  operators.operatorframework.io.bundle.mediatype.v1: registry+v1
  operators.operatorframework.io.bundle.manifests.v1: manifests/
  operators.operatorframework.io.bundle.metadata.v1: metadata/
  operators.operatorframework.io.bundle.package.v1: memcached-operator
  operators.operatorframework.io.bundle.channels.v1: alpha
  operators.operatorframework.io.bundle.channel.default.v1: alpha
";

    const CRD: &str = "\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: memcacheds.cache.example.com
spec:
  group: cache.example.com
  names: {kind: Memcached, listKind: MemcachedList, plural: memcacheds, singular: memcached}
  scope: Namespaced
  versions:
  - name: v1alpha1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer, format: int32}
";

    const CSV: &str = "\
apiVersion: operators.coreos.com/v1alpha1
kind: ClusterServiceVersion
metadata:
  name: memcached-operator.v0.1.0
spec:
  displayName: Memcached Operator
  provider: {name: Example}
  version: 0.1.0
  installModes:
  - {type: AllNamespaces, supported: true}
  customresourcedefinitions:
    owned:
    - {name: memcacheds.cache.example.com, version: v1alpha1, kind: Memcached}
  install:
    strategy: deployment
    spec:
      deployments:
      - name: memcached-operator
        spec:
          selector: {matchLabels: {app: memcached-operator}}
          template:
            metadata: {labels: {app: memcached-operator}}
            spec:
              containers:
              - {name: manager, image: example.com/memcached-operator:v0.1.0}
";

    #[test]
    #[ignore = "builds the validator with Go, downloading operator-framework/api through the Go module proxy"]
    fn a_small_bundle_passes_and_a_broken_one_does_not() {
        let progress = |line: &str| println!("{line}");

        let good = tempfile::tempdir().expect("a temporary directory");
        write_bundle(good.path(), CSV);
        let findings = validate(good.path(), "1.33", progress).expect("validated");
        println!("{findings:#?}");
        assert!(findings.errors.is_empty(), "{findings:#?}");
        assert!(
            findings
                .warnings
                .iter()
                .any(|w| w.starts_with("operatorhubv2: ")
                    && w.ends_with("csv.Spec.Icon not specified")),
            "{findings:#?}"
        );

        // No spec.version, and an icon OperatorHub cannot show.
        let broken = tempfile::tempdir().expect("a temporary directory");
        let csv = CSV.replace(
            "  version: 0.1.0\n",
            "  icon:\n  - {base64data: Qk0=, mediatype: image/bmp}\n",
        );
        write_bundle(broken.path(), &csv);
        let findings = validate(broken.path(), "1.33", progress).expect("validated");
        println!("{findings:#?}");
        let has = |needle: &str| findings.errors.iter().any(|e| e.contains(needle));
        assert!(has("csv.Spec.Version must be set"), "{findings:#?}");
        assert!(
            has("csv.Spec.Icon image/bmp does not have a valid mediatype"),
            "{findings:#?}"
        );

        // Not a bundle at all.
        let empty = tempfile::tempdir().expect("a temporary directory");
        let error = validate(empty.path(), "1.33", progress).expect_err("no manifests/");
        let message = format!("{error:#}");
        assert!(
            message.contains(&empty.path().join("manifests").display().to_string()),
            "{message}"
        );
    }
}
