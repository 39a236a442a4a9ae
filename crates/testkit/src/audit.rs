//! The API server's audit log as evidence: who wrote what and when, and who held a Lease
//! meanwhile.
//!
//! The local cluster's API server records every write (leases with the object as stored, so
//! the holder is known), with the client's user agent and the time the request was received.
//! [`check_fencing`] reads a leader-elected manager's history out of it: each replica's
//! leadership intervals, from the Lease writes the API server accepted, and every other write
//! the replica sent, which must fall inside one of its own intervals and within the renew
//! deadline of its last accepted renewal.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::Deserialize;

use crate::{Error, Result};

/// One audit event, as far as the checks here need it.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditEvent {
    /// `create`, `update`, `patch`, `delete`, ...
    pub verb: String,
    /// The request path and query.
    pub request_uri: String,
    /// The client's `User-Agent`.
    pub user_agent: String,
    /// The authenticated user's name (`system:serviceaccount:<namespace>:<name>` for a
    /// ServiceAccount).
    pub user: String,
    /// The resource's API group, empty for the core group.
    pub group: String,
    /// The resource (plural), empty for non-resource requests.
    pub resource: String,
    /// The subresource (`status`, `binding`, ...), empty for the object itself.
    pub subresource: String,
    /// The object's namespace, if namespaced.
    pub namespace: String,
    /// The object's name, if the request named one.
    pub name: String,
    /// The response status code.
    pub code: u16,
    /// When the API server received the request.
    pub received: Timestamp,
    /// When the API server finished the response.
    pub completed: Timestamp,
    /// The request body (recorded for Lease writes only).
    pub request_object: Option<serde_json::Value>,
    /// The object as the API server stored it (recorded for Lease writes only).
    pub response_object: Option<serde_json::Value>,
}

impl AuditEvent {
    /// Whether the API server accepted the request.
    pub fn succeeded(&self) -> bool {
        (200..300).contains(&self.code)
    }

