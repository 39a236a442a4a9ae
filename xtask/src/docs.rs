//! `cargo xtask docs [--out DIR]`: the user documentation, the mdBook in `docs/book/`, built
//! into `book/` in the cargo target directory, then every link of the result checked.
//!
//! mdBook is installed on first use, at the version [`MDBOOK_VERSION`] pins, with `cargo
//! install --root` into the cache outside the clone
//! (`${XDG_CACHE_HOME:-$HOME/.cache}/operator-manager/tools/mdbook-<version>/`), so later runs
//! start at once.
//!
//! The benchmark plots (`docs/bench-results/plots/*.svg`, which `cargo xtask bench --report
//! ... --plot` writes) are copied into the built book at the same path, where BENCHMARKS.md,
//! included at the book's root, finds them as it does in the repository: mdBook copies only
//! what is under the book's own `src/`.
//!
//! The link check reads the generated HTML: every relative `href` and `src` must name a file of
//! the output (a directory stands for its `index.html`), and every `#fragment` an `id` in the
//! page it points at. Links with a scheme (`https:`, `mailto:`, ...) are listed as not checked:
//! there may be no network. A broken link fails the command, naming the page and the link.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

/// The mdBook release that builds the book.
pub const MDBOOK_VERSION: &str = "0.5.4";

/// Builds the book into `out` (default: `book/` in the cargo target directory) and checks its
/// links.
///
/// # Errors
/// When mdBook cannot be installed or fails, or a link of the book is broken.
pub fn run(out: Option<PathBuf>) -> anyhow::Result<()> {
    let out = out.unwrap_or_else(|| crate::target_dir().join("book"));
    // mdBook reads a relative destination from the book's directory, not from ours.
    let out = std::path::absolute(&out)
        .with_context(|| format!("resolving the output directory {}", out.display()))?;
    let mdbook = install_mdbook()?;
    let book = crate::workspace_root().join("docs").join("book");
    let status = Command::new(&mdbook)
        .arg("build")
        .arg(&book)
        .arg("--dest-dir")
        .arg(&out)
        .status()
        .with_context(|| format!("running {}", mdbook.display()))?;
    if !status.success() {
        bail!("mdbook build {} failed ({status})", book.display());
    }
    let plots = copy_plots(&crate::workspace_root(), &out)?;
    println!(
        "copied {plots} benchmark plots into {}",
        out.join(PLOTS).display()
    );

    let report = check_links(&out)?;
    println!(
        "checked {} links in {} pages of {}",
        report.checked,
        report.pages,
        out.display()
    );
    if !report.external.is_empty() {
        println!(
            "not checked (external, no network): {} links",
            report.external.len()
        );
        for (link, pages) in &report.external {
            let pages: Vec<&str> = pages.iter().map(String::as_str).collect();
            println!("  {link} (in {})", pages.join(", "));
        }
    }
    if !report.broken.is_empty() {
        let lines: Vec<String> = report.broken.iter().map(|b| format!("  {b}")).collect();
        bail!(
            "{} broken links in the book:\n{}",
            report.broken.len(),
            lines.join("\n")
        );
    }
    println!(
        "every link resolves; open {}",
        out.join("index.html").display()
    );
    Ok(())
}

/// Where the benchmark plots are, in the repository and in the built book alike.
const PLOTS: &str = "docs/bench-results/plots";

/// Copies every `.svg` of [`PLOTS`] under `repository` to the same path under `book`, and
/// returns how many; none when the directory does not exist.
fn copy_plots(repository: &Path, book: &Path) -> anyhow::Result<usize> {
    let from = repository.join(PLOTS);
    if !from.is_dir() {
        return Ok(0);
    }
    let to = book.join(PLOTS);
    std::fs::create_dir_all(&to).with_context(|| format!("creating {}", to.display()))?;
    let entries =
        std::fs::read_dir(&from).with_context(|| format!("listing {}", from.display()))?;
    let mut copied = 0;
    for entry in entries {
        let path = entry
            .with_context(|| format!("listing {}", from.display()))?
            .path();
        if path.is_file() && path.extension().is_some_and(|e| e == "svg") {
            let target = to.join(path.file_name().unwrap_or_default());
            std::fs::copy(&path, &target)
                .with_context(|| format!("copying {} to {}", path.display(), target.display()))?;
            copied += 1;
        }
    }
    Ok(copied)
}

