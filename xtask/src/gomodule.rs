//! Go programs that xtask builds from source on demand: the controller-runtime reference the
//! bench measures against, the OLM bundle validator built from operator-framework's own module,
//! Helm, and OLM's olm-operator. None is shipped.
//!
//! A [`GoModule`] embeds the module's files with `include_str!` rather than reading them from
//! the work tree when it is built: the xtask binary is then tied to exactly the sources it was
//! compiled with (cargo rebuilds xtask when one changes), the cache key is computed from what is
//! built, and the build works from any directory. Each module's owner has a test that every
//! file of the module is in its [`GoModule::sources`] (`assert_every_file_is_embedded`).
//!
//! [`GoModule::build`] compiles the module once per version of its sources into the local
//! cluster's cache (`<cache>/<cache_dir>/<hash of the sources>/<binary>`); later runs find the
//! binary there and start at once. The build is the same whatever the user's Go settings (see
//! [`go_command`]), with the module proxy given a timeout and the compiler none.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use localcluster::toolchain::{at_least, human};

/// A Go module embedded in xtask that builds one binary.
#[derive(Debug, Clone, Copy)]
pub struct GoModule {
    /// What the binary is, for messages: "the controller-runtime reference".
    pub what: &'static str,
    /// The directory under the cache root that holds the builds (one per hash of the sources).
    pub cache_dir: &'static str,
    /// Where the module lives in the repository, relative to the workspace root (for messages
    /// and the completeness test).
    pub repo_dir: &'static str,
    /// The name of the built binary.
    pub binary: &'static str,
    /// The main package to build: `.` for a module of our own, or the import path of a
    /// dependency's command (a `tool` line in `go.mod` pins it), such as
    /// `helm.sh/helm/v3/cmd/helm`.
    pub main_package: &'static str,
    /// Linker flags, such as the `-X` that stamps a release's version into a program whose
    /// release build does (empty for none). Part of the cache key.
    pub ldflags: &'static str,
    /// Build tags, comma-separated, as the program's own release build sets them (empty for
    /// none). Part of the cache key.
    pub tags: &'static str,
    /// How long a build with Go's caches cold takes on two cores, for the progress line
    /// ("about 2 minutes").
    pub cold_build: &'static str,
    /// Every file of the Go module that the build needs, by its path in the module, with its
    /// contents.
    pub sources: &'static [(&'static str, &'static str)],
}

/// The metadata of an image holding programs built from `module` (an import path) at
/// `version`, whose project's site is `url`. Every module built here is Apache-2.0; the image
/// is reproducible (dated at the epoch), so it changes only with its files.
pub fn release_metadata(
    title: &str,
    description: &str,
    module: &str,
    version: &str,
    url: &str,
) -> ociimage::Metadata {
    ociimage::Metadata {
        title: title.into(),
        description: description.into(),
        version: version.into(),
        revision: None,
        source: Some(format!("https://{module}")),
        url: Some(url.into()),
        licenses: Some("Apache-2.0".into()),
        labels: Default::default(),
        created: 0,
    }
}

/// How long downloading the modules may take before the build gives up on the module proxy.
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(300);

impl GoModule {
    /// Builds the binary unless the one for these sources is already cached, and returns its
    /// path. Synchronous: call it before starting the async runtime, or from a blocking task.
    /// `progress` receives a line per step (nothing when the binary is cached).
    ///
    /// # Errors
    /// Without a cache directory, without Go (or with one older than the module's `go` line),
    /// when the Go modules cannot be downloaded, or when compiling fails (the message names the
    /// log and shows its end).
    pub fn build(&self, progress: impl Fn(&str)) -> anyhow::Result<PathBuf> {
        let paths = localcluster::Paths::from_env().context("finding the cache directory")?;
        self.build_in(&paths.root().join(self.cache_dir), &progress)
    }

    /// The build's directory under the cache: a hash of the sources, and of the linker flags
    /// and build tags when there are any (so modules without them keep the key they always
    /// had). The programs of one module share it.
    pub(crate) fn cache_key(&self) -> String {
        let mut inputs = self.sources.to_vec();
        if !self.ldflags.is_empty() {
            inputs.push(("-ldflags", self.ldflags));
        }
        if !self.tags.is_empty() {
            inputs.push(("-tags", self.tags));
        }
        source_hash(&inputs)
    }

