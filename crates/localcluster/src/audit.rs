//! The API server's audit log: its own record of who wrote what and when, so tests can check
//! behaviour (who held a Lease, which client wrote an object) from the server's side rather
//! than from the client's logs.

use std::path::{Path, PathBuf};

use crate::{Error, Paths, Result};

/// The audit policy. Rules match first to last.
///
/// - Lease writes at `RequestResponse` level: the Lease as stored after each write shows
///   `spec.holderIdentity`, which is how a test proves which replica held leadership when
///   (a request body alone does not: a patch that leaves the holder alone omits it).
/// - ServiceAccounts' writes of a platform object's status at `RequestResponse` level: the
///   object as stored after each write shows its resourceVersion, so a test can tell a write
///   that changed nothing, sent by a controller whose cache had not yet shown its own last
///   write, from one that did.
/// - Every other write at `Metadata` level: who (user, user agent), what (verb, object) and
///   when, without bodies, so the log stays small and holds no Secret data.
/// - Reads (get, list, watch) by ServiceAccounts at `Metadata` level: the manager runs as one,
///   and a test compares every verb it used with what its RBAC grants. Nobody else's reads:
///   they are most of the traffic and say nothing about who changed what.
///
/// `RequestReceived` is omitted: every request would otherwise be logged twice, and the
/// `ResponseComplete` event already carries `requestReceivedTimestamp`.
fn policy_text() -> String {
    let status_of_platform_objects: String = product::API_GROUPS
        .iter()
        .map(|group| format!("      - group: {group}\n        resources: [\"*/status\"]\n"))
        .collect();
    format!("{POLICY_START}{status_of_platform_objects}{POLICY_END}")
}

const POLICY_START: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages:
  - RequestReceived
