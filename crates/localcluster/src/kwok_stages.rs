//! kwok's stages as the local cluster runs them: upstream's default node and pod stages of the
//! pinned release (see [`crate::toolchain::Binaries::kwok_stages`]), with the pod stages
//! selecting pods by CEL instead of jq.
//!
//! kwok matches every event of its pod watch against the stages in a single goroutine, and a jq
//! selector makes it convert the whole pod to JSON and back first. At 10,000 objects that
//! conversion is most of what kwok does; on two busy CPUs it falls behind its watch, the API
//! server closes the watch (it buffers about a second of events), and kwok lists every pod again
//! and matches each one, which puts it further behind. A CEL selector reads the typed pod.

use std::path::Path;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::{Error, Result};

/// A pod stage whose selector is replaced: upstream's jq conditions (key, operator and values,
/// as [`describe`] writes them), which must be what the pinned release ships, so that a release
/// with other conditions is noticed rather than silently replaced; and the CEL expressions that
/// select the same pods.
struct PodStage {
    name: &'static str,
    upstream: &'static [&'static str],
    cel: &'static [&'static str],
}

/// kwok's CEL environment knows the pod, its spec, status and metadata, but not a condition or
/// an owner reference, so the two upstream conditions on those are said another way:
/// - `pod-ready` drops "no Ready condition is True": a pending pod here has none that is (the
///   stage itself moves the pod to Running when it makes it Ready);
/// - `pod-complete` reads a Job's pods by the label the Job controller puts on each, not by
///   their owner reference.
const POD_STAGES: [PodStage; 3] = [
    PodStage {
        name: "pod-ready",
        upstream: &[
            ".metadata.deletionTimestamp DoesNotExist",
            ".status.phase In Pending",
            r#".status.conditions.[] | select( .type == "Ready" ) | .status NotIn True"#,
        ],
        cel: &[
            "!has(self.metadata.deletionTimestamp)",
            "self.status.phase == 'Pending'",
        ],
    },
    PodStage {
        name: "pod-complete",
        upstream: &[
            ".metadata.deletionTimestamp DoesNotExist",
            ".status.phase In Running",
            ".metadata.ownerReferences.[].kind In Job",
        ],
        cel: &[
            "!has(self.metadata.deletionTimestamp)",
            "self.status.phase == 'Running'",
            "'batch.kubernetes.io/controller-uid' in self.metadata.labels",
        ],
    },
    PodStage {
        name: "pod-delete",
        upstream: &[".metadata.deletionTimestamp Exists"],
        cel: &["has(self.metadata.deletionTimestamp)"],
    },
];

/// Writes to `target` the stages of `upstream` (a multi-document YAML file of kwok `Stage`s)
/// with the pod stages' selectors replaced by CEL ones.
///
/// # Errors
/// [`Error::Io`] when a file cannot be read or written; [`Error::KwokStages`] when `upstream`
/// is not YAML or has a pod stage this module does not know, or knows with other conditions.
pub(crate) fn write(upstream: &Path, target: &Path) -> Result<()> {
    let text = std::fs::read_to_string(upstream).map_err(Error::io("reading", upstream))?;
    let rewritten = with_cel_pod_selectors(&text).map_err(|problem| Error::KwokStages {
        path: upstream.to_owned(),
        problem,
    })?;
    std::fs::write(target, rewritten).map_err(Error::io("writing", target))
}

/// The stages of `upstream` with the pod stages selecting by CEL, or what is wrong with them.
fn with_cel_pod_selectors(upstream: &str) -> Result<String, String> {
    let mut out = Vec::new();
    for document in yaml_serde::Deserializer::from_str(upstream) {
        let mut stage = Value::deserialize(document).map_err(|e| format!("not YAML: {e}"))?;
        if stage.is_null() {
            continue;
        }
        if stage.pointer("/spec/resourceRef/kind") == Some(&json!("Pod")) {
            replace_pod_selector(&mut stage)?;
        }
        out.push(yaml_serde::to_string(&stage).map_err(|e| e.to_string())?);
    }
    Ok(out.join("---\n"))
}