    /// `spec.holderIdentity` after a Lease write (empty when none), from the Lease as stored;
    /// from the request body where the log has no stored object. `None` when the write does
    /// not say: a patch that leaves the holder alone (an edit of the duration by hand) does
    /// not end anyone's tenure.
    pub fn lease_holder(&self) -> Option<String> {
        let holder = |object: &serde_json::Value| {
            object
                .pointer("/spec/holderIdentity")
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        if self.verb == "delete" {
            return Some(String::new());
        }
        if let Some(stored) = self
            .response_object
            .as_ref()
            .filter(|o| o["kind"] == "Lease")
        {
            return Some(holder(stored));
        }
        let request = self.request_object.as_ref()?;
        // A merge patch without the field keeps it; a replace without it empties it.
        if self.verb == "patch" && request.pointer("/spec/holderIdentity").is_none() {
            return None;
        }
        Some(holder(request))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawEvent {
    stage: String,
    verb: String,
    #[serde(default, rename = "requestURI")]
    request_uri: String,
    #[serde(default)]
    user_agent: String,
    #[serde(default)]
    user: Option<RawUser>,
    #[serde(default)]
    object_ref: Option<RawObjectRef>,
    #[serde(default)]
    response_status: Option<RawStatus>,
    #[serde(default)]
    request_object: Option<serde_json::Value>,
    #[serde(default)]
    response_object: Option<serde_json::Value>,
    request_received_timestamp: String,
    stage_timestamp: String,
}

#[derive(Deserialize)]
struct RawUser {
    #[serde(default)]
    username: String,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawObjectRef {
    #[serde(default)]
    api_group: String,
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    name: String,
}

#[derive(Deserialize)]
struct RawStatus {
    #[serde(default)]
    code: u16,
}

/// Parses the JSON lines of one audit log file; only completed requests (stage
/// `ResponseComplete` or `Panic`) are kept.
///
/// # Errors
/// [`Error::AuditLog`] naming the file and line that is not an audit event.
pub fn parse_audit_log(path: &Path, text: &str) -> Result<Vec<AuditEvent>> {
    let mut events = Vec::new();
    for (index, line) in text.lines().enumerate() {
        events.extend(parse_line(path, index + 1, line)?);
    }
    Ok(events)
}

/// One line of an audit log file: `None` when blank or not a completed request.
fn parse_line(path: &Path, number: usize, line: &str) -> Result<Option<AuditEvent>> {
    if line.trim().is_empty() {
        return Ok(None);
    }
    let bad = |message: String| Error::AuditLog {
        path: path.to_owned(),
        line: number,
        message,
    };
    let raw: RawEvent = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
    if raw.stage != "ResponseComplete" && raw.stage != "Panic" {
        return Ok(None);
    }
    let time = |text: &str| {
        text.parse::<Timestamp>()
            .map_err(|e| bad(format!("timestamp {text:?}: {e}")))
    };
    let object = raw.object_ref.unwrap_or_default();
    Ok(Some(AuditEvent {
        verb: raw.verb,
        request_uri: raw.request_uri,
        user_agent: raw.user_agent,
        user: raw.user.map(|u| u.username).unwrap_or_default(),
        group: object.api_group,
        resource: object.resource,
        subresource: object.subresource,
        namespace: object.namespace,
        name: object.name,
        code: raw.response_status.map(|s| s.code).unwrap_or_default(),
        received: time(&raw.request_received_timestamp)?,
        completed: time(&raw.stage_timestamp)?,
        request_object: raw.request_object,
        response_object: raw.response_object,
    }))
}

/// Every event in the audit log `files` (as `ClusterState::audit_log_files` lists them),
/// ordered by the time the API server received the request.
///
/// # Errors
/// [`Error::Io`] when a file cannot be read; [`Error::AuditLog`] when a line is not an audit
/// event.
pub fn read_audit_files(files: &[PathBuf]) -> Result<Vec<AuditEvent>> {
    read_audit_files_where(files, |_| true)
}

/// Like [`read_audit_files`], but parses only the lines `keep_line` accepts (as raw JSON
/// text): a cheap test such as a namespace's name spares parsing the rest of a log that holds
/// hundreds of megabytes. Files are read a line at a time.
///
/// # Errors
/// As [`read_audit_files`].
pub fn read_audit_files_where(
    files: &[PathBuf],
    keep_line: impl Fn(&str) -> bool,
) -> Result<Vec<AuditEvent>> {
    use std::io::BufRead;
    let mut events = Vec::new();
    for file in files {
        let reader = std::fs::File::open(file)
            .map(std::io::BufReader::new)
            .map_err(Error::io("reading", file))?;
        for (index, line) in reader.lines().enumerate() {
            // The error's path is built only on failure: a log holds millions of lines.
            let line = line.map_err(|e| Error::io("reading", file)(e))?;
            if keep_line(&line) {
                events.extend(parse_line(file, index + 1, &line)?);
            }
        }
    }
    events.sort_by_key(|e| e.received);
    Ok(events)
}

/// A period in which the API server's copy of a Lease named one holder: from the completion
/// of the write that made it holder, until the arrival of the next accepted write naming
/// someone else or no one (`None` while it still holds it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenure {
    /// The holder.
    pub holder: String,
    /// When the API server completed the write that made it holder.
    pub from: Timestamp,
    /// When the API server received the write that ended it.
    pub until: Option<Timestamp>,
}

impl Tenure {
    fn contains(&self, at: Timestamp) -> bool {
        self.from <= at && self.until.is_none_or(|until| at < until)
    }
}

/// Who held Lease `namespace/name`, period by period, from the accepted writes to it.
pub fn lease_tenures(events: &[AuditEvent], namespace: &str, name: &str) -> Vec<Tenure> {
    let mut tenures: Vec<Tenure> = Vec::new();
    // Writes to one Lease carry the resourceVersion they read, so the accepted ones are
    // sequential: each was received after the previous one was written.
    let writes = events.iter().filter(|e| {
        e.resource == "leases" && e.namespace == namespace && e.name == name && e.succeeded()
    });
    for write in writes {
        let Some(holder) = write.lease_holder() else {
            continue;
        };
        let current = tenures.last().filter(|t| t.until.is_none());
        if current.is_some_and(|t| t.holder == holder) {
            continue;
        }
        if let Some(open) = tenures.last_mut().filter(|t| t.until.is_none()) {
            open.until = Some(write.received);
        }
        if !holder.is_empty() {
            tenures.push(Tenure {
                holder,
                from: write.completed,
                until: None,
            });
        }
    }
    tenures
}

/// Why a write falls outside what its replica was allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breach {
    /// Committed while the Lease named another holder ([`LateWrite::holder`]).
    OtherHolder,
    /// Committed while the Lease named no holder (released, emptied or deleted).
    NotHolder,
    /// Received more than the renew deadline after the replica's last accepted renewal.
    PastDeadline,
}

/// An accepted write of a replica outside its leadership.
#[derive(Debug, Clone, PartialEq)]
pub struct LateWrite {
    /// The replica (leader-election identity).
    pub identity: String,
    /// What it was.
    pub verb: String,
    /// Its path.
    pub request_uri: String,
    /// When the API server received it.
    pub received: Timestamp,
    /// When the API server committed it (completed it).
    pub committed: Timestamp,
    /// Which limit it broke.
    pub breach: Breach,
    /// Whose tenure it was committed in, for [`Breach::OtherHolder`].
    pub holder: Option<String>,
    /// How far past the limit: into the other holder's tenure, past the end of its own last
    /// tenure (zero when it never held the Lease), or past its renew deadline.
    pub beyond: Duration,
}

/// One replica's history as the audit log tells it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplicaHistory {
    /// Its periods as holder.
    pub tenures: Vec<Tenure>,
    /// Its accepted writes, Lease writes excluded.
    pub writes: usize,
    /// Its writes the API server refused (the API server's fence among the reasons).
    pub refused: usize,
    /// Its accepted writes outside its tenures or past its renew deadline.
    pub late: Vec<LateWrite>,
}

/// The fencing evidence for one Lease: per replica identity, its tenures and late writes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FencingReport {
    /// By identity.
    pub replicas: BTreeMap<String, ReplicaHistory>,
}