    /// The module's `go.mod` (empty if it is not among the sources).
    pub fn go_mod(&self) -> &'static str {
        self.sources
            .iter()
            .find(|(name, _)| *name == "go.mod")
            .map(|(_, text)| *text)
            .unwrap_or_default()
    }

    /// The version of `dependency` that `go.mod` requires, e.g. `v0.46.0`.
    ///
    /// # Errors
    /// When `go.mod` does not require it.
    pub fn required_version(&self, dependency: &str) -> anyhow::Result<&'static str> {
        self.go_mod()
            .lines()
            .find_map(|line| {
                // In a `require ( … )` block, or on a `require` line of its own.
                let line = line.trim_start();
                let mut words = line
                    .strip_prefix("require ")
                    .unwrap_or(line)
                    .split_whitespace();
                (words.next() == Some(dependency))
                    .then(|| words.next())
                    .flatten()
            })
            .with_context(|| format!("{}/go.mod does not require {dependency}", self.repo_dir))
    }

    /// The version on the `go.mod`'s `go` line: the oldest Go that may build the module.
    pub fn go_line(&self) -> Option<&'static str> {
        go_directive(self.go_mod())
    }

    /// [`GoModule::build`] into `cache`.
    fn build_in(&self, cache: &Path, progress: &dyn Fn(&str)) -> anyhow::Result<PathBuf> {
        let Self {
            what,
            repo_dir,
            binary: name,
            ..
        } = *self;
        let dir = cache.join(self.cache_key());
        let binary = dir.join(name);
        if binary.is_file() {
            return Ok(binary);
        }

        let required = self
            .go_line()
            .with_context(|| format!("{repo_dir}/go.mod has no `go` line"))?;
        let go = self.go_version(required)?;
        progress(&format!(
            "building {what} ({repo_dir}) with {go}; once per version of its sources, {} on two \
             cores when Go's caches are cold",
            self.cold_build
        ));
        let started = Instant::now();

        // A work directory per process, so two xtasks building at once do not trip over each
        // other; the finished binary is renamed into place, which is atomic.
        let work = dir.join(format!("build-{}", std::process::id()));
        if work.exists() {
            std::fs::remove_dir_all(&work)
                .with_context(|| format!("removing {}", work.display()))?;
        }
        let src = work.join("src");
        for (file, text) in self.sources {
            let path = src.join(file);
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
                "downloading the Go modules of {what} ({repo_dir}) failed{} (GOPROXY={}); the log \
                 is {}:\n{}",
                download.timed_out_note(),
                goproxy(&src),
                log.display(),
                tail(&log, 20)
            );
        }

        let partial = work.join(name);
        let compile = run_logged(
            go_command(&src)
                .args([
                    "build",
                    "-trimpath",
                    "-ldflags",
                    self.ldflags,
                    "-tags",
                    self.tags,
                ])
                .arg("-o")
                .arg(&partial)
                .arg(self.main_package),
            &log,
            None,
            progress,
            "compiling",
        )?;
        if !compile.success {
            bail!(
                "building {what} ({repo_dir}) failed; the build log is {}:\n{}",
                log.display(),
                tail(&log, 20)
            );
        }
        std::fs::rename(&partial, &binary)
            .with_context(|| format!("moving {} to {}", partial.display(), binary.display()))?;
        // The sources and log of a successful build are not needed again.
        let _ = std::fs::remove_dir_all(&work);
        progress(&format!(
            "built {what} in {}: {}",
            human(started.elapsed()),
            binary.display()
        ));
        Ok(binary)
    }

    /// The directory of `dependency` (a module path such as
    /// `github.com/operator-framework/operator-lifecycle-manager`) in Go's module cache, at the
    /// version this module pins; downloaded through the module proxy if it is not there yet.
    /// For files a dependency ships beside its code, such as OLM's CRDs.
    ///
    /// # Errors
    /// When Go cannot be run, the module is not among this module's requirements, or the
    /// download fails.
    pub fn dependency_dir(&self, dependency: &str) -> anyhow::Result<PathBuf> {
        let Self { what, repo_dir, .. } = *self;
        let work = tempfile::tempdir().context("creating a temporary directory")?;
        for (file, text) in self.sources {
            if file.starts_with("go.") {
                std::fs::write(work.path().join(file), text)
                    .with_context(|| format!("writing {file} of {repo_dir}"))?;
            }
        }
        let out = go_command(work.path())
            .args(["mod", "download", "-json", dependency])
            .output()
            .context("running `go mod download` (is Go installed and on PATH?)")?;
        #[derive(serde::Deserialize)]
        struct Download {
            #[serde(rename = "Dir", default)]
            dir: String,
            #[serde(rename = "Error", default)]
            error: String,
        }
        let download: Download = serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "`go mod download {dependency}` for {what} ({repo_dir}) failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })?;
        if !out.status.success() || download.dir.is_empty() {
            bail!(
                "`go mod download {dependency}` for {what} ({repo_dir}) failed: {}{}",
                download.error,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(PathBuf::from(download.dir))
    }

    /// The installed Go's version (`go1.26.8`), checked against `required`.
    fn go_version(&self, required: &str) -> anyhow::Result<String> {
        let Self { what, repo_dir, .. } = *self;
        let out = Command::new("go")
            .args(["env", "GOVERSION"])
            .env("GOTOOLCHAIN", "local")
            .stdin(Stdio::null())
            .output()
            .with_context(|| {
                format!(
                    "{what} is built with Go {required} or newer, and `go` could not be run: \
                     install Go and put it on PATH"
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
                "{what} needs Go {required} or newer (the `go` line of {repo_dir}/go.mod, which \
                 `go mod tidy` keeps at least that of every dependency), and `go` is {version}"
            );
        }
        Ok(version)
    }

    /// Panics unless every file of the module in the repository (its `.go` files other than
    /// tests, `go.mod` and `go.sum`) is in [`GoModule::sources`], and nothing else is.
    #[cfg(test)]
    pub fn assert_every_file_is_embedded(&self) {
        let root = crate::workspace_root().join(self.repo_dir);
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
        let mut embedded: Vec<String> = self.sources.iter().map(|(n, _)| (*n).to_owned()).collect();
        embedded.sort();
        assert_eq!(
            embedded, on_disk,
            "the sources of {} must list every file the Go build reads in {}",
            self.what, self.repo_dir
        );
    }
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

/// The version on a `go.mod`'s `go` line (`go 1.26.0` gives `1.26.0`). `go mod tidy` keeps it at
/// least as new as every dependency's.
fn go_directive(go_mod: &str) -> Option<&str> {
    go_mod.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some("go")).then(|| words.next()).flatten()
    })
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

    const EXAMPLE: GoModule = GoModule {
        what: "the example",
        cache_dir: "example",
        repo_dir: "xtask/example",
        binary: "example",
        main_package: ".",
        ldflags: "",
        tags: "",
        cold_build: "a moment",
        sources: &[
            ("go.mod", "module example\n\ngo 1.26.0\n"),
            ("main.go", "package main\n\nfunc main() {}\n"),
        ],
    };

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
        assert_eq!(EXAMPLE.go_line(), Some("1.26.0"));
        let requiring = GoModule {
            sources: &[(
                "go.mod",
                "module m\n\ngo 1.26.0\n\nrequire (\n\ta.example/x v1.2.0 // indirect\n)\n\nrequire b.example/y v0.3.0 // indirect\n",
            )],
            ..EXAMPLE
        };
        assert_eq!(requiring.required_version("a.example/x").unwrap(), "v1.2.0");
        assert_eq!(requiring.required_version("b.example/y").unwrap(), "v0.3.0");
        assert!(requiring.required_version("c.example/z").is_err());
        let without = GoModule {
            sources: &[("main.go", "package main\n")],
            ..EXAMPLE
        };
        assert_eq!(without.go_mod(), "");
        assert_eq!(without.go_line(), None);
    }

    #[test]
    fn a_cached_binary_is_used_without_go() {
        let cache = tempfile::tempdir().expect("a temporary directory");
        let dir = cache.path().join(EXAMPLE.cache_key());
        std::fs::create_dir_all(&dir).expect("creating the cache entry");
        std::fs::write(dir.join(EXAMPLE.binary), b"").expect("writing a stand-in binary");
        let lines = std::cell::RefCell::new(Vec::new());
        let built = EXAMPLE
            .build_in(cache.path(), &|l: &str| {
                lines.borrow_mut().push(l.to_owned())
            })
            .expect("the cached binary is found");
        assert_eq!(built, dir.join(EXAMPLE.binary));
        assert!(lines.borrow().is_empty(), "{:?}", lines.borrow());
    }

    #[test]
    fn a_module_without_a_go_line_is_refused_before_running_go() {
        let cache = tempfile::tempdir().expect("a temporary directory");
        let module = GoModule {
            sources: &[
                ("go.mod", "module example\n"),
                ("main.go", "package main\n"),
            ],
            ..EXAMPLE
        };
        let error = module
            .build_in(cache.path(), &|_: &str| {})
            .expect_err("no go line");
        assert_eq!(error.to_string(), "xtask/example/go.mod has no `go` line");
    }

    #[test]
    fn a_failed_command_is_logged_and_its_tail_kept() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let log = dir.path().join("build.log");
        let outcome = run_logged(
            Command::new("sh").args(["-c", "seq 1 30; echo boom >&2; exit 3"]),
            &log,
            None,
            &|_: &str| {},
            "testing",
        )
        .expect("sh runs");
        assert!(!outcome.success);
        assert_eq!(outcome.timed_out_note(), "");
        let end = tail(&log, 3);
        assert_eq!(end, "29\n30\nboom");
    }

    #[test]
    fn a_command_past_its_timeout_is_stopped() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let log = dir.path().join("build.log");
        let started = Instant::now();
        let outcome = run_logged(
            Command::new("sleep").arg("30"),
            &log,
            Some(Duration::from_millis(300)),
            &|_: &str| {},
            "testing",
        )
        .expect("sleep runs");
        assert!(!outcome.success);
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(outcome.timed_out_note().starts_with(" (no answer within "));
    }
}
