//! The project's own description, for the ways it is shipped (the OLM bundle): one place,
//! the workspace's `Cargo.toml`. The version is the workspace's (`[workspace.package]`), so a
//! release bumps one number; everything else sits under `[workspace.metadata.operator]`, which
//! cargo leaves to tools like this one.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::Error;

/// Where the fields of [`Project`] are set, for messages.
pub const METADATA_TABLE: &str = "[workspace.metadata.operator] in Cargo.toml";
/// Where the version is set, for messages.
pub const VERSION_TABLE: &str = "[workspace.package] in Cargo.toml";

/// What the bundle says about the project, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Project {
    /// The OLM package name, and the prefix of the ClusterServiceVersion's name.
    pub package: String,
    /// The release, a semantic version (`0.1.0`).
    pub version: String,
    /// A title for catalogs.
    pub display_name: String,
    /// One sentence, for catalog tiles.
    pub summary: String,
    /// The long description, Markdown.
    pub description: String,
    pub provider: Provider,
    pub maintainers: Vec<Maintainer>,
    pub links: Vec<Link>,
    pub keywords: Vec<String>,
    /// The icon file, relative to the workspace root (SVG or PNG).
    pub icon: PathBuf,
    /// `alpha`, `beta`, `stable`...
    pub maturity: String,
    /// OperatorHub's capability level (`Basic Install` to `Auto Pilot`).
    pub capabilities: String,
    /// OperatorHub's categories.
    pub categories: Vec<String>,
    /// The channels this release is in; the first is the default.
    pub channels: Vec<String>,
    /// The oldest Kubernetes the manager supports.
    pub min_kube_version: String,
    /// The release this one upgrades from, in a channel whose entries follow the
    /// ClusterServiceVersions' `replaces` (`None` for the first).
    pub replaces: Option<String>,
}

/// Who publishes the operator.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provider {
    pub name: String,
    #[serde(default)]
    pub url: Option<String>,
}

/// Whom users write to.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Maintainer {
    pub name: String,
    pub email: String,
}

/// A named link for catalogs (documentation, source).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    pub name: String,
    pub url: String,
}

/// `Cargo.toml` as far as it concerns us.
#[derive(Deserialize)]
struct CargoToml {
    workspace: Option<Workspace>,
}

#[derive(Deserialize)]
struct Workspace {
    package: Option<WorkspacePackage>,
    metadata: Option<WorkspaceMetadata>,
}

#[derive(Deserialize)]
struct WorkspacePackage {
    version: Option<String>,
}

#[derive(Deserialize)]
struct WorkspaceMetadata {
    operator: Option<OperatorTable>,
}

/// `[workspace.metadata.operator]` as written; every field checked by [`Project::from_cargo_toml`].
#[derive(Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct OperatorTable {
    package: Option<String>,
    display_name: Option<String>,
    summary: Option<String>,
    description: Option<String>,
    provider: Option<Provider>,
    #[serde(default)]
    maintainers: Vec<Maintainer>,
    #[serde(default)]
    links: Vec<Link>,
    #[serde(default)]
    keywords: Vec<String>,
    icon: Option<PathBuf>,
    maturity: Option<String>,
    capabilities: Option<String>,
    #[serde(default)]
    categories: Vec<String>,
    #[serde(default)]
    channels: Vec<String>,
    min_kube_version: Option<String>,
    replaces: Option<String>,
    // The product's other names: the `product` crate's build reads and checks them.
    #[serde(rename = "namespace")]
    _namespace: Option<serde::de::IgnoredAny>,
    #[serde(rename = "part-of")]
    _part_of: Option<serde::de::IgnoredAny>,
    #[serde(rename = "domain")]
    _domain: Option<serde::de::IgnoredAny>,
    #[serde(rename = "api-groups")]
    _api_groups: Option<serde::de::IgnoredAny>,
}