impl FencingReport {
    /// Every late write of every replica.
    pub fn late_writes(&self) -> impl Iterator<Item = &LateWrite> {
        self.replicas.values().flat_map(|r| r.late.iter())
    }

    /// The largest `beyond` of all late writes (zero when there are none).
    pub fn worst(&self) -> Duration {
        self.late_writes()
            .map(|w| w.beyond)
            .max()
            .unwrap_or_default()
    }
}

fn after(later: Timestamp, earlier: Timestamp) -> Duration {
    let gap: SignedDuration = later.duration_since(earlier);
    Duration::try_from(gap).unwrap_or_default()
}

/// Checks every write of the replicas that `identity_of` recognises (by user agent) against
/// the tenures of Lease `namespace/name`. A write the API server accepted must be committed
/// within one of its replica's own tenures, and must arrive no later than `renew_deadline` after
/// that replica's last accepted write to the Lease naming it. Refused writes changed nothing:
/// they are counted, not judged.
pub fn check_fencing(
    events: &[AuditEvent],
    namespace: &str,
    name: &str,
    renew_deadline: Duration,
    identity_of: impl Fn(&str) -> Option<String>,
) -> FencingReport {
    let tenures = lease_tenures(events, namespace, name);
    let mut report = FencingReport::default();
    for tenure in &tenures {
        report
            .replicas
            .entry(tenure.holder.clone())
            .or_default()
            .tenures
            .push(tenure.clone());
    }
    // The last accepted Lease write naming each identity, as the events go by.
    let mut last_renewal: BTreeMap<String, Timestamp> = BTreeMap::new();
    let is_lease =
        |e: &AuditEvent| e.resource == "leases" && e.namespace == namespace && e.name == name;
    for event in events {
        if is_lease(event) {
            if event.succeeded()
                && let Some(holder) = event.lease_holder()
                && !holder.is_empty()
            {
                last_renewal.insert(holder, event.received);
            }
            continue;
        }
        if !matches!(
            event.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        ) {
            continue;
        }
        let Some(identity) = identity_of(&event.user_agent) else {
            continue;
        };
        let history = report.replicas.entry(identity.clone()).or_default();
        if !event.succeeded() {
            history.refused += 1;
            continue;
        }
        history.writes += 1;
        let late = |breach, holder, beyond| LateWrite {
            identity: identity.clone(),
            verb: event.verb.clone(),
            request_uri: event.request_uri.clone(),
            received: event.received,
            committed: event.completed,
            breach,
            holder,
            beyond,
        };
        let committed = event.completed;
        if !history.tenures.iter().any(|t| t.contains(committed)) {
            let other = tenures.iter().find(|t| t.contains(committed));
            let breach = match other {
                Some(tenure) => late(
                    Breach::OtherHolder,
                    Some(tenure.holder.clone()),
                    after(committed, tenure.from),
                ),
                None => {
                    // How long after the end of its last tenure before this write (if any).
                    let ended = history
                        .tenures
                        .iter()
                        .filter_map(|t| t.until)
                        .filter(|until| *until <= committed)
                        .max();
                    let beyond = ended.map_or(Duration::ZERO, |e| after(committed, e));
                    late(Breach::NotHolder, None, beyond)
                }
            };
            history.late.push(breach);
            continue;
        }
        if let Some(renewed) = last_renewal.get(&identity) {
            let limit = *renewed + renew_deadline;
            if event.received > limit {
                history.late.push(late(
                    Breach::PastDeadline,
                    None,
                    after(event.received, limit),
                ));
            }
        }
    }
    report
}

