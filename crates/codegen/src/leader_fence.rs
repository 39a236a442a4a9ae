//! The leader fence the API server enforces: a ValidatingAdmissionPolicy whose parameter is the
//! leader-election Lease, bound to it by name, so that a write of the platform's objects by a
//! manager pod that does not hold the Lease is refused when it is admitted, not only when it is
//! sent.
//!
//! The manager fences its own writes too (it sends none once its renew deadline passes), but a
//! write sent just before that, or held up in a frozen process or a slow mutating webhook, can
//! reach the API server after a standby leads. This policy refuses it there: a pod's bound
//! ServiceAccount token names the pod (`authentication.kubernetes.io/pod-name` in the user's
//! extra), and the Lease names its holder.
//!
//! What it covers, and what not:
//! - the objects the controllers create, change or delete (their declared rules), Events aside:
//!   a late Event misleads no one about who wrote what;
//! - requests made with a token bound to a pod of the manager's ServiceAccount; a process with an
//!   unbound token (a developer's run outside the cluster) is not a pod and is not fenced here;
//! - it runs after mutating webhooks and before validating ones, so a write held in a validating
//!   webhook past a takeover can still commit;
//! - the policy reads the Lease from the API server's own cache, so a change of holder reaches it
//!   within that cache's delay (milliseconds);
//! - no Lease (leader election off, or before the first leader) refuses nothing.
//!
//! It is opt-in (`kubectl apply -k deploy/leader-fence/`), not part of the default install or
//! the chart: up to at least Kubernetes 1.37, an API server stops following the objects of a
//! built-in param kind such as Lease for good once no binding names that kind, even briefly
//! (kubernetes/kubernetes#130887). After an uninstall and a reinstall, the policy would judge
//! every write against the Lease as it was at the uninstall, and refuse the new leader's until
//! the API server restarts. Install it once and leave it, on a cluster where nothing else
//! binds a Lease param.

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, NamedRuleWithOperations, ParamKind, ParamRef,
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingAdmissionPolicyBindingSpec, ValidatingAdmissionPolicySpec, Validation, Variable,
};
use kube_operator_runtime::ManagedController;

use crate::{Error, LEADER_ELECTION_ID, MANAGER_NAME, NAMESPACE, manager::meta, rbac};

/// The name of the policy and of its binding.
pub const POLICY_NAME: &str = concat!(product::name!(), "-leader-fence");

/// The key of a bound ServiceAccount token's pod name in the user's extra.
const POD_NAME_KEY: &str = "authentication.kubernetes.io/pod-name";

/// Verbs that change what they name: the requests the fence judges.
const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

/// The policy: every write the controllers' rules allow, by a pod of the manager's
/// ServiceAccount, must come from the pod the Lease names as holder (the holder's identity is
/// the pod name, or the pod name, `_` and a suffix of the process).
///
/// # Errors
/// The RBAC declaration errors of [`rbac::union_of_rules`].
pub fn policy(
    controllers: &[Box<dyn ManagedController>],
) -> Result<ValidatingAdmissionPolicy, Error> {
    let holder = "params.spec.holderIdentity";
    let held = format!("has(params.spec) && has({holder})");
    Ok(ValidatingAdmissionPolicy {
        metadata: meta(POLICY_NAME, None),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".to_owned()),
            param_kind: Some(ParamKind {
                api_version: Some("coordination.k8s.io/v1".to_owned()),
                kind: Some("Lease".to_owned()),
            }),
            match_constraints: Some(MatchResources {
                resource_rules: Some(written_resources(controllers)?),
                ..MatchResources::default()
            }),
            // The ServiceAccount lives beside its Lease, so the namespace comes from the
            // parameter and the policy holds no namespace of its own.
            match_conditions: Some(vec![MatchCondition {
                name: "manager-pod".to_owned(),
                expression: format!(
                    "request.userInfo.username == 'system:serviceaccount:' + \
                     params.metadata.namespace + ':{MANAGER_NAME}' && \
                     has(request.userInfo.extra) && '{POD_NAME_KEY}' in request.userInfo.extra"
                ),
            }]),
            variables: Some(vec![Variable {
                name: "pod".to_owned(),
                expression: format!("request.userInfo.extra['{POD_NAME_KEY}'][0]"),
            }]),
            validations: Some(vec![Validation {
                expression: format!(
                    "{held} && ({holder} == variables.pod || \
                     {holder}.startsWith(variables.pod + '_'))"
                ),
                message_expression: Some(format!(
                    "'pod ' + variables.pod + ' does not hold the leader Lease ' + \
                     params.metadata.name + ' (holder: ' + ({held} ? {holder} : 'none') + ')'"
                )),
                reason: Some("Forbidden".to_owned()),
                ..Validation::default()
            }]),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    })
}

