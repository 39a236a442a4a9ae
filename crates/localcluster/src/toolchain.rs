//! Builds the control plane's binaries from source with the Go toolchain, once per set of
//! pinned versions.
//!
//! The sources come from the Go module proxy through three small wrapper modules (committed
//! under `go/` and embedded in this crate, `go.sum` included, so every build uses exactly the
//! same code). `k8s.io/kubernetes` cannot be installed with `go install` because its `go.mod`
//! replaces its staging modules with directories of its own repository; the wrapper points each
//! of them at the published module of the same release instead.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::Command;

use crate::{Error, Paths, Result, versions};

/// The binaries of the control plane, in the version-keyed cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binaries {
    dir: PathBuf,
}

/// Every binary the build produces.
pub const BINARIES: [&str; 10] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "kube-proxy",
    "kwok",
    PAUSE,
    "prometheus",
];

/// The real node's sandbox process, compiled from the C source in the Kubernetes module.
pub const PAUSE: &str = "pause";

/// The file, next to the binaries, with kwok's stages (how fake nodes and pods change state).
const KWOK_STAGES: &str = "kwok-stages.yaml";

/// Where the duration of the build that filled the cache is recorded.
const BUILD_TIME: &str = "build-seconds";

impl Binaries {
    /// The binaries in `dir`.
    pub fn in_dir(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The directory that holds them.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of the binary `name` (one of [`BINARIES`]).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `kubectl` of the same Kubernetes version, so nothing depends on a system kubectl.
    pub fn kubectl(&self) -> PathBuf {
        self.path("kubectl")
    }

    /// kwok's stage configuration: upstream's default node and pod stages of the pinned release.
    pub fn kwok_stages(&self) -> PathBuf {
        self.dir.join(KWOK_STAGES)
    }

    /// Whether every binary and the stage file are present.
    pub fn complete(&self) -> bool {
        BINARIES.iter().all(|b| self.path(b).is_file()) && self.kwok_stages().is_file()
    }

    /// How long the build that filled this cache took, when it was recorded. (With Go's build
    /// cache already warm, that is much less than a cold build.)
    pub fn recorded_build_time(&self) -> Option<Duration> {
        let text = std::fs::read_to_string(self.dir.join(BUILD_TIME)).ok()?;
        text.trim().parse::<f64>().ok().map(Duration::from_secs_f64)
    }
}

/// One wrapper module under `go/`.
struct GoModule {
    name: &'static str,
    files: &'static [(&'static str, &'static str)],
    /// The module whose download proves that the proxy (or the module cache) works.
    probe: &'static str,
    packages: &'static [&'static str],
    /// Whether to stamp the Kubernetes version into the binaries.
    kubernetes_version: bool,
    /// Go build tags.
    tags: &'static [&'static str],
}

const MODULES: [GoModule; 4] = [
    GoModule {
        name: "etcd",
        files: &[
            ("go.mod", include_str!("../go/etcd/go.mod")),
            ("go.sum", include_str!("../go/etcd/go.sum")),
            ("main.go", include_str!("../go/etcd/main.go")),
        ],
        probe: "go.etcd.io/etcd/server/v3",
        packages: &["."],
        kubernetes_version: false,
        tags: &[],
    },
    GoModule {
        name: "kwok",
        files: &[
            ("go.mod", include_str!("../go/kwok/go.mod")),
            ("go.sum", include_str!("../go/kwok/go.sum")),
        ],
        probe: "sigs.k8s.io/kwok",
        packages: &["sigs.k8s.io/kwok/cmd/kwok"],
        kubernetes_version: false,
        tags: &[],
    },
    GoModule {
        name: "kubernetes",
        files: &[
            ("go.mod", include_str!("../go/kubernetes/go.mod")),
            ("go.sum", include_str!("../go/kubernetes/go.sum")),
        ],
        probe: "k8s.io/kubernetes",
        packages: &[
            "k8s.io/kubernetes/cmd/kube-apiserver",
            "k8s.io/kubernetes/cmd/kube-controller-manager",
            "k8s.io/kubernetes/cmd/kube-scheduler",
            "k8s.io/kubernetes/cmd/kubectl",
            "k8s.io/kubernetes/cmd/kubelet",
            "k8s.io/kubernetes/cmd/kube-proxy",
        ],
        kubernetes_version: true,
        tags: &[],
    },
    GoModule {
        name: "prometheus",
        files: &[
            ("go.mod", include_str!("../go/prometheus/go.mod")),
            ("go.sum", include_str!("../go/prometheus/go.sum")),
        ],
        probe: "github.com/prometheus/prometheus",
        packages: &["github.com/prometheus/prometheus/cmd/prometheus"],
        kubernetes_version: false,
        // Kubernetes service discovery only: the tests need nothing else, and the other
        // discovery plugins pull in every cloud's SDK.
        tags: &["remove_all_sd", "enable_kubernetes_sd"],
    },
];