/// The pinned mdBook, installed into the cache on first use.
fn install_mdbook() -> anyhow::Result<PathBuf> {
    let root = localcluster::Paths::from_env()?
        .root()
        .join("tools")
        .join(format!("mdbook-{MDBOOK_VERSION}"));
    let binary = root.join("bin").join("mdbook");
    if binary.is_file() {
        return Ok(binary);
    }
    println!(
        "installing mdbook {MDBOOK_VERSION} into {} (once, a few minutes)",
        root.display()
    );
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let status = Command::new(&cargo)
        .args(["install", "mdbook", "--locked", "--version", MDBOOK_VERSION])
        // Building is all we do: no `serve` or `watch`, and their web server, to compile.
        .args(["--no-default-features", "--features", "search"])
        .arg("--root")
        .arg(&root)
        // A temporary target directory, removed afterwards, rather than the workspace's.
        .env_remove("CARGO_TARGET_DIR")
        .status()
        .with_context(|| format!("running {cargo} install"))?;
    if !status.success() || !binary.is_file() {
        bail!("cargo install mdbook {MDBOOK_VERSION} failed ({status})");
    }
    Ok(binary)
}

/// What [`check_links`] found.
#[derive(Debug, Default)]
struct LinkReport {
    /// HTML pages read.
    pages: usize,
    /// Links checked (external ones not counted).
    checked: usize,
    /// Links with a scheme, with the pages they are in.
    external: BTreeMap<String, BTreeSet<String>>,
    /// Links that lead nowhere.
    broken: Vec<Broken>,
}

/// A link that leads nowhere.
#[derive(Debug, PartialEq, Eq)]
struct Broken {
    /// The page it is in, relative to the output directory.
    page: String,
    /// The link as written.
    link: String,
    /// Why it leads nowhere.
    why: String,
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} ({})", self.page, self.link, self.why)
    }
}

/// Checks every link of every HTML page under `root` (see the module's documentation).
fn check_links(root: &Path) -> anyhow::Result<LinkReport> {
    let mut files = BTreeSet::new();
    list_files(root, Path::new(""), &mut files)?;
    let mut scans: HashMap<PathBuf, Scan> = HashMap::new();
    for file in files.iter().filter(|f| is_html(f)) {
        let text = std::fs::read_to_string(root.join(file))
            .with_context(|| format!("reading {}", root.join(file).display()))?;
        scans.insert(file.clone(), scan(&text));
    }

    let mut report = LinkReport::default();
    let mut pages: Vec<&PathBuf> = scans.keys().collect();
    pages.sort();
    for page in pages {
        report.pages += 1;
        let page_name = slash_path(page);
        for link in &scans[page].links {
            let Some(target) = resolve(page, link) else {
                report
                    .external
                    .entry(link.clone())
                    .or_default()
                    .insert(page_name.clone());
                continue;
            };
            report.checked += 1;
            let broken = |why: String| Broken {
                page: page_name.clone(),
                link: link.clone(),
                why,
            };
            let file = match target.path {
                Err(why) => {
                    report.broken.push(broken(why));
                    continue;
                }
                Ok(path) if files.contains(&path) => path,
                Ok(path) if files.contains(&path.join("index.html")) => path.join("index.html"),
                Ok(path) => {
                    report
                        .broken
                        .push(broken(format!("no file {}", slash_path(&path))));
                    continue;
                }
            };
            if let Some(fragment) = target.fragment.filter(|f| !f.is_empty()) {
                match scans.get(&file) {
                    Some(scan) if scan.ids.contains(&fragment) => {}
                    Some(_) => report.broken.push(broken(format!(
                        "no id {fragment:?} in {}",
                        slash_path(&file)
                    ))),
                    None => report.broken.push(broken(format!(
                        "a fragment of {}, which is no HTML page",
                        slash_path(&file)
                    ))),
                }
            }
        }
    }
    Ok(report)
}

