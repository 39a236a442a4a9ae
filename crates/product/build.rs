//! Reads the product's names from the workspace's `[workspace.metadata.operator]` and writes
//! them as constants and macros (`$OUT_DIR/product.rs`), so they are set in one place and known
//! at compile time, where kube's derive needs its API group as a literal.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use serde::Deserialize;

#[path = "checks.rs"]
mod checks;

const TABLE: &str = "[workspace.metadata.operator]";

#[derive(Deserialize)]
struct CargoToml {
    workspace: Workspace,
}

#[derive(Deserialize)]
struct Workspace {
    metadata: Metadata,
}

#[derive(Deserialize)]
struct Metadata {
    operator: Operator,
}

/// The keys this build reads; the bundle's keys beside them are codegen's.
#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Operator {
    package: String,
    namespace: String,
    part_of: String,
    domain: String,
    api_groups: Vec<String>,
}

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let path = manifest.join("../../Cargo.toml");
    println!("cargo::rerun-if-changed={}", path.display());
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", path.display())));
    let cargo: CargoToml = toml::from_str(&text)
        .unwrap_or_else(|e| fail(&format!("{TABLE} in {}: {e}", path.display())));
    let operator = cargo.workspace.metadata.operator;
    // The longest suffix the product puts after its name is `-webhook-serving-cert` (21
    // characters); object names must stay DNS labels of at most 63.
    let checked = [
        checks::label("package", &operator.package, 63 - 21),
        checks::label("namespace", &operator.namespace, 63),
        checks::label("part-of", &operator.part_of, 63),
        checks::subdomain("domain", &operator.domain),
    ];
    if let Some(Err(message)) = checked.into_iter().find(Result::is_err) {
        fail(&message);
    }
    if operator.api_groups.is_empty() {
        fail("api-groups: name at least one API group (e.g. [\"cache\"])");
    }
    let mut groups = BTreeMap::new();
    for group in &operator.api_groups {
        let full = format!("{group}.{}", operator.domain);
        if let Err(message) =
            checks::label("api-groups", group, 63).and(checks::subdomain("api-groups", &full))
        {
            fail(&message);
        }
        if groups.insert(group.clone(), full).is_some() {
            fail(&format!("api-groups: {group:?} is listed twice"));
        }
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo")).join("product.rs");
    std::fs::write(&out, render(&operator, &groups))
        .unwrap_or_else(|e| fail(&format!("cannot write {}: {e}", out.display())));
}

fn render(operator: &Operator, groups: &BTreeMap<String, String>) -> String {
    let name = &operator.package;
    let mut out = String::new();
    let mut constant = |doc: &str, ident: &str, value: &str| {
        let _ = writeln!(out, "/// {doc}\npub const {ident}: &str = {value:?};");
    };
    constant(
        "The manager's name: its Deployment, ServiceAccount and image, the OLM package, the \
         `app.kubernetes.io/managed-by` value of what it owns, and the prefix of every object \
         it ships.",
        "NAME",
        name,
    );
    constant(
        "The namespace the manifests install the manager in.",
        "NAMESPACE",
        &operator.namespace,
    );
    constant(
        "The `app.kubernetes.io/part-of` value of what the controllers own.",
        "PART_OF",
        &operator.part_of,
    );
    constant(
        "The domain every API group ends in (Kubebuilder's `--domain`).",
        "DOMAIN",
        &operator.domain,
    );
    constant(
        "The leader election Lease.",
        "LEADER_ELECTION_ID",
        &format!("{name}-leader"),
    );
    constant(
        "The Service the webhook configurations call the manager through.",
        "WEBHOOK_SERVICE",
        &format!("{name}-webhook"),
    );
    constant(
        "The MutatingWebhookConfiguration holding every defaulting webhook.",
        "MUTATING_CONFIGURATION",
        &format!("{name}-mutating"),
    );
    constant(
        "The ValidatingWebhookConfiguration holding every validating webhook.",
        "VALIDATING_CONFIGURATION",
        &format!("{name}-validating"),
    );
    constant(
        "The Secret holding the webhooks' CA and serving certificate, shared by every replica.",
        "WEBHOOK_CERT_SECRET",
        &format!("{name}-webhook-certs"),
    );
    constant(
        "The Service in front of the secure metrics endpoint (also Prometheus's job name).",
        "METRICS_SERVICE",
        &format!("{name}-metrics"),
    );
    let mut list = String::new();
    for full in groups.values() {
        let _ = write!(list, "{full:?}, ");
    }
    let _ = writeln!(
        out,
        "/// Every API group of the product, in full.\npub const API_GROUPS: &[&str] = &[{list}];"
    );

    // The names as literals too, for `concat!` in constants.
    for (macro_name, doc, value) in [
        ("name", "[`NAME`]", name.as_str()),
        ("namespace", "[`NAMESPACE`]", operator.namespace.as_str()),
        ("part_of", "[`PART_OF`]", operator.part_of.as_str()),
    ] {
        let _ = writeln!(
            out,
            "/// {doc} as a string literal, for `concat!`.\n#[macro_export]\nmacro_rules! {macro_name} {{\n    () => {{ {value:?} }};\n}}"
        );
    }

    // `group!(cache)` is the literal "cache.<domain>", usable in `concat!` and constants.
    let _ = writeln!(
        out,
        "/// The full API group of a group named in `api-groups`, as a string literal:\n\
         /// `group!(cache)` is `\"cache.{}\"`.\n#[macro_export]\nmacro_rules! group {{",
        operator.domain
    );
    for (group, full) in groups {
        let _ = writeln!(out, "    ({group}) => {{ {full:?} }};");
    }
    let _ = writeln!(out, "}}");

    // kube's derive reads its group from an attribute, where only a literal goes: this macro
    // adds `#[kube(group = "...")]` after the item's derive.
    let _ = writeln!(
        out,
        "/// A custom resource type in a group named in `api-groups`: adds `#[kube(group = ...)]`\n\
         /// with the full group after the item's `#[derive(...)]` (doc comments may come first).\n\
         #[macro_export]\nmacro_rules! custom_resource {{"
    );
    for (group, full) in groups {
        let _ = writeln!(
            out,
            "    ({group}, $(#[doc = $doc:literal])* #[derive($($derive:path),* $(,)?)] $($item:tt)*) => {{\n        \
             $(#[doc = $doc])* #[derive($($derive),*)] #[kube(group = {full:?})] $($item)*\n    }};"
        );
    }
    let _ = writeln!(out, "}}");
    out
}

fn fail(message: &str) -> ! {
    eprintln!("error: {TABLE} in Cargo.toml: {message}");
    std::process::exit(1)
}