rules:
  - level: RequestResponse
    verbs: [create, update, patch, delete]
    resources:
      - group: coordination.k8s.io
        resources: [leases]
  - level: RequestResponse
    verbs: [update, patch]
    userGroups: [\"system:serviceaccounts\"]
    resources:
";

// Not a `\`-continued string: that would strip the first rule's indentation.
const POLICY_END: &str = r#"  - level: Metadata
    verbs: [create, update, patch, delete, deletecollection]
  - level: Metadata
    verbs: [get, list, watch]
    userGroups: ["system:serviceaccounts"]
  - level: None
"#;

/// The size in megabytes at which the log is rotated; with [`MAX_BACKUPS`] it bounds the disk
/// the log can take (a benchmark writes many thousands of objects).
const MAX_SIZE_MB: u32 = 200;
/// How many rotated files are kept beside the current one.
const MAX_BACKUPS: u32 = 3;

/// Writes the policy into the state directory, creates the log's directory, and returns the
/// API server flags that turn the log on.
///
/// The log backend's default mode, `blocking`, is kept: each event is written before the
/// request completes, so the file is in request order and complete when a request returns.
pub(crate) fn apiserver_args(paths: &Paths) -> Result<Vec<String>> {
    let policy = paths.audit_policy();
    std::fs::write(&policy, policy_text()).map_err(Error::io("writing", &policy))?;
    let dir = paths.audit_dir();
    std::fs::create_dir_all(&dir).map_err(Error::io("creating", &dir))?;
    Ok(vec![
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-log-path={}", paths.audit_log().display()),
        "--audit-log-format=json".into(),
        format!("--audit-log-maxsize={MAX_SIZE_MB}"),
        format!("--audit-log-maxbackup={MAX_BACKUPS}"),
    ])
}

/// The files of the audit log whose current file is `log`, oldest first: the rotated backups
/// (`audit-<UTC timestamp>.log`, whose names sort by age), then the current file if it exists.
pub(crate) fn log_files(log: &Path) -> Result<Vec<PathBuf>> {
    let (Some(dir), Some(stem), Some(ext)) = (log.parent(), log.file_stem(), log.extension())
    else {
        return Ok(Vec::new());
    };
    let (stem, ext) = (stem.to_string_lossy(), ext.to_string_lossy());
    let prefix = format!("{stem}-");
    let suffix = format!(".{ext}");
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(Error::Io {
                action: "listing",
                path: dir.to_owned(),
                source: e,
            });
        }
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(Error::io("listing", dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&prefix) && name.ends_with(&suffix) {
            files.push(entry.path());
        }
    }
    files.sort();
    if log.exists() {
        files.push(log.to_owned());
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_logs_lease_bodies_other_writes_as_metadata_and_only_service_accounts_reads() {
        let policy: serde_json::Value = yaml_serde::from_str(&policy_text()).expect("valid YAML");
        assert_eq!(policy["apiVersion"], "audit.k8s.io/v1");
        assert_eq!(policy["kind"], "Policy");
        assert_eq!(policy["omitStages"], serde_json::json!(["RequestReceived"]));
        let rules = policy["rules"].as_array().expect("rules");
        assert_eq!(rules.len(), 5);
        assert_eq!(rules[0]["level"], "RequestResponse");
        assert_eq!(
            rules[0]["resources"],
            serde_json::json!([{ "group": "coordination.k8s.io", "resources": ["leases"] }])
        );
        assert_eq!(
            rules[0]["verbs"],
            serde_json::json!(["create", "update", "patch", "delete"])
        );
        // The platform objects' status writes by ServiceAccounts (the managers), with bodies.
        assert_eq!(rules[1]["level"], "RequestResponse");
        assert_eq!(rules[1]["verbs"], serde_json::json!(["update", "patch"]));
        assert_eq!(
            rules[1]["userGroups"],
            serde_json::json!(["system:serviceaccounts"])
        );
        let groups: Vec<&str> = rules[1]["resources"]
            .as_array()
            .expect("resources")
            .iter()
            .map(|r| {
                assert_eq!(r["resources"], serde_json::json!(["*/status"]));
                r["group"].as_str().expect("a group")
            })
            .collect();
        assert_eq!(groups, product::API_GROUPS);
        let rules = &rules[1..];
        assert_eq!(rules[1]["level"], "Metadata");
        assert_eq!(
            rules[1]["verbs"],
            serde_json::json!(["create", "update", "patch", "delete", "deletecollection"])
        );
        assert!(rules[1].get("resources").is_none());
        assert_eq!(
            rules[2],
            serde_json::json!({
                "level": "Metadata",
                "verbs": ["get", "list", "watch"],
                "userGroups": ["system:serviceaccounts"],
            })
        );
        // The catch-all: everybody else's reads.
        assert_eq!(rules[3], serde_json::json!({ "level": "None" }));
    }

    #[test]
    fn args_write_the_policy_and_point_into_the_state_dir() {
        let root = std::env::temp_dir().join(format!("audit-args-{}", std::process::id()));
        let paths = Paths::with_root(&root);
        std::fs::create_dir_all(paths.state_dir()).expect("state dir");
        let args = apiserver_args(&paths).expect("args");
        assert_eq!(
            std::fs::read_to_string(paths.audit_policy()).expect("policy"),
            policy_text()
        );
        assert!(paths.audit_dir().is_dir());
        let log = paths.state_dir().join("audit").join("audit.log");
        assert!(args.contains(&format!("--audit-log-path={}", log.display())));
        assert!(args.contains(&"--audit-log-format=json".to_owned()));
        assert!(!args.iter().any(|a| a.starts_with("--audit-log-mode")));
        std::fs::remove_dir_all(&root).expect("cleanup");
    }

    #[test]
    fn log_files_lists_backups_oldest_first_then_the_current_file() {
        let dir = std::env::temp_dir().join(format!("audit-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let log = dir.join("audit.log");
        assert!(log_files(&log).expect("empty").is_empty());
        for name in [
            "audit.log",
            "audit-2026-03-02T10-00-00.000.log",
            "audit-2026-03-01T10-00-00.000.log",
            "other.log",
        ] {
            std::fs::write(dir.join(name), "").expect("write");
        }
        let names: Vec<_> = log_files(&log)
            .expect("files")
            .iter()
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        assert_eq!(
            names,
            [
                "audit-2026-03-01T10-00-00.000.log",
                "audit-2026-03-02T10-00-00.000.log",
                "audit.log"
            ]
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
        assert!(log_files(&log).expect("missing dir").is_empty());
    }
}
