//! The controller-runtime reference: the same Memcached controller written the idiomatic Go way
//! (controller-runtime v0.24.1, Kubebuilder layout), in `xtask/reference/memcached/`, so the bench
//! can measure our manager against what a Go operator author would run. It is never shipped.
//!
//! [`build`] compiles it once per version of its sources into the local cluster's cache
//! (`<cache>/reference/<hash of the sources>/memcached-reference`); later runs find the binary
//! there and start at once.
//!
//! The sources are embedded with `include_str!` rather than read from the work tree when the
//! bench runs: the binary that measures is then tied to exactly the sources it was compiled
//! with (cargo rebuilds xtask when one changes), the cache key is computed from what is built,
//! and the bench works from any directory. A test checks that every file of the module is in
//! [`SOURCES`].
//!
//! The binary takes the manager's flags that the bench passes (`--leader-elect`,
//! `--leader-election-id`, `--leader-election-namespace`, `--metrics-bind-address`,
//! `--health-probe-bind-address`, `--max-concurrent-reconciles`, `--log-format`,
//! `--lease-duration`, `--renew-deadline`, `--retry-period`), uses `POD_NAME` as its Lease
//! identity, and reads `KUBECONFIG` like any controller-runtime manager. It ignores `RUST_LOG`;
//! its log level is controller-runtime's `--zap-log-level` (`info` by default; `error` is the
//! closest to the manager's `RUST_LOG=warn`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use localcluster::toolchain::{at_least, human};

/// The name of the built binary.
pub const BINARY: &str = "memcached-reference";

/// Where the module lives in the repository (for messages and the completeness test).
const MODULE_DIR: &str = "xtask/reference/memcached";

/// Every file of the Go module that the build needs, by its path in the module.
const SOURCES: [(&str, &str); 9] = [
    ("go.mod", include_str!("../../reference/memcached/go.mod")),
    ("go.sum", include_str!("../../reference/memcached/go.sum")),
    ("main.go", include_str!("../../reference/memcached/main.go")),
    (
        "api/v1alpha1/groupversion_info.go",
        include_str!("../../reference/memcached/api/v1alpha1/groupversion_info.go"),
    ),
    (
        "api/v1alpha1/memcached_types.go",
        include_str!("../../reference/memcached/api/v1alpha1/memcached_types.go"),
    ),
    (
        "api/v1alpha1/zz_generated.deepcopy.go",
        include_str!("../../reference/memcached/api/v1alpha1/zz_generated.deepcopy.go"),
    ),
    (
        "internal/controller/memcached_controller.go",
        include_str!("../../reference/memcached/internal/controller/memcached_controller.go"),
    ),
    (
        "internal/controller/labels.go",
        include_str!("../../reference/memcached/internal/controller/labels.go"),
    ),
    (
        "internal/controller/status.go",
        include_str!("../../reference/memcached/internal/controller/status.go"),
    ),
];

/// How long downloading the modules may take before the build gives up on the module proxy.
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// Builds the reference controller unless the binary for these sources is already cached, and
/// returns its path. Synchronous: call it before starting the async runtime, like the manager's
/// release build. `progress` receives a line per step (nothing when the binary is cached).
///
/// # Errors
/// Without a cache directory, without Go (or with one older than the module's `go` line), when
/// the Go modules cannot be downloaded, or when compiling fails (the message names the log).
pub fn build(progress: impl Fn(&str)) -> anyhow::Result<PathBuf> {
    let paths = localcluster::Paths::from_env().context("finding the cache directory")?;
    build_in(&paths.root().join("reference"), &progress)
}