/// A status write that changed nothing, sent by the replica that had written the object's
/// status just before: its controller computed the status from a cache that had not yet shown
/// its own last write (a controller writes a status only when its cache shows another).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepeatedWrite {
    /// `namespace/name` of the object.
    pub object: String,
    /// The replica's leader-election identity.
    pub identity: String,
    /// When the API server received the repeat.
    pub received: Timestamp,
}

/// What [`repeated_status_writes`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusWrites {
    /// Accepted status writes by managers, with the object as stored.
    pub checked: usize,
    /// Those that changed nothing after the same replica's own write.
    pub repeats: Vec<RepeatedWrite>,
    /// Those that changed nothing after another replica's write: a new leader whose cache had
    /// not yet shown its predecessor's last write.
    pub after_another_replica: usize,
}

/// The managers' status writes that changed nothing (the object came back with the
/// resourceVersion the previous status write left), by whom they followed. Needs the log's
/// stored objects of status writes (the local cluster's audit policy records them).
pub fn repeated_status_writes(events: &[AuditEvent]) -> StatusWrites {
    let mut found = StatusWrites::default();
    // Per object: the resourceVersion the last status write left, and who wrote it.
    let mut last: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut writes: Vec<&AuditEvent> = events
        .iter()
        .filter(|e| e.subresource == "status" && e.succeeded())
        .filter(|e| matches!(e.verb.as_str(), "update" | "patch"))
        .collect();
    writes.sort_by_key(|e| e.completed);
    for event in writes {
        let (Some(identity), Some(version)) = (
            manager_identity(&event.user_agent),
            event
                .response_object
                .as_ref()
                .and_then(|o| o.pointer("/metadata/resourceVersion"))
                .and_then(serde_json::Value::as_str),
        ) else {
            continue;
        };
        found.checked += 1;
        let object = format!(
            "{}/{}/{}/{}",
            event.group, event.resource, event.namespace, event.name
        );
        if let Some((before, writer)) = last.get(&object)
            && before == version
        {
            if *writer == identity {
                found.repeats.push(RepeatedWrite {
                    object: object.clone(),
                    identity: identity.clone(),
                    received: event.received,
                });
            } else {
                found.after_another_replica += 1;
            }
        }
        last.insert(object, (version.to_owned(), identity));
    }
    found
}

/// The pod (or host) name in a manager's leader-election identity, `<pod>_<suffix>`: the
/// identity itself when it has no suffix (another program's, say).
pub fn identity_pod(identity: &str) -> &str {
    identity.split_once('_').map_or(identity, |(pod, _)| pod)
}