/// kwok's upstream stages that make fake nodes Ready (with a heartbeat) and pods Running and
/// Ready, then completed or deleted like a kubelet would.
const KWOK_STAGE_FILES: [&str; 5] = [
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat/node-heartbeat.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
];

/// The outcome of [`ensure`].
#[derive(Debug, Clone)]
pub struct Built {
    /// The binaries.
    pub binaries: Binaries,
    /// How long the build took, when this call built them; `None` when they were cached.
    pub build_time: Option<Duration>,
}

/// Makes sure the binaries of the pinned versions are in the cache, building them if not.
///
/// Safe to call from several processes at once: a file lock lets one build while the others
/// wait and then reuse its result. `progress` receives one line per step.
///
/// # Errors
/// [`Error::GoMissing`] without a Go toolchain, [`Error::ModuleProxy`] when the modules can
/// neither be downloaded nor found in the module cache, [`Error::GoBuild`] when compiling fails.
pub async fn ensure(paths: &Paths, progress: &(dyn Fn(&str) + Send + Sync)) -> Result<Built> {
    let binaries = Binaries::in_dir(paths.bin_dir());
    if binaries.complete() {
        return Ok(Built {
            binaries,
            build_time: None,
        });
    }
    let dir = paths.control_plane_dir();
    std::fs::create_dir_all(&dir).map_err(Error::io("creating", &dir))?;
    let lock_path = dir.with_extension("lock");
    let _lock = crate::lock::exclusive(&lock_path).await?;
    if binaries.complete() {
        return Ok(Built {
            binaries,
            build_time: None,
        });
    }

    let go = go_version().await?;
    progress(&format!(
        "Building the control plane from source with {go} (Kubernetes {} with the kubelet and \
         kube-proxy, etcd {}, kwok {}, Prometheus {}); this happens once and takes 15 to 25 \
         minutes on two cores",
        versions::KUBERNETES,
        versions::ETCD,
        versions::KWOK,
        versions::PROMETHEUS
    ));
    let started = Instant::now();
    let src = dir.join("src");
    let partial = dir.join("bin.partial");
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(Error::io("removing", &partial))?;
    }
    std::fs::create_dir_all(&partial).map_err(Error::io("creating", &partial))?;
    let log = dir.join("build.log");
    std::fs::write(&log, b"").map_err(Error::io("writing", &log))?;

    for module in &MODULES {
        let module_dir = src.join(module.name);
        std::fs::create_dir_all(&module_dir).map_err(Error::io("creating", &module_dir))?;
        for (name, text) in module.files {
            let path = module_dir.join(name);
            std::fs::write(&path, text).map_err(Error::io("writing", &path))?;
        }
    }

    progress("  checking that the Go modules can be downloaded");
    for module in &MODULES {
        probe(&src.join(module.name), module.probe).await?;
    }

    for module in &MODULES {
        let step = Instant::now();
        progress(&format!(
            "  compiling {} ({})",
            module.name,
            module.packages.join(" ")
        ));
        build(&src.join(module.name), module, &partial, &log, progress).await?;
        progress(&format!(
            "  compiled {} in {}",
            module.name,
            human(step.elapsed())
        ));
    }

    write_kwok_stages(&src.join("kwok"), &partial.join(KWOK_STAGES)).await?;
    progress("  compiling pause (the pod sandbox) with the C compiler");
    build_pause(&src.join("kubernetes"), &partial.join(PAUSE), &log).await?;

    let elapsed = started.elapsed();
    let record = partial.join(BUILD_TIME);
    std::fs::write(&record, format!("{:.1}\n", elapsed.as_secs_f64()))
        .map_err(Error::io("writing", &record))?;
    let bin = paths.bin_dir();
    if bin.exists() {
        std::fs::remove_dir_all(&bin).map_err(Error::io("removing", &bin))?;
    }
    std::fs::rename(&partial, &bin).map_err(Error::io("renaming", &partial))?;
    progress(&format!("Built the control plane in {}", human(elapsed)));
    Ok(Built {
        binaries,
        build_time: Some(elapsed),
    })
}