/// Adds every file under `root.join(dir)` to `files`, as paths relative to `root`.
fn list_files(root: &Path, dir: &Path, files: &mut BTreeSet<PathBuf>) -> anyhow::Result<()> {
    let full = root.join(dir);
    let entries =
        std::fs::read_dir(&full).with_context(|| format!("listing {}", full.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", full.display()))?;
        let path = dir.join(entry.file_name());
        if entry.path().is_dir() {
            list_files(root, &path, files)?;
        } else {
            files.insert(path);
        }
    }
    Ok(())
}

fn is_html(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "html" || e == "htm")
}

/// `path` with `/` between its components, as links and messages write it.
fn slash_path(path: &Path) -> String {
    let parts: Vec<String> = path
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    parts.join("/")
}

/// Where a link of `page` leads.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    /// The file, relative to the output directory, or why the link cannot name one.
    path: Result<PathBuf, String>,
    /// The decoded `#fragment`, if any.
    fragment: Option<String>,
}

/// Resolves `link`, found in `page` (relative to the output directory); `None` for a link
/// with a scheme or a protocol-relative one (`//host/...`), which leads off the book.
///
/// A path starting with `/` is taken from the output directory, as a server of the book at
/// its root would.
fn resolve(page: &Path, link: &str) -> Option<Target> {
    let link = link.trim();
    if link.starts_with("//") || has_scheme(link) {
        return None;
    }
    let (rest, fragment) = match link.split_once('#') {
        Some((rest, fragment)) => (rest, Some(percent_decode(fragment))),
        None => (link, None),
    };
    let rest = rest.split_once('?').map_or(rest, |(path, _query)| path);
    if rest.is_empty() {
        // `#id` or `?query` alone: the page itself.
        return Some(Target {
            path: Ok(page.to_path_buf()),
            fragment,
        });
    }
    let decoded = percent_decode(rest);
    let (base, relative) = match decoded.strip_prefix('/') {
        Some(from_root) => (PathBuf::new(), from_root.to_owned()),
        None => (
            page.parent().map(Path::to_path_buf).unwrap_or_default(),
            decoded.clone(),
        ),
    };
    let mut path = base;
    for part in relative.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if !path.pop() {
                    return Some(Target {
                        path: Err("leads out of the book".to_owned()),
                        fragment,
                    });
                }
            }
            name => path.push(name),
        }
    }
    Some(Target {
        path: Ok(path),
        fragment,
    })
}

/// Whether `link` starts with a URL scheme (`https:`, `mailto:`, `data:`, ...).
fn has_scheme(link: &str) -> bool {
    match link.split_once(':') {
        Some((scheme, _)) => {
            let mut chars = scheme.chars();
            chars.next().is_some_and(|c| c.is_ascii_alphabetic())
                && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        }
        None => false,
    }
}

/// `%XX` escapes decoded; an invalid escape, or bytes that are no UTF-8, are kept as written.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let hex = |b: u8| char::from(b).to_digit(16);
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let (Some(high), Some(low)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            // Two hex digits: at most 255.
            out.push(u8::try_from(high * 16 + low).unwrap_or(b'%'));
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| text.to_owned())
}

/// The links and ids of one HTML page.
#[derive(Debug, Default, PartialEq, Eq)]
struct Scan {
    /// Every `href` and `src` value, decoded, in order.
    links: Vec<String>,
    /// Every `id` value, decoded.
    ids: BTreeSet<String>,
}