/// The leader-election identity in a manager's user agent, `operator-manager/<version>
/// (<identity>)`.
pub fn manager_identity(user_agent: &str) -> Option<String> {
    let rest = user_agent.strip_prefix(concat!(product::name!(), "/"))?;
    let (_, identity) = rest.split_once(" (")?;
    identity.strip_suffix(')').map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_write(ms: i64, identity: &str, name: &str, version: &str) -> AuditEvent {
        AuditEvent {
            verb: "patch".into(),
            request_uri: format!(
                "/apis/cache.example.com/v1alpha1/namespaces/ns/memcacheds/{name}/status"
            ),
            user_agent: format!("{}/0.1.0 ({identity})", product::NAME),
            user: String::new(),
            group: "cache.example.com".into(),
            resource: "memcacheds".into(),
            subresource: "status".into(),
            namespace: "ns".into(),
            name: name.into(),
            code: 200,
            received: at(ms),
            completed: at(ms + 5),
            request_object: None,
            response_object: Some(serde_json::json!({"metadata": {"resourceVersion": version}})),
        }
    }

    #[test]
    fn a_status_write_that_changed_nothing_after_its_own_is_a_repeat() {
        let events = vec![
            status_write(0, "a_1", "m", "10"),
            status_write(10, "a_1", "m", "11"),
            // Nothing changed: a's cache still showed its status before version 11.
            status_write(20, "a_1", "m", "11"),
            // Another object's versions are its own.
            status_write(30, "a_1", "n", "11"),
            // A new leader's first write changing nothing follows a's, not its own.
            status_write(40, "b_2", "m", "11"),
            status_write(50, "b_2", "m", "12"),
        ];
        let found = repeated_status_writes(&events);
        assert_eq!(found.checked, 6);
        assert_eq!(
            found.repeats,
            [RepeatedWrite {
                object: "cache.example.com/memcacheds/ns/m".into(),
                identity: "a_1".into(),
                received: at(20),
            }]
        );
        assert_eq!(found.after_another_replica, 1);
    }

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(1_800_000_000_000 + ms).unwrap()
    }

    fn lease_write(ms: i64, agent: &str, holder: &str) -> AuditEvent {
        AuditEvent {
            verb: "update".into(),
            request_uri: "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l".into(),
            user_agent: agent.into(),
            user: String::new(),
            group: String::new(),
            resource: "leases".into(),
            subresource: String::new(),
            namespace: "ns".into(),
            name: "l".into(),
            code: 200,
            received: at(ms),
            completed: at(ms + 2),
            request_object: Some(serde_json::json!({"spec": {"holderIdentity": holder}})),
            response_object: None,
        }
    }

    fn write(ms: i64, agent: &str) -> AuditEvent {
        AuditEvent {
            verb: "patch".into(),
            request_uri: "/apis/apps/v1/namespaces/app/deployments/web".into(),
            user_agent: agent.into(),
            user: String::new(),
            group: String::new(),
            resource: "deployments".into(),
            subresource: String::new(),
            namespace: "app".into(),
            name: "web".into(),
            code: 200,
            received: at(ms),
            completed: at(ms + 3),
            request_object: None,
            response_object: None,
        }
    }

    const A: &str = concat!(product::name!(), "/0.1.0 (a)");
    const B: &str = concat!(product::name!(), "/0.1.0 (b)");

    #[test]
    fn the_pod_name_is_the_identity_before_its_suffix() {
        assert_eq!(identity_pod("replica-0_1a2b3c4d"), "replica-0");
        assert_eq!(identity_pod("replica-0"), "replica-0");
    }

    #[test]
    fn identities_come_from_the_user_agent() {
        assert_eq!(manager_identity(A).as_deref(), Some("a"));
        assert_eq!(
            manager_identity(concat!(product::name!(), "/0.1.0 (pod-7f (x))")).as_deref(),
            Some("pod-7f (x)")
        );
        assert_eq!(manager_identity("kubectl/v1.37.1 (linux/amd64)"), None);
        assert_eq!(manager_identity(concat!(product::name!(), "/0.1.0")), None);
    }

    #[test]
    fn tenures_follow_accepted_holder_changes() {
        let mut refused = lease_write(2_500, B, "b");
        refused.code = 409;
        let events = vec![
            lease_write(0, A, "a"),
            lease_write(1_000, A, "a"),
            refused,
            lease_write(3_000, A, ""),
            lease_write(3_100, B, "b"),
            lease_write(4_000, B, "b"),
        ];
        assert_eq!(
            lease_tenures(&events, "ns", "l"),
            [
                Tenure {
                    holder: "a".into(),
                    from: at(2),
                    until: Some(at(3_000)),
                },
                Tenure {
                    holder: "b".into(),
                    from: at(3_102),
                    until: None,
                },
            ]
        );
        assert!(lease_tenures(&events, "ns", "other").is_empty());
    }

    #[test]
    fn writes_committed_inside_tenures_pass_and_others_are_late() {
        let mut fenced = write(3_500, A);
        fenced.code = 403;
        let mut events = vec![
            lease_write(0, A, "a"),
            write(100, A),
            lease_write(1_000, A, "a"),
            // Released at 3 s, taken by b at 3.1 s (committed at 3.102 s).
            lease_write(3_000, A, ""),
            write(3_050, A),
            lease_write(3_100, B, "b"),
            write(3_200, B),
            write(3_400, A),
            // Refused by the API server: it changed nothing.
            fenced,
            // A standby's write before it ever led.
            write(50, B),
            // Not a manager: ignored.
            write(3_300, "kubectl/v1.37.1"),
        ];
        events.sort_by_key(|e| e.received);
        let report = check_fencing(&events, "ns", "l", Duration::from_secs(10), |ua| {
            manager_identity(ua)
        });
        let a = &report.replicas["a"];
        assert_eq!((a.writes, a.refused, a.tenures.len()), (3, 1, 1));
        let late: Vec<(&str, i64, Breach, Option<&str>, Duration)> = report
            .late_writes()
            .map(|w| {
                (
                    w.identity.as_str(),
                    w.committed.as_millisecond() - at(0).as_millisecond(),
                    w.breach,
                    w.holder.as_deref(),
                    w.beyond,
                )
            })
            .collect();
        let ms = Duration::from_millis;
        assert_eq!(
            late,
            [
                ("a", 3_053, Breach::NotHolder, None, ms(53)),
                ("a", 3_403, Breach::OtherHolder, Some("b"), ms(301)),
                ("b", 53, Breach::OtherHolder, Some("a"), ms(51)),
            ]
        );
        assert_eq!(report.worst(), ms(301));
    }

    #[test]
    fn an_edit_that_leaves_the_holder_alone_ends_no_tenure() {
        // Someone patches the duration only: the request omits the holder, the stored Lease
        // still names a.
        let mut edit = lease_write(1_000, "kubectl/v1.37.1", "");
        edit.verb = "patch".into();
        edit.request_object = Some(serde_json::json!({"spec": {"leaseDurationSeconds": 1}}));
        edit.response_object = Some(serde_json::json!({
            "kind": "Lease",
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 1}
        }));
        let mut unstored = edit.clone();
        unstored.response_object = None;
        for (edit, holder) in [(edit, Some("a")), (unstored, None)] {
            assert_eq!(edit.lease_holder().as_deref(), holder);
            let events = vec![lease_write(0, A, "a"), edit, write(1_500, A)];
            let report = check_fencing(&events, "ns", "l", Duration::from_secs(10), |ua| {
                manager_identity(ua)
            });
            assert_eq!(report.replicas["a"].tenures.len(), 1);
            assert_eq!(report.late_writes().count(), 0);
        }
    }

    #[test]
    fn the_stored_lease_names_the_holder_whatever_the_request_said() {
        // A JSON patch: the request is a list of operations, the stored Lease says who holds it.
        let mut patch = lease_write(0, "kubectl/v1.37.1", "");
        patch.verb = "patch".into();
        patch.request_object = Some(serde_json::json!([
            {"op": "replace", "path": "/spec/holderIdentity", "value": "b"}
        ]));
        patch.response_object =
            Some(serde_json::json!({"kind": "Lease", "spec": {"holderIdentity": "b"}}));
        assert_eq!(patch.lease_holder().as_deref(), Some("b"));
        // Released: the stored Lease has no holder field at all.
        let mut release = lease_write(0, A, "");
        release.response_object = Some(serde_json::json!({"kind": "Lease", "spec": {}}));
        assert_eq!(release.lease_holder().as_deref(), Some(""));
        // A deletion leaves no holder, whatever its answer holds.
        let mut delete = lease_write(0, A, "a");
        delete.verb = "delete".into();
        delete.response_object =
            Some(serde_json::json!({"kind": "Lease", "spec": {"holderIdentity": "a"}}));
        assert_eq!(delete.lease_holder().as_deref(), Some(""));
    }

    #[test]
    fn a_holder_that_stopped_renewing_may_not_write_past_its_deadline() {
        let events = vec![lease_write(0, A, "a"), write(9_000, A), write(10_500, A)];
        let report = check_fencing(&events, "ns", "l", Duration::from_secs(10), |ua| {
            manager_identity(ua)
        });
        let late: Vec<(Breach, Duration)> =
            report.late_writes().map(|w| (w.breach, w.beyond)).collect();
        assert_eq!(late, [(Breach::PastDeadline, Duration::from_millis(500))]);
    }

    #[test]
    fn audit_lines_parse_and_bad_lines_are_named() {
        let line = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Request","auditID":"x","stage":"ResponseComplete","requestURI":"/apis/coordination.k8s.io/v1/namespaces/ns/leases/l","verb":"update","user":{"username":"u"},"sourceIPs":["127.0.0.1"],"userAgent":"operator-manager/0.1.0 (a)","objectRef":{"resource":"leases","namespace":"ns","name":"l","apiGroup":"coordination.k8s.io","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestObject":{"spec":{"holderIdentity":"a"}},"requestReceivedTimestamp":"2026-11-23T03:30:00.123456Z","stageTimestamp":"2026-11-23T03:30:00.125000Z"}"#;
        let started = line.replace("ResponseComplete", "ResponseStarted");
        let text = format!("{line}\n{started}\n");
        let events = parse_audit_log(Path::new("audit.log"), &text).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].lease_holder().as_deref(), Some("a"));
        assert_eq!(events[0].code, 200);
        assert_eq!(events[0].user, "u");
        assert_eq!(events[0].subresource, "");
        assert_eq!(
            events[0].request_uri,
            "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l"
        );
        assert_eq!(
            events[0].received,
            "2026-11-23T03:30:00.123456Z".parse::<Timestamp>().unwrap()
        );

        let error = parse_audit_log(Path::new("audit.log"), &format!("{line}\nnot json\n"))
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with("audit.log line 2 is not an audit event"),
            "{error}"
        );
    }

    #[test]
    fn reading_files_keeps_only_the_lines_asked_for_with_their_subresource() {
        let dir = std::env::temp_dir().join(format!("audit-where-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let event = |namespace: &str, ms: u32| {
            format!(
                r#"{{"stage":"ResponseComplete","verb":"patch","user":{{"username":"system:serviceaccount:kube-system:kwok"}},"objectRef":{{"resource":"pods","subresource":"status","namespace":"{namespace}","name":"p"}},"responseStatus":{{"code":200}},"requestReceivedTimestamp":"2026-11-23T03:30:00.{ms:03}Z","stageTimestamp":"2026-11-23T03:30:00.{ms:03}Z"}}"#
            )
        };
        let older = dir.join("audit-2026-11-23T03-00-00.000.log");
        let current = dir.join("audit.log");
        std::fs::write(
            &older,
            format!("{}\n{}\n", event("a", 200), event("b", 100)),
        )
        .expect("write");
        // A line left out is never parsed, so it may be anything.
        std::fs::write(&current, format!("{}\nnot json\n", event("a", 100))).expect("write");
        let events = read_audit_files_where(&[older.clone(), current.clone()], |line| {
            line.contains(r#""namespace":"a""#)
        })
        .expect("events");
        let seen: Vec<_> = events
            .iter()
            .map(|e| {
                (
                    e.namespace.as_str(),
                    e.subresource.as_str(),
                    e.user.as_str(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [("a", "status", "system:serviceaccount:kube-system:kwok"); 2]
        );
        assert!(events[0].received < events[1].received, "sorted by arrival");
        let error = read_audit_files(&[older, current]).unwrap_err().to_string();
        assert!(error.contains("audit.log line 2"), "{error}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
