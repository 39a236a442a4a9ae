//! Least privilege, proved by the API server: every verb the generated RBAC grants the manager
//! was used by it over the whole test suite, as the audit log records its requests.
//!
//! The local cluster's audit log records every write, and every read by a ServiceAccount; the
//! manager runs as the generated one in every test. A grant no request of the suite used is
//! one to drop, or a path of the code no test takes: either way the test names it.
//!
//! It reads the log of the whole suite, so it is ignored in an ordinary `cargo test`;
//! `cargo xtask test` runs it after the suite, on a cluster it started itself.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::rbac::v1::PolicyRule;

/// The roles the generated RBAC binds to the manager's ServiceAccount, by file under `rbac/`.
const ROLES: [&str; 5] = [
    "cluster_role.yaml",
    "leader_election_role.yaml",
    "webhook_role.yaml",
    "webhook_cert_role.yaml",
    "metrics_auth_role.yaml",
];

/// Grants no request shows, and why they are needed all the same.
const NOT_REQUESTS: [(&str, &str, &str); 2] = [
    // An owner reference with `blockOwnerDeletion` needs `update` on the owner's finalizers
    // where the API server enforces it (OwnerReferencesPermissionEnforcement): a check made
    // while writing the child, never a request of its own.
    ("*", "*/finalizers", "update"),
    // Writing a RoleBinding to a ClusterRole needs `bind` on it (or all of its permissions):
    // checked while the RoleBinding is written, never a request of its own.
    ("rbac.authorization.k8s.io", "clusterroles", "bind"),
];

/// One verb on one resource (`<plural>[/<subresource>]`) of a group, for the named objects
/// only when `names` is not empty.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Grant {
    group: String,
    resource: String,
    verb: String,
    names: Vec<String>,
}

impl std::fmt::Display for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{} {group}/{}", self.verb, self.resource)?;
        if !self.names.is_empty() {
            write!(f, " {:?}", self.names)?;
        }
        Ok(())
    }
}

fn grants_of(rules: &[PolicyRule]) -> Vec<Grant> {
    let mut grants = Vec::new();
    for rule in rules {
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    grants.push(Grant {
                        group: group.clone(),
                        resource: resource.clone(),
                        verb: verb.clone(),
                        names: rule.resource_names.clone().unwrap_or_default(),
                    });
                }
            }
        }
    }
    grants
}

/// Every grant of the roles in `rbac`, with the file it comes from.
fn generated_grants(rbac: &Path) -> Result<Vec<(String, Grant)>> {
    let mut grants = Vec::new();
    for file in ROLES {
        let path = rbac.join(file);
        for object in testkit::read_yaml_file(&path)? {
            let rules: Vec<PolicyRule> =
                serde_json::from_value(object.data.get("rules").cloned().unwrap_or_default())
                    .with_context(|| format!("the rules of {}", path.display()))?;
            grants.extend(grants_of(&rules).into_iter().map(|g| (file.to_owned(), g)));
        }
    }
    Ok(grants)
}

fn exempt(grant: &Grant) -> bool {
    NOT_REQUESTS.iter().any(|(group, resource, verb)| {
        let resource_matches = match resource.strip_prefix('*') {
            Some(suffix) => grant.resource.ends_with(suffix),
            None => grant.resource == *resource,
        };
        (*group == "*" || grant.group == *group) && resource_matches && grant.verb == *verb
    })
}

#[tokio::test]
#[ignore = "reads the audit log of the whole suite; `cargo xtask test` runs it after the suite"]
async fn every_verb_the_manager_is_granted_was_used_in_the_suite() -> Result<()> {
    let cluster = testkit::cluster().await?;
    let rbac = testkit::deploy_dir().join("rbac");
    let account = testkit::read_yaml_file(&rbac.join("service_account.yaml"))?
        .into_iter()
        .next()
        .context("no ServiceAccount in rbac/service_account.yaml")?;
    let user = format!(
        "system:serviceaccount:{}:{}",
        account.metadata.namespace.as_deref().unwrap_or("default"),
        account.metadata.name.as_deref().unwrap_or_default()
    );

    let files = cluster.state.audit_log_files()?;
    let quoted = format!("\"{user}\"");
    let events = testkit::read_audit_files_where(&files, |line| line.contains(&quoted))?;
    let mut used: BTreeMap<(String, String, String), BTreeSet<String>> = BTreeMap::new();
    for event in events.iter().filter(|e| e.user == user) {
        let resource = match event.subresource.as_str() {
            "" => event.resource.clone(),
            sub => format!("{}/{sub}", event.resource),
        };
        // A streamed initial list (`sendInitialEvents`) is a watch doing a list's work: where
        // the API server pages lists instead, the same watch lists, with the `list` grant.
        if event.verb == "watch" && event.request_uri.contains("sendInitialEvents=true") {
            used.entry((event.group.clone(), resource.clone(), "list".to_owned()))
                .or_default()
                .insert(String::new());
        }
        used.entry((event.group.clone(), resource, event.verb.clone()))
            .or_default()
            .insert(event.name.clone());
    }
    ensure!(
        !used.is_empty(),
        "the audit log ({} files) holds no request of {user}: was the suite run on this cluster?",
        files.len()
    );

    let mut unused = Vec::new();
    let mut checked = 0;
    for (file, grant) in generated_grants(&rbac)? {
        if exempt(&grant) {
            continue;
        }
        checked += 1;
        let key = (
            grant.group.clone(),
            grant.resource.clone(),
            grant.verb.clone(),
        );
        let names = used.get(&key);
        let is_used = match names {
            None => false,
            Some(_) if grant.names.is_empty() => true,
            Some(names) => grant.names.iter().any(|n| names.contains(n)),
        };
        if !is_used {
            unused.push(format!("{grant} ({file})"));
        }
    }
    println!(
        "{checked} grants of the generated RBAC checked against {} requests of {user} in the \
         suite's audit log ({} kinds of request)",
        events.len(),
        used.len()
    );
    ensure!(
        unused.is_empty(),
        "granted to the manager and never used in the suite (drop the grant, or test the path \
         that needs it):\n  {}",
        unused.join("\n  ")
    );
    Ok(())
}