fn replace_pod_selector(stage: &mut Value) -> Result<(), String> {
    let name = stage
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("(unnamed)")
        .to_owned();
    let known = POD_STAGES
        .iter()
        .find(|s| s.name == name)
        .ok_or_else(|| format!("its pod stage {name} has no CEL selector here"))?;
    let expressions = stage
        .pointer_mut("/spec/selector/matchExpressions")
        .ok_or_else(|| format!("its pod stage {name} has no selector.matchExpressions"))?;
    let conditions: Vec<String> = expressions
        .as_array()
        .map(|list| list.iter().map(describe).collect())
        .unwrap_or_default();
    if conditions != known.upstream {
        return Err(format!(
            "its pod stage {name} selects by {conditions:?}, but the CEL selector here replaces \
             {:?}",
            known.upstream
        ));
    }
    *expressions = known
        .cel
        .iter()
        .map(|expression| json!({ "cel": { "expression": expression } }))
        .collect();
    Ok(())
}

/// One jq condition as `key operator value,value`, e.g. `.status.phase In Pending`.
fn describe(expression: &Value) -> String {
    let text = |field: &str| expression[field].as_str().unwrap_or_default().to_owned();
    let values: Vec<&str> = expression["values"]
        .as_array()
        .map(|list| list.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let described = format!("{} {} {}", text("key"), text("operator"), values.join(","));
    described.trim_end().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of the pinned release's stages: a node stage and the three pod stages, each
    /// with its jq selector and a status template.
    const UPSTREAM: &str = r#"apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-initialize
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values:
      - 'True'
  next:
    statusTemplate: |
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Pending'
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values:
      - 'True'
  next:
    statusTemplate: |
      {{ $now := Now }}
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-complete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Running'
    - key: '.metadata.ownerReferences.[].kind'
      operator: 'In'
      values:
      - 'Job'
  next:
    statusTemplate: |
      phase: Succeeded
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
  next:
    delete: true
"#;

    fn stages(text: &str) -> Vec<Value> {
        yaml_serde::Deserializer::from_str(text)
            .map(|d| Value::deserialize(d).expect("YAML"))
            .collect()
    }

    fn cel_of(stage: &Value) -> Vec<&str> {
        stage["spec"]["selector"]["matchExpressions"]
            .as_array()
            .expect("a list")
            .iter()
            .map(|e| e["cel"]["expression"].as_str().expect("a CEL expression"))
            .collect()
    }

    #[test]
    fn pod_stages_select_by_cel_and_keep_everything_else() {
        let before = stages(UPSTREAM);
        let after = stages(&with_cel_pod_selectors(UPSTREAM).expect("rewritten"));
        assert_eq!(after.len(), 4);
        // The node stage is untouched.
        assert_eq!(after[0], before[0]);
        assert_eq!(
            cel_of(&after[1]),
            [
                "!has(self.metadata.deletionTimestamp)",
                "self.status.phase == 'Pending'"
            ]
        );
        assert_eq!(
            cel_of(&after[2])[2],
            "'batch.kubernetes.io/controller-uid' in self.metadata.labels"
        );
        assert_eq!(cel_of(&after[3]), ["has(self.metadata.deletionTimestamp)"]);
        for (old, new) in before.iter().zip(&after).skip(1) {
            // Only the selector changes: the templates and what the stage does stay upstream's.
            assert_eq!(old["spec"]["next"], new["spec"]["next"]);
            assert_eq!(old["metadata"], new["metadata"]);
            assert_eq!(old["spec"]["resourceRef"], new["spec"]["resourceRef"]);
        }
    }

    #[test]
    fn an_unknown_pod_stage_is_an_error_that_names_it() {
        let text = UPSTREAM.replace("name: pod-complete", "name: pod-evict");
        let error = with_cel_pod_selectors(&text).expect_err("unknown stage");
        assert!(error.contains("pod-evict"), "{error}");
    }

    #[test]
    fn a_pod_stage_with_other_conditions_than_upstreams_is_an_error() {
        let text = UPSTREAM.replace("'.metadata.ownerReferences.[].kind'", "'.spec.nodeName'");
        let error = with_cel_pod_selectors(&text).expect_err("changed selector");
        assert!(
            error.contains("pod-complete") && error.contains(".spec.nodeName"),
            "{error}"
        );
    }

    #[test]
    fn a_pod_stage_with_other_values_than_upstreams_is_an_error() {
        let text = UPSTREAM.replace("      - 'Pending'", "      - 'Pending'\n      - 'Unknown'");
        let error = with_cel_pod_selectors(&text).expect_err("changed values");
        assert!(
            error.contains("pod-ready") && error.contains(".status.phase In Pending,Unknown"),
            "{error}"
        );
    }

    #[test]
    fn text_that_is_not_yaml_is_an_error() {
        let error = with_cel_pod_selectors("kind: [Stage").expect_err("not YAML");
        assert!(error.starts_with("not YAML"), "{error}");
    }
}