/// Reads the `href`, `src` and `id` attributes of every tag of `html`.
///
/// Only tags are read: text, comments and the bodies of `script` and `style` are skipped, so
/// `href="..."` written in a code sample is not taken for a link. Text cannot hide a tag, since
/// HTML escapes a `<` in text as `&lt;`.
fn scan(html: &str) -> Scan {
    let mut found = Scan::default();
    let mut rest = html;
    while let Some(start) = rest.find('<') {
        rest = &rest[start..];
        if let Some(comment) = rest.strip_prefix("<!--") {
            rest = comment.find("-->").map_or("", |end| &comment[end + 3..]);
            continue;
        }
        let Some(tag) = Tag::parse(&rest[1..]) else {
            // A `<` that opens no tag (`<!DOCTYPE`, `</p>`, a stray one): skip it.
            rest = &rest[1..];
            continue;
        };
        for (name, value) in &tag.attributes {
            match name.as_str() {
                "href" | "src" => found.links.push(value.clone()),
                "id" => {
                    found.ids.insert(value.clone());
                }
                _ => {}
            }
        }
        rest = tag.after;
        if matches!(tag.name.as_str(), "script" | "style") {
            let close = format!("</{}", tag.name);
            rest = find_ignoring_case(rest, &close).map_or("", |end| &rest[end..]);
        }
    }
    found
}

/// An opening tag: its name (lower case), its attributes (names lower case, values decoded),
/// and the text after its `>`.
#[derive(Debug)]
struct Tag<'a> {
    name: String,
    attributes: Vec<(String, String)>,
    after: &'a str,
}

impl<'a> Tag<'a> {
    /// Parses the tag whose name starts `text` (just after its `<`); `None` unless a letter
    /// starts it.
    fn parse(text: &'a str) -> Option<Self> {
        if !text.starts_with(|c: char| c.is_ascii_alphabetic()) {
            return None;
        }
        let name_end = text
            .find(|c: char| c.is_ascii_whitespace() || c == '>' || c == '/')
            .unwrap_or(text.len());
        let name = text[..name_end].to_ascii_lowercase();
        let mut rest = &text[name_end..];
        let mut attributes = Vec::new();
        loop {
            rest = rest.trim_start_matches(|c: char| c.is_ascii_whitespace() || c == '/');
            if rest.is_empty() {
                return Some(Self {
                    name,
                    attributes,
                    after: rest,
                });
            }
            if let Some(after) = rest.strip_prefix('>') {
                return Some(Self {
                    name,
                    attributes,
                    after,
                });
            }
            let key_end = rest
                .find(|c: char| c.is_ascii_whitespace() || matches!(c, '=' | '>' | '/'))
                .unwrap_or(rest.len())
                .max(1);
            let key = rest[..key_end].to_ascii_lowercase();
            rest = rest[key_end..].trim_start_matches(|c: char| c.is_ascii_whitespace());
            let Some(value_start) = rest.strip_prefix('=') else {
                attributes.push((key, String::new()));
                continue;
            };
            let value_start = value_start.trim_start_matches(|c: char| c.is_ascii_whitespace());
            let (value, after) = match value_start.chars().next() {
                Some(quote @ ('"' | '\'')) => {
                    let inner = &value_start[1..];
                    match inner.find(quote) {
                        Some(end) => (&inner[..end], &inner[end + 1..]),
                        None => (inner, ""),
                    }
                }
                _ => {
                    let end = value_start
                        .find(|c: char| c.is_ascii_whitespace() || c == '>')
                        .unwrap_or(value_start.len());
                    (&value_start[..end], &value_start[end..])
                }
            };
            attributes.push((key, decode_entities(value)));
            rest = after;
        }
    }
}

/// The byte offset of `needle` (ASCII) in `haystack`, ignoring ASCII case.
fn find_ignoring_case(haystack: &str, needle: &str) -> Option<usize> {
    haystack
        .as_bytes()
        .windows(needle.len())
        .position(|window| window.eq_ignore_ascii_case(needle.as_bytes()))
}