/// OperatorHub's capability levels, lowest first.
const CAPABILITY_LEVELS: [&str; 5] = [
    "Basic Install",
    "Seamless Upgrades",
    "Full Lifecycle",
    "Deep Insights",
    "Auto Pilot",
];

impl Project {
    /// Reads the project from the text of the workspace's `Cargo.toml` (`path` names it in
    /// errors).
    ///
    /// # Errors
    /// [`Error::Metadata`] naming the first field that is missing or malformed and where it is
    /// set; [`Error::Toml`] when the file is no valid TOML or has a key of the wrong type or an
    /// unknown one.
    pub fn from_cargo_toml(path: &Path, text: &str) -> Result<Self, Error> {
        let cargo: CargoToml = toml::from_str(text).map_err(|source| Error::Toml {
            path: path.to_owned(),
            source: Box::new(source),
        })?;
        let workspace = cargo
            .workspace
            .ok_or_else(|| missing("[workspace]", "Cargo.toml"))?;
        let version = workspace
            .package
            .and_then(|p| p.version)
            .ok_or_else(|| missing("version", VERSION_TABLE))?;
        check_semver(&version)?;
        let table = workspace
            .metadata
            .and_then(|m| m.operator)
            .ok_or_else(|| missing("[workspace.metadata.operator]", "Cargo.toml"))?;
        let required = |value: Option<String>, field: &'static str| {
            value
                .filter(|v| !v.trim().is_empty())
                .ok_or_else(|| missing(field, METADATA_TABLE))
        };
        let project = Project {
            package: required(table.package, "package")?,
            version,
            display_name: required(table.display_name, "display-name")?,
            summary: required(table.summary, "summary")?,
            description: required(table.description, "description")?,
            provider: table
                .provider
                .filter(|p| !p.name.trim().is_empty())
                .ok_or_else(|| missing("provider.name", METADATA_TABLE))?,
            maintainers: table.maintainers,
            links: table.links,
            keywords: table.keywords,
            icon: table.icon.ok_or_else(|| missing("icon", METADATA_TABLE))?,
            maturity: required(table.maturity, "maturity")?,
            capabilities: required(table.capabilities, "capabilities")?,
            categories: table.categories,
            channels: table.channels,
            min_kube_version: required(table.min_kube_version, "min-kube-version")?,
            replaces: table.replaces,
        };
        project.check()?;
        Ok(project)
    }

    /// The checks a field's type cannot make.
    fn check(&self) -> Result<(), Error> {
        if !is_dns_label(&self.package) {
            return Err(invalid(
                "package",
                "must be a lowercase DNS label (letters, digits and `-`, at most 63)",
            ));
        }
        if self.maintainers.is_empty() {
            return Err(missing("maintainers", METADATA_TABLE));
        }
        for maintainer in &self.maintainers {
            if maintainer.name.trim().is_empty() {
                return Err(invalid("maintainers", "every maintainer needs a name"));
            }
            if !is_email(&maintainer.email) {
                return Err(invalid(
                    "maintainers",
                    &format!("`{}` is no email address", maintainer.email),
                ));
            }
        }
        let urls = self
            .links
            .iter()
            .map(|l| ("links", &l.url))
            .chain(self.provider.url.iter().map(|u| ("provider.url", u)));
        for (field, url) in urls {
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                return Err(invalid(field, &format!("`{url}` is no http(s) URL")));
            }
        }
        if self.keywords.is_empty() {
            return Err(missing("keywords", METADATA_TABLE));
        }
        if self.categories.is_empty() {
            return Err(missing("categories", METADATA_TABLE));
        }
        if self.channels.is_empty() {
            return Err(missing("channels", METADATA_TABLE));
        }
        if let Some(bad) = self.channels.iter().find(|c| !is_dns_label(c)) {
            return Err(invalid(
                "channels",
                &format!("`{bad}` must be a lowercase DNS label"),
            ));
        }
        if !CAPABILITY_LEVELS.contains(&self.capabilities.as_str()) {
            return Err(invalid(
                "capabilities",
                &format!("must be one of {}", CAPABILITY_LEVELS.join(", ")),
            ));
        }
        check_semver(&self.min_kube_version).map_err(|_| {
            invalid(
                "min-kube-version",
                "must be a version like `1.33.0` (major.minor.patch)",
            )
        })?;
        if let Some(replaces) = &self.replaces {
            check_semver(replaces)
                .map_err(|_| invalid("replaces", "must be a version like `0.1.0`"))?;
            if *replaces == self.version {
                return Err(invalid(
                    "replaces",
                    "must be an earlier release than `version`",
                ));
            }
        }
        if self.icon_media_type().is_none() {
            return Err(invalid("icon", "must name an .svg or .png file"));
        }
        Ok(())
    }

    /// The icon's media type, from its file name.
    pub fn icon_media_type(&self) -> Option<&'static str> {
        match self.icon.extension()?.to_str()? {
            "svg" => Some("image/svg+xml"),
            "png" => Some("image/png"),
            _ => None,
        }
    }

    /// The ClusterServiceVersion's name: `<package>.v<version>`.
    pub fn csv_name(&self) -> String {
        format!("{}.v{}", self.package, self.version)
    }

    /// The ClusterServiceVersion this release replaces, by name.
    pub fn replaces_csv(&self) -> Option<String> {
        let replaces = self.replaces.as_ref()?;
        Some(format!("{}.v{replaces}", self.package))
    }

    /// The same project at another release, replacing `replaces`: what a bundle of that
    /// release describes. Without `replaces`, the release replaces what the project's does if
    /// it is the project's, and nothing otherwise.
    ///
    /// # Errors
    /// [`Error::Metadata`] when either is no version, or they are the same.
    pub fn at_release(&self, version: &str, replaces: Option<&str>) -> Result<Self, Error> {
        let bad = |field: &str, problem: String| Error::Metadata {
            field: field.to_owned(),
            problem,
        };
        for (field, value) in [("version", Some(version)), ("replaces", replaces)] {
            if let Some(value) = value {
                check_semver(value)
                    .map_err(|_| bad(field, format!("`{value}` is no version like `0.2.0`")))?;
            }
        }
        if replaces == Some(version) {
            return Err(bad(
                "replaces",
                format!("release {version} cannot replace itself"),
            ));
        }
        let replaces = match replaces {
            Some(replaces) => Some(replaces.to_owned()),
            None if version == self.version => self.replaces.clone(),
            None => None,
        };
        Ok(Self {
            version: version.to_owned(),
            replaces,
            ..self.clone()
        })
    }

    /// The channel OLM picks when a subscription names none.
    pub fn default_channel(&self) -> &str {
        self.channels.first().map_or("", String::as_str)
    }
}

