//! The product's names, set in one place: `[workspace.metadata.operator]` in the workspace's
//! `Cargo.toml` (`package`, `namespace`, `part-of`, `domain`, `api-groups`). Every crate of the
//! workspace takes them from here, so a fork renames the product in that one table and runs
//! `cargo xtask manifests`.
//!
//! ```
//! assert_eq!(product::group!(cache), format!("cache.{}", product::DOMAIN));
//! assert!(product::WEBHOOK_SERVICE.starts_with(product::NAME));
//! ```

include!(concat!(env!("OUT_DIR"), "/product.rs"));

#[cfg(test)]
#[path = "../checks.rs"]
mod checks;

#[cfg(test)]
mod tests {
    use super::checks;

    #[test]
    fn names_are_checked_and_refusals_name_the_key() {
        assert_eq!(checks::label("package", "operator-manager", 42), Ok(()));
        for bad in ["", "Operator", "my_operator", "-op", "op-", &"o".repeat(43)] {
            let error = checks::label("package", bad, 42).unwrap_err();
            assert!(error.starts_with(&format!("package = {bad:?}:")), "{error}");
        }
        assert_eq!(checks::subdomain("domain", "example.com"), Ok(()));
        for bad in ["example", "Example.com", "a..b", "a.-b"] {
            let error = checks::subdomain("domain", bad).unwrap_err();
            assert!(error.starts_with("domain = "), "{error}");
        }
    }

    #[test]
    fn derived_names_follow_the_product_name() {
        for name in [
            super::LEADER_ELECTION_ID,
            super::WEBHOOK_SERVICE,
            super::MUTATING_CONFIGURATION,
            super::VALIDATING_CONFIGURATION,
            super::WEBHOOK_CERT_SECRET,
            super::METRICS_SERVICE,
        ] {
            assert!(name.starts_with(&format!("{}-", super::NAME)), "{name}");
            assert!(name.len() <= 63, "{name}");
        }
        assert_eq!(name!(), super::NAME);
        assert!(super::API_GROUPS.contains(&group!(cache)));
    }
}