/// A `go` command with an environment that makes builds reproducible regardless of the
/// user's settings: no workspace, no cgo (static binaries, no C toolchain needed), the
/// committed `go.sum` only.
fn go(dir: &Path) -> Command {
    let mut cmd = Command::new("go");
    cmd.current_dir(dir)
        .env("GOWORK", "off")
        .env("CGO_ENABLED", "0")
        .env("GOFLAGS", "-mod=readonly")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// The installed Go version, e.g. `go1.26.8`, checked against [`versions::GO_REQUIRED`].
async fn go_version() -> Result<String> {
    let missing = |source| Error::GoMissing {
        required: versions::GO_REQUIRED,
        source,
    };
    let out = Command::new("go")
        .args(["env", "GOVERSION"])
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(missing)?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || version.is_empty() {
        return Err(missing(std::io::Error::other(format!(
            "`go env GOVERSION` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))));
    }
    if !at_least(&version, versions::GO_REQUIRED) {
        return Err(missing(std::io::Error::other(format!(
            "found {version}, which is too old"
        ))));
    }
    Ok(version)
}

/// Whether the Go version `go1.X.Y` (as `go env GOVERSION` prints it) is at least `required`
/// (`1.X.Y`, as a `go.mod` `go` line writes it).
pub fn at_least(version: &str, required: &str) -> bool {
    let parse = |s: &str| -> Vec<u64> {
        s.trim_start_matches("go")
            .split(|c: char| !c.is_ascii_digit())
            .take(3)
            .map(|p| p.parse().unwrap_or(0))
            .collect()
    };
    parse(version) >= parse(required)
}

/// Downloads the module that carries the sources (a quick, clear failure when the module proxy
/// is unreachable, instead of a wall of errors from the compiler).
async fn probe(dir: &Path, module: &str) -> Result<()> {
    let run = go(dir).args(["mod", "download", module]).output();
    let outcome = tokio::time::timeout(Duration::from_secs(300), run).await;
    let failure = match outcome {
        Ok(Ok(out)) if out.status.success() => return Ok(()),
        Ok(Ok(out)) => String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("`go mod download {module}` did not finish within 5 minutes"),
    };
    let goproxy = go(dir)
        .args(["env", "GOPROXY"])
        .output()
        .await
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    Err(Error::ModuleProxy {
        goproxy,
        stderr: failure,
    })
}

/// The `-ldflags` for one module: stripped, and for Kubernetes the version its binaries report
/// (`kubectl version`, `/version` of the API server) instead of a development placeholder.
fn ldflags(module: &GoModule) -> String {
    let mut flags = String::from("-s -w");
    if module.kubernetes_version {
        let minor = versions::KUBERNETES.split('.').nth(1).unwrap_or_default();
        for pkg in [
            "k8s.io/component-base/version",
            "k8s.io/client-go/pkg/version",
        ] {
            flags.push_str(&format!(
                " -X {pkg}.gitVersion={v} -X {pkg}.gitMajor=1 -X {pkg}.gitMinor={minor} \
                 -X {pkg}.gitTreeState=clean",
                v = versions::KUBERNETES
            ));
        }
    }
    flags
}

/// Runs `go build` for one module, reporting every minute that it is still at work (a cold
/// Kubernetes build is silent for many minutes otherwise).
async fn build(
    dir: &Path,
    module: &GoModule,
    out: &Path,
    log: &Path,
    progress: &(dyn Fn(&str) + Send + Sync),
) -> Result<()> {
    let log_file = std::fs::OpenOptions::new()
        .append(true)
        .open(log)
        .map_err(Error::io("opening", log))?;
    let log_err = log_file.try_clone().map_err(Error::io("opening", log))?;
    let mut out_dir = out.as_os_str().to_owned();
    out_dir.push("/");
    let mut child = go(dir)
        .arg("build")
        .arg("-trimpath")
        .arg(format!("-ldflags={}", ldflags(module)))
        .arg(format!("-tags={}", module.tags.join(",")))
        .arg("-o")
        .arg(out_dir)
        .args(module.packages)
        .stdout(log_file)
        .stderr(log_err)
        .spawn()
        .map_err(|source| Error::GoMissing {
            required: versions::GO_REQUIRED,
            source,
        })?;
    let started = Instant::now();
    let mut ticker = tokio::time::interval(Duration::from_secs(60));
    ticker.tick().await;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.map_err(Error::io("running go build in", dir))?,
            _ = ticker.tick() => progress(&format!(
                "    still compiling {} ({} so far)",
                module.name,
                human(started.elapsed())
            )),
        }
    };
    if status.success() {
        Ok(())
    } else {
        Err(Error::GoBuild {
            what: module.name,
            log: log.to_owned(),
            tail: crate::process::tail(log, 20),
        })
    }
}

/// The directory of a module in the module cache, as resolved from `module_dir`'s `go.mod`.
async fn module_source(module_dir: &Path, module: &str) -> Result<PathBuf> {
    let out = go(module_dir)
        .args(["list", "-m", "-f", "{{.Dir}}", module])
        .output()
        .await
        .map_err(|source| Error::GoMissing {
            required: versions::GO_REQUIRED,
            source,
        })?;
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !out.status.success() || dir.as_os_str().is_empty() {
        return Err(Error::ModuleProxy {
            goproxy: String::new(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(dir)
}

/// Compiles Kubernetes' own `pause` (the process that holds a pod's namespaces) from the C
/// source of the pinned release, statically linked so its image needs nothing else.
async fn build_pause(kubernetes_module: &Path, target: &Path, log: &Path) -> Result<()> {
    let dir = module_source(kubernetes_module, "k8s.io/kubernetes").await?;
    let source = dir.join("build/pause/linux/pause.c");
    let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let out = Command::new(&compiler)
        .args(["-Os", "-Wall", "-Werror", "-static"])
        .arg(format!("-DVERSION=v{}", versions::PAUSE))
        .arg("-o")
        .arg(target)
        .arg(&source)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|source| Error::CompilerMissing {
            compiler: compiler.clone(),
            source,
        })?;
    if out.status.success() {
        return Ok(());
    }
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(log)
        .map_err(Error::io("opening", log))?;
    file.write_all(&out.stderr)
        .map_err(Error::io("writing", log))?;
    Err(Error::GoBuild {
        what: "pause (a static C build: it needs a C compiler and the C library's static \
               archive, Debian's `gcc` and `libc6-dev`)",
        log: log.to_owned(),
        tail: crate::process::tail(log, 20),
    })
}

/// Copies kwok's upstream stages from the module cache into one configuration file.
async fn write_kwok_stages(kwok_module: &Path, target: &Path) -> Result<()> {
    let dir = module_source(kwok_module, "sigs.k8s.io/kwok").await?;
    let mut docs = Vec::new();
    for file in KWOK_STAGE_FILES {
        let path = dir.join(file);
        docs.push(std::fs::read_to_string(&path).map_err(Error::io("reading", &path))?);
    }
    std::fs::write(target, docs.join("\n---\n")).map_err(Error::io("writing", target))
}

/// `1m 23s` or `4.2s`.
pub fn human(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 60 {
        format!("{}m {:02}s", secs / 60, secs % 60)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_version_comparison() {
        assert!(at_least("go1.26.8", "1.26.7"));
        assert!(at_least("go1.26.7", "1.26.7"));
        assert!(at_least("go1.27", "1.26.7"));
        assert!(at_least("go2.0.1", "1.26.7"));
        assert!(!at_least("go1.26.6", "1.26.7"));
        assert!(!at_least("go1.26", "1.26.7"));
        assert!(!at_least("go1.25.3", "1.26.7"));
        assert!(!at_least("devel", "1.26.7"));
    }

    #[test]
    fn kubernetes_binaries_report_the_pinned_version() {
        let flags = ldflags(&MODULES[2]);
        assert!(flags.contains("k8s.io/component-base/version.gitVersion=v1.37"));
        assert!(flags.contains("gitMinor=37 "));
        assert_eq!(ldflags(&MODULES[0]), "-s -w");
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(human(Duration::from_millis(4200)), "4.2s");
        assert_eq!(human(Duration::from_secs(83)), "1m 23s");
    }
}
