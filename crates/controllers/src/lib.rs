//! The platform's controllers and the one list of them.
//!
//! Each controller is a module of its own ([`memcached`], [`myapp`], [`tenant`], [`keyvaluestore`]) written against the
//! controller runtime ([`kube_operator_runtime`]) and the API types ([`apis`]); its
//! registration lists the admission webhooks of its type, whose rules live in [`admission`].
//! [`all`] is the single registration list: the manager runs what it lists (minus what
//! configuration switches off), and `cargo xtask manifests` renders the ClusterRole from the same
//! list, so the permissions in a user's cluster can never drift from what the code does.
//!
//! Each controller is a cargo feature of its name, all on by default: a manager built with
//! `--no-default-features --features memcached` carries Memcached's code alone, and its memory
//! with it (the code of a controller is resident whether it runs or not). [`NOT_BUILT`] names
//! the ones a build left out, so a configuration that enables one is told so.

#[cfg(any(feature = "memcached", feature = "myapp"))]
pub mod admission;
#[cfg(feature = "keyvaluestore")]
pub mod keyvaluestore;
#[cfg(feature = "memcached")]
pub mod memcached;
#[cfg(feature = "myapp")]
pub mod myapp;
pub mod samples;
#[cfg(feature = "tenant")]
pub mod tenant;
#[cfg(test)]
mod testing;

use kube_operator_runtime::ManagedController;

/// Every controller this build carries, in a stable order.
pub fn all() -> Vec<Box<dyn ManagedController>> {
    vec![
        #[cfg(feature = "memcached")]
        Box::new(memcached::CONTROLLER),
        #[cfg(feature = "myapp")]
        Box::new(myapp::CONTROLLER),
        #[cfg(feature = "tenant")]
        Box::new(tenant::CONTROLLER),
        #[cfg(feature = "keyvaluestore")]
        Box::new(keyvaluestore::CONTROLLER),
    ]
}

/// The workspace's controllers this build was made without (their features were off).
pub const NOT_BUILT: &[&str] = &[
    #[cfg(not(feature = "memcached"))]
    "memcached",
    #[cfg(not(feature = "myapp"))]
    "myapp",
    #[cfg(not(feature = "tenant"))]
    "tenant",
    #[cfg(not(feature = "keyvaluestore"))]
    "keyvaluestore",
];

#[cfg(all(test, feature = "all"))]
mod tests {
    use super::*;
    use kube_operator_runtime::webhooks;

    #[test]
    fn all_lists_every_controller_once() {
        let names: Vec<&str> = all().iter().map(|c| c.name()).collect();
        assert_eq!(names, ["memcached", "myapp", "tenant", "keyvaluestore"]);
        assert!(NOT_BUILT.is_empty(), "{NOT_BUILT:?}");
    }

    /// Lines of code (not blank, not comments) before a module's tests.
    fn code_lines(source: &str) -> usize {
        source
            .lines()
            .take_while(|line| !line.starts_with("#[cfg(test)]"))
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with("//"))
            .count()
    }

    #[test]
    fn field_managers_are_the_ones_the_runtime_writes_with() {
        // The manager names the runtime's writers after the product at start.
        let runtime = product::NAME;
        for (name, field_manager) in [
            (memcached::NAME, memcached::FIELD_MANAGER),
            (myapp::NAME, myapp::FIELD_MANAGER),
        ] {
            assert_eq!(field_manager, format!("{runtime}/{name}"));
        }
    }

    #[test]
    fn controllers_written_on_the_runtime_stay_small() {
        let modules = [
            ("tenant", include_str!("tenant.rs")),
            ("keyvaluestore", include_str!("keyvaluestore.rs")),
            ("myapp", include_str!("myapp.rs")),
        ];
        for (name, source) in modules {
            let lines = code_lines(source);
            assert!(lines < 150, "{name}: {lines} lines of code");
        }
    }

    #[test]
    fn rbac_rules_have_no_wildcards() {
        for controller in all() {
            for rule in controller.rbac_rules() {
                let words = rule
                    .api_groups
                    .iter()
                    .chain(rule.resources)
                    .chain(rule.verbs);
                assert!(
                    words.clone().all(|w| !w.contains('*')),
                    "{}: {rule:?}",
                    controller.name()
                );
                assert!(!rule.resources.is_empty() && !rule.verbs.is_empty());
            }
        }
    }

    #[test]
    fn every_webhook_is_listed_once() {
        let names: Vec<String> = webhooks(&all())
            .expect("no duplicates")
            .into_iter()
            .map(|w| w.name)
            .collect();
        assert_eq!(
            names,
            [
                concat!("mmemcached-v1beta1.", product::group!(cache)),
                concat!("vmemcached-v1beta1.", product::group!(cache)),
                concat!("mmyapp-v1.", product::group!(myscheme)),
                concat!("vmyapp-v1.", product::group!(myscheme)),
            ]
        );
        let twice: Vec<Box<dyn ManagedController>> = vec![
            Box::new(memcached::CONTROLLER),
            Box::new(memcached::CONTROLLER),
        ];
        let error = webhooks(&twice).expect_err("declared twice").to_string();
        assert!(
            error.contains(concat!("mmemcached-v1beta1.", product::group!(cache))),
            "{error}"
        );
    }
}
