//! What a platform team watches the manager with: Grafana dashboards (as ConfigMaps a Grafana
//! sidecar picks up by their `grafana_dashboard` label, the JSON inside importable by hand) and
//! a PrometheusRule with the alerts to page on, all from the metrics the manager exports.
//!
//! Every query reads series the manager itself serves, so they work wherever Prometheus scrapes
//! it; `$job` is the scrape job (a ServiceMonitor names it after the metrics Service).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::manager::labels;
use crate::{Error, GeneratedFile, MANAGER_NAME, NAMESPACE, yaml};

/// The job a ServiceMonitor of the metrics Service gives the manager's series.
pub const JOB: &str = concat!(product::name!(), "-metrics");

/// `text` with the product's names put in for `$JOB` and `$NAME`.
fn named(text: &str) -> String {
    text.replace("$JOB", JOB).replace("$NAME", product::NAME)
}

/// The label a Grafana sidecar looks for on dashboard ConfigMaps.
pub const DASHBOARD_LABEL: (&str, &str) = ("grafana_dashboard", "1");

/// One panel: a title, a unit, and its queries with their legends.
struct Panel {
    title: &'static str,
    unit: &'static str,
    queries: &'static [(&'static str, &'static str)],
}

/// The controller-runtime dashboard: reconciles, the work queues, the workers, the leader and
/// the client's requests.
const RUNTIME_PANELS: &[Panel] = &[
    Panel {
        title: "Reconciles per second",
        unit: "ops",
        queries: &[(
            r#"sum by (controller, result) (rate(controller_runtime_reconcile_total{job="$job"}[5m]))"#,
            "{{controller}} {{result}}",
        )],
    },
    Panel {
        title: "Reconcile errors per second",
        unit: "ops",
        queries: &[
            (
                r#"sum by (controller) (rate(controller_runtime_reconcile_errors_total{job="$job"}[5m]))"#,
                "{{controller}}",
            ),
            (
                r#"sum by (controller) (rate(controller_runtime_terminal_reconcile_errors_total{job="$job"}[5m]))"#,
                "{{controller}} terminal",
            ),
        ],
    },
    Panel {
        title: "Reconcile time (p50, p90, p99)",
        unit: "s",
        queries: &[
            (
                r#"histogram_quantile(0.50, sum by (controller, le) (rate(controller_runtime_reconcile_time_seconds_bucket{job="$job"}[5m])))"#,
                "{{controller}} p50",
            ),
            (
                r#"histogram_quantile(0.90, sum by (controller, le) (rate(controller_runtime_reconcile_time_seconds_bucket{job="$job"}[5m])))"#,
                "{{controller}} p90",
            ),
            (
                r#"histogram_quantile(0.99, sum by (controller, le) (rate(controller_runtime_reconcile_time_seconds_bucket{job="$job"}[5m])))"#,
                "{{controller}} p99",
            ),
        ],
    },
    Panel {
        title: "Work queue depth",
        unit: "short",
        queries: &[(r#"sum by (name) (workqueue_depth{job="$job"})"#, "{{name}}")],
    },
    Panel {
        title: "Work queue adds and retries per second",
        unit: "ops",
        queries: &[
            (
                r#"sum by (name) (rate(workqueue_adds_total{job="$job"}[5m]))"#,
                "{{name}} adds",
            ),
            (
                r#"sum by (name) (rate(workqueue_retries_total{job="$job"}[5m]))"#,
                "{{name}} retries",
            ),
        ],
    },
    Panel {
        title: "Time in the queue (p99)",
        unit: "s",
        queries: &[(
            r#"histogram_quantile(0.99, sum by (name, le) (rate(workqueue_queue_duration_seconds_bucket{job="$job"}[5m])))"#,
            "{{name}}",
        )],
    },
    Panel {
        title: "Work duration (p99)",
        unit: "s",
        queries: &[(
            r#"histogram_quantile(0.99, sum by (name, le) (rate(workqueue_work_duration_seconds_bucket{job="$job"}[5m])))"#,
            "{{name}}",
        )],
    },
    Panel {
        title: "Unfinished work and the longest running reconcile",
        unit: "s",
        queries: &[
            (
                r#"sum by (name) (workqueue_unfinished_work_seconds{job="$job"})"#,
                "{{name}} unfinished",
            ),
            (
                r#"max by (name) (workqueue_longest_running_processor_seconds{job="$job"})"#,
                "{{name}} longest",
            ),
        ],
    },
    Panel {
        title: "Workers in use",
        unit: "short",
        queries: &[
            (
                r#"sum by (controller) (controller_runtime_active_workers{job="$job"})"#,
                "{{controller}} active",
            ),
            (
                r#"max by (controller) (controller_runtime_max_concurrent_reconciles{job="$job"})"#,
                "{{controller}} max",
            ),
        ],
    },
    Panel {
        title: "Leader",
        unit: "short",
        queries: &[(
            r#"max by (instance, name) (leader_election_master_status{job="$job"})"#,
            "{{instance}}",
        )],
    },
    Panel {
        title: "API requests per second",
        unit: "reqps",
        queries: &[(
            r#"sum by (code, method) (rate(rest_client_requests_total{job="$job"}[5m]))"#,
            "{{method}} {{code}}",
        )],
    },
    Panel {
        title: "Webhook requests per second",
        unit: "reqps",
        queries: &[(
            r#"sum by (webhook, code) (rate(controller_runtime_webhook_requests_total{job="$job"}[5m]))"#,
            "{{webhook}} {{code}}",
        )],
    },
    Panel {
        title: "Webhook latency (p99) and requests in flight",
        unit: "s",
        queries: &[
            (
                r#"histogram_quantile(0.99, sum by (webhook, le) (rate(controller_runtime_webhook_latency_seconds_bucket{job="$job"}[5m])))"#,
                "{{webhook}} p99",
            ),
            (
                r#"sum by (webhook) (controller_runtime_webhook_requests_in_flight{job="$job"})"#,
                "{{webhook}} in flight",
            ),
        ],
    },
    Panel {
        title: "Certificate reads and read errors per second",
        unit: "ops",
        queries: &[
            (
                r#"sum(rate(certwatcher_read_certificate_total{job="$job"}[5m]))"#,
                "reads",
            ),
            (
                r#"sum(rate(certwatcher_read_certificate_errors_total{job="$job"}[5m]))"#,
                "errors",
            ),
        ],
    },
];

/// The resources dashboard: what the manager process uses.
const RESOURCE_PANELS: &[Panel] = &[
    Panel {
        title: "CPU (cores)",
        unit: "short",
        queries: &[(
            r#"rate(process_cpu_seconds_total{job="$job"}[5m])"#,
            "{{instance}}",
        )],
    },
    Panel {
        title: "Memory (resident)",
        unit: "bytes",
        queries: &[(
            r#"process_resident_memory_bytes{job="$job"}"#,
            "{{instance}}",
        )],
    },
    Panel {
        title: "Open file descriptors",
        unit: "short",
        queries: &[(r#"process_open_fds{job="$job"}"#, "{{instance}}")],
    },
];

/// One alert: its name, expression, how long it must hold, severity and what it means.
struct Alert {
    name: &'static str,
    expr: &'static str,
    for_: &'static str,
    severity: &'static str,
    summary: &'static str,
    description: &'static str,
}

const ALERTS: &[Alert] = &[
    Alert {
        name: "OperatorManagerDown",
        expr: r#"absent(up{job="$JOB"} == 1)"#,
        for_: "1m",
        severity: "critical",
        summary: concat!("No ", product::name!(), " replica can be scraped"),
        description: concat!(
            "Prometheus has scraped no ",
            product::name!(),
            " replica for a minute: the Memcached and MyApp resources are not reconciled."
        ),
    },
    Alert {
        name: "OperatorManagerNoLeader",
        expr: r#"max by (name) (leader_election_master_status{job="$JOB"}) < 1"#,
        for_: "5m",
        severity: "critical",
        summary: concat!("No ", product::name!(), " replica leads"),
        description: "Replicas of $NAME run, but none has held the Lease {{ $labels.name }} for five minutes: nothing reconciles.",
    },
    Alert {
        name: "OperatorManagerReconcileErrors",
        expr: r#"sum by (controller) (rate(controller_runtime_reconcile_errors_total{job="$JOB"}[5m])) / sum by (controller) (rate(controller_runtime_reconcile_total{job="$JOB"}[5m])) > 0.1"#,
        for_: "10m",
        severity: "warning",
        summary: "Reconciles of {{ $labels.controller }} keep failing",
        description: "More than one in ten reconciles of {{ $labels.controller }} failed over the last ten minutes; its ReconcileFailed Events say why.",
    },
    Alert {
        name: "OperatorManagerReconcilePanics",
        expr: r#"increase(controller_runtime_reconcile_panics_total{job="$JOB"}[10m]) > 0"#,
        for_: "0m",
        severity: "warning",
        summary: "A reconcile of {{ $labels.controller }} panicked",
        description: "A reconcile of {{ $labels.controller }} panicked in the last ten minutes (it is retried); the manager's log has the message.",
    },
    Alert {
        name: "OperatorManagerWebhookErrors",
        expr: r#"sum by (webhook) (rate(controller_runtime_webhook_requests_total{job="$JOB",code!~"2.."}[5m])) / sum by (webhook) (rate(controller_runtime_webhook_requests_total{job="$JOB"}[5m])) > 0.05"#,
        for_: "10m",
        severity: "warning",
        summary: "The {{ $labels.webhook }} webhook fails requests",
        description: "More than one in twenty requests to the {{ $labels.webhook }} webhook got an error answer over the last ten minutes: with failurePolicy Fail, the API server refuses the writes it guards. The manager's log says why (too many reviews at once, bodies too large or too slow, a panicking rule).",
    },
    Alert {
        name: "OperatorManagerWorkQueueBacklog",
        expr: r#"sum by (name) (workqueue_depth{job="$JOB"}) > 100"#,
        for_: "15m",
        severity: "warning",
        summary: "The {{ $labels.name }} work queue is backing up",
        description: "More than 100 objects have waited in the {{ $labels.name }} queue for fifteen minutes: the controller falls behind (raise --max-concurrent-reconciles, or look for slow reconciles).",
    },
    Alert {
        name: "OperatorManagerStuckReconcile",
        expr: r#"max by (name) (workqueue_longest_running_processor_seconds{job="$JOB"}) > 300"#,
        for_: "5m",
        severity: "warning",
        summary: "A {{ $labels.name }} reconcile has run for over five minutes",
        description: "A reconcile of {{ $labels.name }} has been running for more than five minutes; it is probably stuck on a request that never returns.",
    },
];

pub(crate) fn render() -> Result<Vec<GeneratedFile>, Error> {
    let dashboards = [
        (
            "controller-runtime-metrics",
            concat!(product::name!(), ": controller-runtime"),
            RUNTIME_PANELS,
        ),
        (
            "controller-resources-metrics",
            concat!(product::name!(), ": resources"),
            RESOURCE_PANELS,
        ),
    ]
    .map(|(name, title, panels)| dashboard_config_map(name, title, panels));
    let path = "grafana/dashboards.yaml";
    let rule_path = "prometheus/prometheus_rule.yaml";
    Ok(vec![
        GeneratedFile {
            path: PathBuf::from(path),
            contents: yaml::render_documents(Path::new(path), &dashboards)?,
        },
        GeneratedFile {
            path: PathBuf::from(rule_path),
            contents: yaml::render_documents(Path::new(rule_path), &[prometheus_rule()])?,
        },
    ])
}

/// A ConfigMap holding one dashboard's JSON as `<name>.json`.
fn dashboard_config_map(name: &str, title: &str, panels: &[Panel]) -> Value {
    let mut labels = labels();
    labels.insert(DASHBOARD_LABEL.0.to_owned(), DASHBOARD_LABEL.1.to_owned());
    let json = serde_json::to_string_pretty(&dashboard(name, title, panels)).unwrap_or_default();
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": format!("{MANAGER_NAME}-{name}"),
            "namespace": NAMESPACE,
            "labels": labels,
        },
        "data": {format!("{name}.json"): json},
    })
}

fn dashboard(uid: &str, title: &str, panels: &[Panel]) -> Value {
    let datasource = json!({"type": "prometheus", "uid": "${datasource}"});
    let panels: Vec<Value> = panels
        .iter()
        .enumerate()
        .map(|(index, panel)| {
            let targets: Vec<Value> = panel
                .queries
                .iter()
                .zip('A'..='Z')
                .map(|((expr, legend), ref_id)| {
                    json!({
                        "datasource": datasource,
                        "expr": expr,
                        "legendFormat": legend,
                        "refId": ref_id.to_string(),
                    })
                })
                .collect();
            let (x, y) = ((index % 2) * 12, (index / 2) * 8);
            json!({
                "id": index + 1,
                "type": "timeseries",
                "title": panel.title,
                "datasource": datasource,
                "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
                "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
                "targets": targets,
            })
        })
        .collect();
    json!({
        "uid": uid,
        "title": title,
        "tags": [product::name!(), "controller-runtime"],
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": [
            {
                "name": "datasource",
                "type": "datasource",
                "query": "prometheus",
                "label": "Data source",
            },
            {
                "name": "job",
                "type": "query",
                "datasource": datasource,
                "query": "label_values(controller_runtime_reconcile_total, job)",
                "definition": "label_values(controller_runtime_reconcile_total, job)",
                "current": {"text": JOB, "value": JOB},
                "refresh": 2,
                "label": "Job",
            },
        ]},
        "panels": panels,
    })
}