/// The binding: the policy's parameter is the Lease the manager holds by default, in its own
/// namespace. A Lease of another name (`--leader-election-id`) needs this binding changed too.
pub fn binding() -> ValidatingAdmissionPolicyBinding {
    ValidatingAdmissionPolicyBinding {
        metadata: meta(POLICY_NAME, None),
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: POLICY_NAME.to_owned(),
            param_ref: Some(ParamRef {
                name: Some(LEADER_ELECTION_ID.to_owned()),
                namespace: Some(NAMESPACE.to_owned()),
                // A missing Lease must not refuse every user's writes of these kinds: the
                // policy matches requests before it knows whose they are.
                parameter_not_found_action: Some("Allow".to_owned()),
                ..ParamRef::default()
            }),
            validation_actions: vec!["Deny".to_owned()],
            ..ValidatingAdmissionPolicyBindingSpec::default()
        },
    }
}

/// One admission rule per API group: the resources the controllers may write, subresources
/// included, Events and the `finalizers` pseudo-subresource (never requested) left out.
fn written_resources(
    controllers: &[Box<dyn ManagedController>],
) -> Result<Vec<NamedRuleWithOperations>, Error> {
    let mut by_group: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        std::collections::BTreeMap::new();
    for rule in rbac::union_of_rules(controllers)? {
        if !rule.verbs.iter().any(|v| WRITE_VERBS.contains(&v.as_str())) {
            continue;
        }
        let groups = rule.api_groups.unwrap_or_default();
        let resources = rule.resources.unwrap_or_default();
        for group in groups {
            let kept = resources
                .iter()
                .filter(|r| r.as_str() != "events" && !r.ends_with("/finalizers"))
                .cloned();
            by_group.entry(group.clone()).or_default().extend(kept);
        }
    }
    Ok(by_group
        .into_iter()
        .filter(|(_, resources)| !resources.is_empty())
        .map(|(group, resources)| NamedRuleWithOperations {
            api_groups: Some(vec![group]),
            api_versions: Some(vec!["*".to_owned()]),
            operations: Some(["CREATE", "UPDATE", "DELETE"].map(str::to_owned).to_vec()),
            resources: Some(resources.into_iter().collect()),
            scope: Some("*".to_owned()),
            ..NamedRuleWithOperations::default()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Vec<NamedRuleWithOperations> {
        let policy = policy(&controllers::all()).expect("policy");
        let spec = policy.spec.expect("spec");
        spec.match_constraints
            .and_then(|m| m.resource_rules)
            .expect("rules")
    }

    fn resources_of(group: &str) -> Vec<String> {
        rules()
            .into_iter()
            .find(|r| r.api_groups.as_deref() == Some(&[group.to_owned()]))
            .and_then(|r| r.resources)
            .unwrap_or_default()
    }

    #[test]
    fn the_fence_covers_what_the_controllers_write() {
        assert!(resources_of("apps").contains(&"deployments".to_owned()));
        assert!(resources_of("apps").contains(&"statefulsets".to_owned()));
        assert!(resources_of(product::group!(cache)).contains(&"memcacheds/status".to_owned()));
        assert!(resources_of("").contains(&"persistentvolumeclaims".to_owned()));
    }

    #[test]
    fn events_reads_and_finalizer_grants_are_not_fenced() {
        assert!(!resources_of("").contains(&"events".to_owned()));
        assert!(
            !resources_of("").contains(&"pods".to_owned()),
            "pods are only read"
        );
        assert!(resources_of("events.k8s.io").is_empty());
        let all: Vec<String> = rules()
            .into_iter()
            .flat_map(|r| r.resources.unwrap_or_default())
            .collect();
        assert!(all.iter().all(|r| !r.ends_with("/finalizers")), "{all:?}");
    }

    #[test]
    fn the_binding_names_the_default_lease_and_never_blocks_without_it() {
        let spec = binding().spec;
        let param = spec.param_ref.expect("paramRef");
        assert_eq!(param.name.as_deref(), Some(LEADER_ELECTION_ID));
        assert_eq!(param.namespace.as_deref(), Some(NAMESPACE));
        assert_eq!(param.parameter_not_found_action.as_deref(), Some("Allow"));
        assert_eq!(spec.policy_name, POLICY_NAME);
    }
}