/// Character references decoded: `&amp;`, `&lt;`, `&gt;`, `&quot;`, `&apos;`, and numeric
/// ones; any other `&` is kept as written.
fn decode_entities(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find('&') {
        out.push_str(&rest[..start]);
        rest = &rest[start..];
        let decoded = rest.find(';').and_then(|end| {
            let character = match &rest[1..end] {
                "amp" => Some('&'),
                "lt" => Some('<'),
                "gt" => Some('>'),
                "quot" => Some('"'),
                "apos" => Some('\''),
                numeric => numeric.strip_prefix('#').and_then(|number| {
                    let code = match number.strip_prefix(['x', 'X']) {
                        Some(hex) => u32::from_str_radix(hex, 16).ok(),
                        None => number.parse().ok(),
                    };
                    code.and_then(char::from_u32)
                }),
            };
            character.map(|c| (c, end + 1))
        });
        match decoded {
            Some((character, length)) => {
                out.push(character);
                rest = &rest[length..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `pages` (path, HTML) into a temporary directory and checks its links.
    fn check(pages: &[(&str, &str)]) -> LinkReport {
        let dir = tempfile::tempdir().expect("a temporary directory");
        for (path, html) in pages {
            let file = dir.path().join(path);
            std::fs::create_dir_all(file.parent().expect("a parent")).expect("created");
            std::fs::write(&file, html).expect("written");
        }
        check_links(dir.path()).expect("checked")
    }

    const TARGET: &str = r#"<html><body><h2 id="two-api-versions">Two</h2></body></html>"#;

    #[test]
    fn a_link_to_a_page_and_an_id_in_it_resolves() {
        let report = check(&[
            (
                "index.html",
                r##"<a href="sub/page.html#two-api-versions">x</a> <a href="#top">up</a>
                   <h1 id="top">Top</h1> <img src="img/icon.svg"> <a href="sub/">dir</a>"##,
            ),
            ("sub/page.html", TARGET),
            ("sub/index.html", "<p>index</p>"),
            ("img/icon.svg", "<svg/>"),
        ]);
        assert_eq!(report.broken, [], "{report:?}");
        assert_eq!((report.pages, report.checked), (3, 4));
    }

    #[test]
    fn the_benchmark_plots_are_copied_to_the_same_path_in_the_book() {
        let repository = tempfile::tempdir().expect("a temporary directory");
        let book = tempfile::tempdir().expect("a temporary directory");
        assert_eq!(
            copy_plots(repository.path(), book.path()).expect("nothing to copy"),
            0
        );
        let plots = repository.path().join(PLOTS);
        std::fs::create_dir_all(&plots).expect("created");
        std::fs::write(plots.join("time.svg"), "<svg/>").expect("written");
        std::fs::write(plots.join("notes.txt"), "not a plot").expect("written");
        assert_eq!(
            copy_plots(repository.path(), book.path()).expect("copied"),
            1
        );
        let copied = book.path().join("docs/bench-results/plots/time.svg");
        assert_eq!(std::fs::read_to_string(copied).expect("read"), "<svg/>");
        assert!(!book.path().join(PLOTS).join("notes.txt").exists());
        // A page at the book's root finds it as BENCHMARKS.md writes it.
        std::fs::write(
            book.path().join("BENCHMARKS.html"),
            r#"<img src="docs/bench-results/plots/time.svg" alt="time">"#,
        )
        .expect("written");
        let report = check_links(book.path()).expect("checked");
        assert_eq!(report.broken, [], "{report:?}");
        assert_eq!(report.checked, 1);
    }

    #[test]
    fn a_link_to_a_missing_file_is_broken() {
        let report = check(&[
            ("index.html", r#"<p><a href="missing.html">gone</a></p>"#),
            (
                "sub/page.html",
                r#"<link rel="stylesheet" href="../css/site.css">"#,
            ),
        ]);
        assert_eq!(
            report.broken,
            [
                Broken {
                    page: "index.html".to_owned(),
                    link: "missing.html".to_owned(),
                    why: "no file missing.html".to_owned(),
                },
                Broken {
                    page: "sub/page.html".to_owned(),
                    link: "../css/site.css".to_owned(),
                    why: "no file css/site.css".to_owned(),
                },
            ]
        );
    }

    #[test]
    fn a_link_to_a_missing_id_is_broken() {
        let report = check(&[
            (
                "index.html",
                r##"<a href="page.html#two-api-versions">ok</a><a href="page.html#three">no</a>
                   <a href="#nowhere">no</a>"##,
            ),
            ("page.html", TARGET),
        ]);
        let found: Vec<String> = report.broken.iter().map(ToString::to_string).collect();
        assert_eq!(
            found,
            [
                r#"index.html: page.html#three (no id "three" in page.html)"#,
                r##"index.html: #nowhere (no id "nowhere" in index.html)"##,
            ]
        );
    }

    #[test]
    fn external_links_are_listed_not_checked() {
        let report = check(&[
            (
                "index.html",
                r#"<a href="https://kube.rs">kube</a> <a href="mailto:a@example.com">mail</a>
                   <script src="//cdn.example/x.js"></script> <a href="https://kube.rs">again</a>"#,
            ),
            ("other.html", r#"<a href="https://kube.rs">kube</a>"#),
        ]);
        assert_eq!(report.broken, []);
        assert_eq!(report.checked, 0);
        let external: Vec<(&str, usize)> = report
            .external
            .iter()
            .map(|(link, pages)| (link.as_str(), pages.len()))
            .collect();
        assert_eq!(
            external,
            [
                ("//cdn.example/x.js", 1),
                ("https://kube.rs", 2),
                ("mailto:a@example.com", 1)
            ]
        );
    }

    #[test]
    fn a_link_out_of_the_book_is_broken() {
        let report = check(&[("index.html", r#"<a href="../outside.html">x</a>"#)]);
        assert_eq!(report.broken.len(), 1, "{report:?}");
        assert_eq!(report.broken[0].why, "leads out of the book");
    }

    #[test]
    fn only_attributes_of_tags_count() {
        let found = scan(concat!(
            r#"<!DOCTYPE html><!-- <a href="in-a-comment.html"> -->"#,
            r#"<code>href="in-text.html" id="in-text"</code>"#,
            r#"<script>var s = '<a href="in-a-script.html">';</script>"#,
            r#"<STYLE>a[href="x"] {}</STYLE>"#,
            r#"<A HREF='single.html' data-href="not-a-link" ID=bare>x</A>"#,
            r#"<a href = "spaced.html?q=1&amp;r=2" >y</a><img src=unquoted.png>"#,
            r#"<input disabled id="after-a-bare-attribute">"#,
        ));
        assert_eq!(
            found.links,
            ["single.html", "spaced.html?q=1&r=2", "unquoted.png"]
        );
        let ids: Vec<&str> = found.ids.iter().map(String::as_str).collect();
        assert_eq!(ids, ["after-a-bare-attribute", "bare"]);
    }

    #[test]
    fn links_resolve_relative_to_their_page() {
        let page = Path::new("docs/history.html");
        let target = |link| resolve(page, link).expect("inside the book");
        assert_eq!(
            target("../BENCHMARKS.html#handover"),
            Target {
                path: Ok(PathBuf::from("BENCHMARKS.html")),
                fragment: Some("handover".to_owned()),
            }
        );
        assert_eq!(
            target("bench-results/"),
            Target {
                path: Ok(PathBuf::from("docs/bench-results")),
                fragment: None,
            }
        );
        assert_eq!(target("/index.html").path, Ok(PathBuf::from("index.html")));
        assert_eq!(
            target("a%20b.html#caf%C3%A9"),
            Target {
                path: Ok(PathBuf::from("docs/a b.html")),
                fragment: Some("café".to_owned()),
            }
        );
        assert_eq!(target("").path, Ok(PathBuf::from("docs/history.html")));
        assert!(resolve(page, "HTTPS://example.com/").is_none());
        assert!(resolve(page, "javascript:void(0)").is_none());
    }

    #[test]
    fn entities_and_escapes_decode() {
        assert_eq!(
            decode_entities("a&amp;b&lt;&#62;&#x41;&quot;&bogus;&"),
            "a&b<>A\"&bogus;&"
        );
        assert_eq!(percent_decode("%41%zz%"), "A%zz%");
        assert_eq!(percent_decode("%FF"), "%FF");
    }
}