fn prometheus_rule() -> Value {
    let rules: Vec<Value> = ALERTS
        .iter()
        .map(|alert| {
            json!({
                "alert": alert.name,
                "expr": named(alert.expr),
                "for": alert.for_,
                "labels": {"severity": alert.severity},
                "annotations": {
                    "summary": named(alert.summary),
                    "description": named(alert.description),
                },
            })
        })
        .collect();
    json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": MANAGER_NAME, "namespace": NAMESPACE, "labels": labels()},
        "spec": {"groups": [{"name": product::name!(), "rules": rules}]},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_panel_reads_a_series_the_manager_serves_and_every_alert_names_its_job() {
        for panel in RUNTIME_PANELS.iter().chain(RESOURCE_PANELS) {
            for (expr, _) in panel.queries {
                assert!(expr.contains(r#"{job="$job"}"#), "{}: {expr}", panel.title);
            }
        }
        for alert in ALERTS {
            assert!(
                named(alert.expr).contains(&format!(r#"job="{JOB}""#)),
                "{}",
                alert.name
            );
        }
    }

    #[test]
    fn the_dashboards_are_json_inside_labelled_config_maps() {
        let files = render().expect("rendered");
        let text = files[0].contents.clone();
        let maps: Vec<yaml_serde::Value> = text
            .split("\n---\n")
            .map(|doc| yaml_serde::from_str(doc).expect("YAML"))
            .collect();
        assert_eq!(maps.len(), 2);
        for map in maps {
            assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
            let data = map["data"].as_mapping().expect("data");
            let (_, json) = data.iter().next().expect("one dashboard");
            let dashboard: Value =
                serde_json::from_str(json.as_str().expect("text")).expect("JSON");
            assert!(!dashboard["panels"].as_array().expect("panels").is_empty());
        }
    }
}