fn missing(field: &str, table: &str) -> Error {
    Error::Metadata {
        field: field.to_owned(),
        problem: format!("is missing; set it in {table}"),
    }
}

fn invalid(field: &str, problem: &str) -> Error {
    Error::Metadata {
        field: field.to_owned(),
        problem: format!("{problem} (in {METADATA_TABLE})"),
    }
}

/// `major.minor.patch`, each a number, with an optional `-pre` part.
fn check_semver(version: &str) -> Result<(), Error> {
    let core = version.split(['-', '+']).next().unwrap_or_default();
    let parts: Vec<&str> = core.split('.').collect();
    let numeric = parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    if numeric {
        Ok(())
    } else {
        Err(Error::Metadata {
            field: "version".to_owned(),
            problem: format!(
                "`{version}` is no semantic version like `1.2.3` (in {VERSION_TABLE})"
            ),
        })
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn is_email(s: &str) -> bool {
    let Some((local, domain)) = s.split_once('@') else {
        return false;
    };
    !local.is_empty()
        && domain.contains('.')
        && !domain.starts_with('.')
        && !domain.ends_with('.')
        && !s.contains(char::is_whitespace)
}

/// The workspace's own project metadata and root, for tests that render what is committed.
#[cfg(test)]
pub(crate) fn workspace_project() -> (Project, std::path::PathBuf) {
    let root = crate::package_dir().join("../..");
    let cargo_toml = root.join("Cargo.toml");
    let text = std::fs::read_to_string(&cargo_toml).expect("Cargo.toml");
    let project = Project::from_cargo_toml(&cargo_toml, &text).expect("project metadata");
    (project, root)
}

#[cfg(test)]
mod tests {
    use super::*;

    const COMPLETE: &str = r#"
[workspace.package]
version = "1.2.3"

[workspace.metadata.operator]
package = "my-operator"
display-name = "My Operator"
summary = "Runs things."
description = "Runs things, at length."
provider = { name = "Us", url = "https://example.org" }
maintainers = [{ name = "Someone", email = "someone@example.org" }]
links = [{ name = "Docs", url = "https://example.org/docs" }]
keywords = ["things"]
icon = "docs/icon.svg"
maturity = "alpha"
capabilities = "Basic Install"
categories = ["Database"]
channels = ["alpha", "stable"]
min-kube-version = "1.33.0"
"#;

    fn parse(text: &str) -> Result<Project, Error> {
        Project::from_cargo_toml(Path::new("Cargo.toml"), text)
    }

    fn without(line_start: &str) -> String {
        COMPLETE
            .lines()
            .filter(|l| !l.starts_with(line_start))
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn a_complete_table_reads() {
        let project = parse(COMPLETE).expect("complete");
        assert_eq!(project.csv_name(), "my-operator.v1.2.3");
        assert_eq!(project.default_channel(), "alpha");
        assert_eq!(project.icon_media_type(), Some("image/svg+xml"));
    }

    #[test]
    fn the_workspace_metadata_reads() {
        let path = crate::package_dir().join("../../Cargo.toml");
        let text = std::fs::read_to_string(&path).expect("workspace Cargo.toml");
        let project = Project::from_cargo_toml(&path, &text).expect("the project's metadata");
        assert_eq!(project.version, env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn each_missing_field_is_named_with_where_to_set_it() {
        for (line, field) in [
            ("maintainers", "maintainers"),
            ("package", "package"),
            ("provider", "provider.name"),
            ("icon", "icon"),
            ("min-kube-version", "min-kube-version"),
            ("channels", "channels"),
        ] {
            let err = parse(&without(line)).expect_err(line).to_string();
            assert!(
                err.contains(&format!("`{field}`")) && err.contains(METADATA_TABLE),
                "{line}: {err}"
            );
        }
        let err = parse(&without("version"))
            .expect_err("no version")
            .to_string();
        assert!(
            err.contains("`version`") && err.contains(VERSION_TABLE),
            "{err}"
        );
    }

    #[test]
    fn malformed_values_are_refused_with_the_reason() {
        let cases = [
            (
                "maintainers = [{ name = \"A\", email = \"nobody\" }]",
                "no email",
            ),
            ("capabilities = \"Magic\"", "Basic Install"),
            ("icon = \"docs/icon.gif\"", ".svg or .png"),
            ("package = \"My_Operator\"", "DNS label"),
            ("min-kube-version = \"1.33\"", "major.minor.patch"),
        ];
        for (replacement, reason) in cases {
            let key = replacement.split(' ').next().expect("key");
            let text = format!("{}\n{replacement}\n", without(key));
            let err = parse(&text).expect_err(replacement).to_string();
            assert!(err.contains(reason), "{replacement}: {err}");
        }
        let err = parse(&COMPLETE.replace("1.2.3", "one")).expect_err("bad version");
        assert!(err.to_string().contains("semantic version"), "{err}");
    }

    #[test]
    fn an_unknown_key_is_refused_by_name() {
        let err = parse(&format!("{COMPLETE}\nmaintainer = \"typo\"\n")).expect_err("typo");
        let message = format!(
            "{err}: {}",
            std::error::Error::source(&err).expect("source")
        );
        assert!(message.contains("maintainer"), "{message}");
    }
}
