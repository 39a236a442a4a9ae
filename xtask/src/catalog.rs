//! `cargo xtask catalog`: a file-based catalog of the project's bundle images in a registry,
//! built into an image and pushed beside them: what Operator SDK's `make catalog-build
//! catalog-push` does, in the format OLM reads today (the SQLite index that target builds is
//! deprecated). A CatalogSource naming the image offers the releases to Subscriptions, each
//! release replacing the one before it in the channel, so OLM upgrades an installed operator
//! when a catalog with a newer release replaces the old one.

use anyhow::{Context, bail, ensure};
use ociimage::Reference;
use serde_json::{Value, json};

use crate::opm::Opm;

#[derive(Debug, clap::Args)]
pub struct CatalogArgs {
    /// The releases the catalog offers, oldest first, each replacing the one before it in the
    /// project's default channel (default: the workspace's). Their bundle images must be in the
    /// registry: `cargo xtask bundle --push --version VERSION`.
    #[arg(long, value_delimiter = ',', value_name = "VERSION,...")]
    pub releases: Vec<String>,
    /// The registry the bundles are in and the catalog goes to, `HOST:PORT` (plain HTTP); the
    /// local cluster's by default.
    #[arg(long, value_name = "HOST:PORT")]
    pub registry: Option<String>,
}

pub fn run(args: CatalogArgs) -> anyhow::Result<()> {
    let root = crate::workspace_root();
    let project = crate::bundle::project(&root)?;
    let releases = if args.releases.is_empty() {
        vec![project.version.clone()]
    } else {
        args.releases
    };
    let registry = match args.registry {
        Some(registry) => registry,
        None => crate::image::local_registry()?,
    };
    let opm = Opm::build(&|line: &str| eprintln!("{line}"))?;

    let channel = project.default_channel().to_owned();
    let mut objects = vec![json!({
        "schema": "olm.package",
        "name": project.package,
        "defaultChannel": channel,
    })];
    let mut entries = Vec::new();
    let mut previous: Option<String> = None;
    for release in &releases {
        let at = project
            .at_release(release, None)
            .with_context(|| format!("--releases: {release}"))?;
        let reference = Reference::parse(&codegen::bundle::image(&at))?;
        let (repository, tag) = (reference.repository(), reference.tag());
        let bundle = format!("{registry}/{repository}:{tag}");
        if ociimage::manifest_digest(&registry, repository, tag)?.is_none() {
            bail!(
                "the registry holds no {bundle}, which the catalog offers: push it first with \
                 `cargo xtask bundle --push --version {release}`"
            );
        }
        let rendered = opm.render(&bundle)?;
        let bundle_object = rendered
            .into_iter()
            .find(|object| object["schema"] == "olm.bundle")
            .with_context(|| format!("`opm render` found no bundle in {bundle}"))?;
        let name = bundle_object["name"]
            .as_str()
            .with_context(|| format!("the bundle in {bundle} has no name"))?
            .to_owned();
        ensure!(
            name == at.csv_name(),
            "{bundle} holds {name}, not {}",
            at.csv_name()
        );
        entries.push(channel_entry(&name, previous.as_deref()));
        objects.push(bundle_object);
        previous = Some(name);
    }
    objects.push(json!({
        "schema": "olm.channel",
        "package": project.package,
        "name": channel,
        "entries": entries,
    }));

    let staging = tempfile::tempdir().context("creating a directory for the catalog")?;
    let package_dir = staging.path().join(&project.package);
    std::fs::create_dir_all(&package_dir)
        .with_context(|| format!("creating {}", package_dir.display()))?;
    let catalog_file = package_dir.join("catalog.json");
    std::fs::write(&catalog_file, catalog_json(&objects)?)
        .with_context(|| format!("writing {}", catalog_file.display()))?;
    opm.validate(staging.path())?;

    let newest = releases.last().context("no release to offer")?;
    let reference = Reference::parse(&format!("{}-catalog:v{newest}", project.package))?;
    let image = opm.catalog_image(reference, staging.path())?;
    let (_, pushed) = crate::image::write_and_push(&image, &registry)?;
    println!(
        "catalog image {} ({}) offers {} in channel {channel}: name it in a CatalogSource's \
         spec.image",
        pushed.name,
        pushed.manifest_digest,
        releases.join(", ")
    );
    Ok(())
}

/// A channel's entry for the bundle `name`, replacing `previous`.
fn channel_entry(name: &str, previous: Option<&str>) -> Value {
    match previous {
        Some(previous) => json!({ "name": name, "replaces": previous }),
        None => json!({ "name": name }),
    }
}

/// The objects as `opm render` writes them: one JSON document after another.
fn catalog_json(objects: &[Value]) -> anyhow::Result<String> {
    let mut text = String::new();
    for object in objects {
        text.push_str(&serde_json::to_string_pretty(object).context("serializing the catalog")?);
        text.push('\n');
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_release_replaces_the_one_before() {
        assert_eq!(
            channel_entry("op.v0.1.0", None),
            json!({"name": "op.v0.1.0"})
        );
        assert_eq!(
            channel_entry("op.v0.2.0", Some("op.v0.1.0")),
            json!({"name": "op.v0.2.0", "replaces": "op.v0.1.0"})
        );
    }

    #[test]
    fn the_catalog_is_a_stream_of_documents() {
        let text = catalog_json(&[json!({"a": 1}), json!({"b": 2})]).unwrap();
        let read: Vec<Value> = serde_json::Deserializer::from_str(&text)
            .into_iter()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(read, vec![json!({"a": 1}), json!({"b": 2})]);
    }
}
