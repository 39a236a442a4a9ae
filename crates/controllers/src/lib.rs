//! The platform's controllers and the one list of them.
//!
//! Each controller is a module of its own ([`memcached`], [`myapp`], [`tenant`], [`keyvaluestore`]) written against the
//! controller runtime ([`kube_operator_runtime`]) and the API types ([`apis`]); its
//! registration lists the admission webhooks of its type, whose rules live in [`admission`].
//! [`all`] is the single registration list: the manager runs what it lists (minus what
//! configuration switches off), and `cargo xtask manifests` renders the ClusterRole from the same
//! list, so the permissions in a user's cluster can never drift from what the code does.

pub mod admission;
pub mod keyvaluestore;
pub mod memcached;
pub mod myapp;
pub mod samples;
pub mod tenant;
#[cfg(test)]
mod testing;

use kube_operator_runtime::ManagedController;

/// Every controller in the workspace, in a stable order.
pub fn all() -> Vec<Box<dyn ManagedController>> {
    vec![
        Box::new(memcached::CONTROLLER),
        Box::new(myapp::CONTROLLER),
        Box::new(tenant::CONTROLLER),
        Box::new(keyvaluestore::CONTROLLER),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_operator_runtime::webhooks;

    #[test]
    fn all_lists_every_controller_once() {
        let names: Vec<&str> = all().iter().map(|c| c.name()).collect();
        assert_eq!(names, ["memcached", "myapp", "tenant", "keyvaluestore"]);
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
