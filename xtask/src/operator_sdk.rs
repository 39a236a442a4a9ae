//! `cargo xtask operator-sdk -- <args>`: the Operator SDK release `xtask/olm/go.mod` pins,
//! built from source once (a [`GoModule`], cached like the control plane), then run with the
//! arguments given. The OLM tests run the same binary, so the tutorial's commands are checked
//! with the real tool.
//!
//! `operator-sdk scorecard` runs its tests in pods of Operator SDK's `scorecard-test` image,
//! built here from the same module ([`scorecard_test_image`]); `cargo xtask olm install` pushes
//! it where the local cluster's node pulls quay.io's images from.
//!
//! It finds its cluster as kubectl does (`KUBECONFIG`, `--kubeconfig`); for the local cluster,
//! `KUBECONFIG=$(cargo xtask cluster kubeconfig)`.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use ociimage::{Image, ImageConfig, Reference, User};

use crate::gomodule::{self, GoModule};

/// The `operator-sdk` command of Operator SDK's module, at the release `xtask/olm/go.mod` pins.
/// It is built from the module OLM's programs are: Go resolves the dependencies they share
/// (client-go, controller-runtime, operator-registry) to one version each, the newest any of them
/// asks for, so most of its packages are compiled once for all of them.
pub const MODULE: GoModule = GoModule {
    what: "operator-sdk",
    binary: "operator-sdk",
    main_package: "github.com/operator-framework/operator-sdk/cmd/operator-sdk",
    cold_build: "about a minute once OLM's programs are built",
    ..crate::olm::MODULE
};

/// The program of the scorecard's test image, which runs one test (its argument) on the bundle
/// the pod's init container unpacked, and prints the result.
pub const SCORECARD_TEST: GoModule = GoModule {
    what: "operator-sdk's scorecard-test",
    binary: "scorecard-test",
    main_package: "github.com/operator-framework/operator-sdk/images/scorecard-test",
    cold_build: "a few seconds once OLM's programs are built",
    ..crate::olm::MODULE
};
/// Operator SDK's Go module.
const SDK_MODULE: &str = "github.com/operator-framework/operator-sdk";
/// Where the published image has the program, on its `PATH`.
const SCORECARD_TEST_BINARY: &str = "/usr/local/bin/scorecard-test";
/// The published image's user.
const SCORECARD_TEST_USER: u32 = 1001;

/// The scorecard's test image, as [`codegen::bundle::SCORECARD_TEST_IMAGE`] names it: the
/// bundle's scorecard configuration runs `scorecard-test <test>` in it.
///
/// # Errors
/// When that name's tag is not the pinned Operator SDK release, whose tests it names.
pub fn scorecard_test_image(binary: &Path) -> anyhow::Result<Image> {
    let reference = Reference::parse(codegen::bundle::SCORECARD_TEST_IMAGE)?;
    let version = MODULE.required_version(SDK_MODULE)?;
    if reference.tag() != version {
        bail!(
            "the bundle's scorecard configuration runs {reference}, and xtask/olm/go.mod pins              Operator SDK {version}: make codegen's SCORECARD_TEST_IMAGE the same release"
        );
    }
    let config = ImageConfig {
        env: vec![("PATH".into(), "/usr/local/bin:/bin".into())],
        ..ImageConfig::new(
            User::new("scorecard-test", SCORECARD_TEST_USER),
            vec![SCORECARD_TEST_BINARY.into()],
            gomodule::release_metadata(
                "scorecard-test",
                "operator-sdk scorecard's basic and OLM tests, built from its Go module",
                SDK_MODULE,
                version,
                "https://sdk.operatorframework.io/",
            ),
        )
    };
    let mut image = Image::new(reference, config);
    image
        .add_binary(binary, SCORECARD_TEST_BINARY)
        .with_context(|| format!("adding {} to the scorecard image", binary.display()))?;
    Ok(image)
}

/// Builds operator-sdk unless it is cached, then runs it with `args`; fails when it does.
/// While the local cluster runs, operator-sdk also trusts its CA, so it reads images from the
/// cluster's HTTPS registry.
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let operator_sdk = MODULE.build(|line| eprintln!("{line}"))?;
    let mut command = Command::new(&operator_sdk);
    let trusted = localcluster::LocalCluster::from_env()
        .ok()
        .and_then(|cluster| cluster.running().ok())
        .and_then(|state| state.node)
        .and_then(|node| node.trusted_certificates);
    if let Some(trusted) = trusted {
        command.env(
            "SSL_CERT_DIR",
            cert_dirs(std::env::var_os("SSL_CERT_DIR"), &trusted),
        );
    }
    let status = command
        .args(args)
        .stdin(Stdio::inherit())
        .status()
        .with_context(|| format!("running {}", operator_sdk.display()))?;
    if !status.success() {
        bail!("`operator-sdk {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

/// `SSL_CERT_DIR` with `trusted` added: Go reads every directory of the colon-separated list,
/// and the system's bundle file besides.
fn cert_dirs(current: Option<std::ffi::OsString>, trusted: &Path) -> std::ffi::OsString {
    let mut dirs = current.filter(|c| !c.is_empty()).unwrap_or_default();
    if !dirs.is_empty() {
        dirs.push(":");
    }
    dirs.push(trusted);
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundles_scorecard_image_is_of_the_pinned_release() {
        let version = MODULE.required_version(SDK_MODULE).unwrap();
        assert_eq!(
            codegen::bundle::SCORECARD_TEST_IMAGE
                .rsplit_once(':')
                .unwrap()
                .1,
            version
        );
    }

    #[test]
    fn the_cluster_ca_is_trusted_beside_what_was() {
        let trusted = Path::new("/pki/trusted");
        assert_eq!(cert_dirs(None, trusted), "/pki/trusted");
        assert_eq!(cert_dirs(Some("".into()), trusted), "/pki/trusted");
        assert_eq!(
            cert_dirs(Some("/etc/ssl/certs".into()), trusted),
            "/etc/ssl/certs:/pki/trusted"
        );
    }

    #[test]
    fn the_release_is_pinned_and_stamped_alike() {
        let version = MODULE
            .required_version("github.com/operator-framework/operator-sdk")
            .unwrap();
        for stamp in ["Version", "GitVersion", "ImageVersion"] {
            let stamp = format!("/internal/version.{stamp}={version} ");
            assert!(MODULE.ldflags.contains(&stamp), "{}", MODULE.ldflags);
        }
        assert!(
            MODULE
                .go_mod()
                .lines()
                .any(|l| l.trim() == MODULE.main_package),
            "a tool line pins the command"
        );
    }
}