/// [`build`] into `cache`.
fn build_in(cache: &Path, progress: &dyn Fn(&str)) -> anyhow::Result<PathBuf> {
    let dir = cache.join(source_hash(&SOURCES));
    let binary = dir.join(BINARY);
    if binary.is_file() {
        return Ok(binary);
    }

    let required =
        go_directive(go_mod()).with_context(|| format!("{MODULE_DIR}/go.mod has no `go` line"))?;
    let go = go_version(required)?;
    progress(&format!(
        "building the controller-runtime reference ({MODULE_DIR}) with {go}; once per version \
         of its sources, about 2 minutes on two cores when Go's caches are cold"
    ));
    let started = Instant::now();

    // A work directory per process, so two benches building at once do not trip over each
    // other; the finished binary is renamed into place, which is atomic.
    let work = dir.join(format!("build-{}", std::process::id()));
    if work.exists() {
        std::fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    }
    let src = work.join("src");
    for (name, text) in SOURCES {
        let path = src.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    let log = work.join("build.log");

    let download = run_logged(
        go_command(&src).args(["mod", "download"]),
        &log,
        Some(DOWNLOAD_TIMEOUT),
        progress,
        "downloading the Go modules",
    )?;
    if !download.success {
        bail!(
            "downloading the reference's Go modules failed{} (GOPROXY={}); the log is {}:\n{}",
            download.timed_out_note(),
            goproxy(&src),
            log.display(),
            tail(&log, 20)
        );
    }

    let partial = work.join(BINARY);
    let compile = run_logged(
        go_command(&src)
            .args(["build", "-trimpath", "-o"])
            .arg(&partial)
            .arg("."),
        &log,
        None,
        progress,
        "compiling",
    )?;
    if !compile.success {
        bail!(
            "building the controller-runtime reference failed; the build log is {}:\n{}",
            log.display(),
            tail(&log, 20)
        );
    }
    std::fs::rename(&partial, &binary)
        .with_context(|| format!("moving {} to {}", partial.display(), binary.display()))?;
    // The sources and log of a successful build are not needed again.
    let _ = std::fs::remove_dir_all(&work);
    progress(&format!(
        "built the reference in {}: {}",
        human(started.elapsed()),
        binary.display()
    ));
    Ok(binary)
}

fn go_mod() -> &'static str {
    SOURCES
        .iter()
        .find(|(name, _)| *name == "go.mod")
        .map(|(_, text)| *text)
        .unwrap_or_default()
}

/// A stable hash of the sources (names and contents), as 16 hex digits: the cache key. FNV-1a,
/// not `std::hash`, whose output may change between Rust releases and would rebuild needlessly.
fn source_hash(sources: &[(&str, &str)]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for (name, text) in sources {
        for part in [name.as_bytes(), b"\0", text.as_bytes(), b"\0"] {
            for byte in part {
                hash = (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
    }
    format!("{hash:016x}")
}

/// The version on a `go.mod`'s `go` line (`go 1.26.0` gives `1.26.0`): the oldest Go that may
/// build the module. controller-runtime's own `go` line is at most this (`go mod tidy` keeps ours
/// at least as new as every dependency's).
fn go_directive(go_mod: &str) -> Option<&str> {
    go_mod.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some("go")).then(|| words.next()).flatten()
    })
}

/// The installed Go's version (`go1.26.8`), checked against `required`.
fn go_version(required: &str) -> anyhow::Result<String> {
    let out = Command::new("go")
        .args(["env", "GOVERSION"])
        .env("GOTOOLCHAIN", "local")
        .stdin(Stdio::null())
        .output()
        .with_context(|| {
            format!(
                "the controller-runtime reference is built with Go {required} or newer, and `go` \
                 could not be run: install Go and put it on PATH"
            )
        })?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || version.is_empty() {
        bail!(
            "`go env GOVERSION` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    if !at_least(&version, required) {
        bail!(
            "the controller-runtime reference needs Go {required} or newer (the `go` line of \
             {MODULE_DIR}/go.mod, set by controller-runtime's), and `go` is {version}"
        );
    }
    Ok(version)
}

/// A `go` command in `dir` that builds the same way whatever the user's settings: no workspace,
/// no cgo, the committed `go.sum` only, no version-control stamp, and no toolchain download.
fn go_command(dir: &Path) -> Command {
    let mut cmd = Command::new("go");
    cmd.current_dir(dir)
        .env("GOWORK", "off")
        .env("CGO_ENABLED", "0")
        .env("GOFLAGS", "-mod=readonly -buildvcs=false")
        .env("GOTOOLCHAIN", "local")
        .stdin(Stdio::null());
    cmd
}

fn goproxy(dir: &Path) -> String {
    go_command(dir)
        .args(["env", "GOPROXY"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

/// How a command run by [`run_logged`] ended.
struct Outcome {
    success: bool,
    timed_out: Option<Duration>,
}

impl Outcome {
    fn timed_out_note(&self) -> String {
        self.timed_out
            .map(|t| format!(" (no answer within {})", human(t)))
            .unwrap_or_default()
    }
}

/// Runs `cmd` with its output appended to `log`, saying every minute that it still runs, and
/// stopping it after `timeout`.
fn run_logged(
    cmd: &mut Command,
    log: &Path,
    timeout: Option<Duration>,
    progress: &dyn Fn(&str),
    what: &str,
) -> anyhow::Result<Outcome> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    let err = out
        .try_clone()
        .with_context(|| format!("opening {}", log.display()))?;
    let mut child = cmd
        .stdout(out)
        .stderr(err)
        .spawn()
        .context("running `go` (is Go installed and on PATH?)")?;
    let started = Instant::now();
    let mut reported = Duration::ZERO;
    loop {
        if let Some(status) = child.try_wait().context("waiting for `go`")? {
            return Ok(Outcome {
                success: status.success(),
                timed_out: None,
            });
        }
        let elapsed = started.elapsed();
        if timeout.is_some_and(|t| elapsed >= t) {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(Outcome {
                success: false,
                timed_out: timeout,
            });
        }
        if elapsed >= reported + Duration::from_secs(60) {
            reported = elapsed;
            progress(&format!("  still {what} ({} so far)", human(elapsed)));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The last `lines` lines of `log`.
fn tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_follows_names_and_contents() {
        let a = [("go.mod", "module a\n"), ("main.go", "package main\n")];
        assert_eq!(source_hash(&a), source_hash(&a), "stable");
        assert_eq!(source_hash(&a).len(), 16);
        let edited = [("go.mod", "module a\n"), ("main.go", "package main\n\n")];
        assert_ne!(source_hash(&a), source_hash(&edited));
        let renamed = [("go.mod", "module a\n"), ("cmd.go", "package main\n")];
        assert_ne!(source_hash(&a), source_hash(&renamed));
        // The separator keeps a name from running into its contents.
        assert_ne!(
            source_hash(&[("ab", "c")]),
            source_hash(&[("a", "bc")]),
            "name/content boundary"
        );
    }

    #[test]
    fn the_go_line_is_read_from_go_mod() {
        assert_eq!(
            go_directive("module m\n\ngo 1.26.0\n\nrequire x v1\n"),
            Some("1.26.0")
        );
        assert_eq!(go_directive("module m\n"), None);
        assert_eq!(go_directive("module m\ngodebug x=1\n"), None);
        let required = go_directive(go_mod()).expect("the reference's go.mod has a go line");
        assert!(at_least("go1.26.8", required), "{required}");
    }

    #[test]
    fn the_reference_uses_controller_runtime_v0_24_1() {
        assert!(go_mod().starts_with("module operator-manager.dev/reference/memcached\n"));
        assert!(
            go_mod()
                .lines()
                .any(|l| l.trim() == "sigs.k8s.io/controller-runtime v0.24.1"),
            "{}",
            go_mod()
        );
    }

    #[test]
    fn every_file_of_the_module_is_embedded() {
        let root = crate::workspace_root().join(MODULE_DIR);
        let mut on_disk = Vec::new();
        let mut dirs = vec![root.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("the module directory is readable") {
                let path = entry.expect("a directory entry").path();
                let name = path.to_string_lossy().into_owned();
                if path.is_dir() {
                    dirs.push(path);
                } else if (name.ends_with(".go") && !name.ends_with("_test.go"))
                    || name.ends_with("go.mod")
                    || name.ends_with("go.sum")
                {
                    let relative = path.strip_prefix(&root).expect("under the module");
                    on_disk.push(relative.to_string_lossy().into_owned());
                }
            }
        }
        on_disk.sort();
        let mut embedded: Vec<String> = SOURCES.iter().map(|(n, _)| (*n).to_owned()).collect();
        embedded.sort();
        assert_eq!(
            embedded, on_disk,
            "SOURCES in reference.rs must list every file the Go build reads"
        );
    }

    #[test]
    fn a_cached_binary_is_used_without_go() {
        let cache = tempfile::tempdir().expect("a temporary directory");
        let dir = cache.path().join(source_hash(&SOURCES));
        std::fs::create_dir_all(&dir).expect("creating the cache entry");
        std::fs::write(dir.join(BINARY), b"").expect("writing a stand-in binary");
        let lines = std::cell::RefCell::new(Vec::new());
        let built = build_in(cache.path(), &|l: &str| {
            lines.borrow_mut().push(l.to_owned())
        })
        .expect("the cached binary is found");
        assert_eq!(built, dir.join(BINARY));
        assert!(lines.borrow().is_empty(), "{:?}", lines.borrow());
    }
}
