//! The generated dashboards and alerts, proven on real data: a real Prometheus scrapes a
//! running manager over HTTPS with a ServiceAccount token bound to the generated metrics-reader
//! ClusterRole, real reconciles run, and then every dashboard query and every alert is
//! evaluated through Prometheus's HTTP API. Stopping the manager fires `OperatorManagerDown`.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use apis::{Memcached, MemcachedSpec};
use kube::api::{Api, PostParams};
use serde_json::Value;
use testkit::TestNamespace;

/// The scrape job a ServiceMonitor of the metrics Service gives the manager, which the
/// generated alerts and dashboards select.
const JOB: &str = concat!(product::name!(), "-metrics");

/// How long anything may take on a loaded two-core machine.
const TIMEOUT: Duration = Duration::from_secs(120);

/// Every `expr` of every panel of the generated dashboards (`deploy/grafana`), with its panel.
fn dashboard_queries() -> Result<Vec<(String, String)>> {
    let path = testkit::deploy_dir()
        .join("grafana")
        .join("dashboards.yaml");
    let mut queries = Vec::new();
    for map in testkit::read_yaml_file(&path)? {
        let data = map.data["data"].as_object().context("a ConfigMap's data")?;
        for json in data.values() {
            let dashboard: Value = serde_json::from_str(json.as_str().unwrap_or_default())?;
            for panel in dashboard["panels"].as_array().context("panels")? {
                for target in panel["targets"].as_array().context("targets")? {
                    let title = panel["title"].as_str().unwrap_or_default().to_owned();
                    let expr = target["expr"].as_str().context("expr")?;
                    // What Grafana does with the dashboard's `job` variable.
                    queries.push((title, expr.replace("$job", JOB)));
                }
            }
        }
    }
    ensure!(
        !queries.is_empty(),
        "no panel queries in {}",
        path.display()
    );
    Ok(queries)
}

/// The generated PrometheusRule's groups as a Prometheus rule file in `dir`, and its alerts'
/// names and expressions.
fn rule_file(dir: &Path) -> Result<(std::path::PathBuf, Vec<(String, String)>)> {
    let path = testkit::deploy_dir()
        .join("prometheus")
        .join("prometheus_rule.yaml");
    let rule = testkit::read_yaml_file(&path)?
        .into_iter()
        .next()
        .with_context(|| format!("a PrometheusRule in {}", path.display()))?;
    let groups = rule.data["spec"]["groups"].clone();
    let alerts = groups
        .as_array()
        .context("groups")?
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .map(|r| {
            (
                r["alert"].as_str().unwrap_or_default().to_owned(),
                r["expr"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let file = dir.join("rules.json");
    // A rule file is YAML; JSON is YAML.
    std::fs::write(&file, serde_json::json!({ "groups": groups }).to_string())?;
    Ok((file, alerts))
}

#[tokio::test]
async fn every_dashboard_query_has_data_every_alert_is_valid_and_a_stopped_manager_is_alerted()
-> Result<()> {
    let cluster = testkit::cluster().await?;
    let identity = testkit::manager_kubeconfig(&cluster, &testkit::deploy_dir()).await?;
    let ns = TestNamespace::create(&cluster, "monitoring").await?;
    let dir = std::env::temp_dir().join(testkit::unique_name("monitoring"));
    std::fs::create_dir_all(&dir)?;
    let (rules, alerts) = rule_file(&dir)?;
    let queries = dashboard_queries()?;

    let port = testkit::free_port()?;
    let lease = testkit::unique_name("monitoring-lease");
    // Webhooks served with a certificate of the test's own, so that their series exist
    // without the manager provisioning anything in the shared cluster.
    let webhook_port = testkit::free_port_other_than(&[port])?;
    let webhook_certs = dir.join("webhook-certs");
    std::fs::create_dir_all(&webhook_certs)?;
    let generated = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()])?;
    std::fs::write(webhook_certs.join("tls.crt"), generated.cert.pem())?;
    std::fs::write(
        webhook_certs.join("tls.key"),
        generated.signing_key.serialize_pem(),
    )?;
    let mut manager = testkit::spawn_manager(
        &identity.path,
        &[
            &format!("--metrics-bind-address=127.0.0.1:{port}"),
            "--metrics-secure",
            &format!("--webhook-bind-address=127.0.0.1:{webhook_port}"),
            &format!("--webhook-cert-path={}", webhook_certs.display()),
            "--health-probe-bind-address=0",
            "--leader-elect",
            &format!("--leader-election-id={lease}"),
            &format!("--leader-election-namespace={}", identity.namespace),
        ],
        &[],
    )
    .await?;
    let prometheus =
        testkit::Prometheus::start_static(&cluster, JOB, &format!("127.0.0.1:{port}"), &rules)
            .await?;
    let result = async {
        // Real reconciles.
        let memcacheds = Api::<Memcached>::namespaced(cluster.client.clone(), ns.name());
        for name in ["first", "second"] {
            let mc = Memcached::new(
                name,
                MemcachedSpec {
                    size: 1,
                    image: apis::memcached::DEFAULT_IMAGE.to_owned(),
                    ..Default::default()
                },
            );
            memcacheds.create(&PostParams::default(), &mc).await?;
        }

        for (title, expr) in &queries {
            testkit::wait_for(&format!("data for {title:?}: {expr}"), TIMEOUT, || async {
                match prometheus.query(expr).await {
                    Ok(series) if !series.is_empty() => Ok(()),
                    Ok(_) => Err("no series yet".to_owned()),
                    Err(e) => Err(e.to_string()),
                }
            })
            .await?;
        }
        println!("all {} dashboard queries return data", queries.len());

        for (name, expr) in &alerts {
            prometheus
                .query(expr)
                .await
                .with_context(|| format!("alert {name}: {expr}"))?;
        }
        testkit::wait_for("every alerting rule to be evaluated", TIMEOUT, || async {
            let loaded = prometheus.rules().await.map_err(|e| e.to_string())?;
            let healthy = alerts.iter().all(|(name, _)| {
                loaded
                    .iter()
                    .any(|(n, health, _)| n == name && health == "ok")
            });
            if healthy {
                Ok(())
            } else {
                Err(format!("{loaded:?}"))
            }
        })
        .await?;
        let firing = prometheus.alerts().await?;
        ensure!(
            firing.is_empty(),
            "nothing alerts while the manager runs: {firing:?}"
        );
        println!("all {} alerts are valid and quiet", alerts.len());

        manager.terminate();
        let down = std::time::Instant::now();
        testkit::wait_for("OperatorManagerDown to fire", TIMEOUT, || async {
            let alerts = prometheus.alerts().await.map_err(|e| e.to_string())?;
            if alerts
                .iter()
                .any(|(name, state)| name == "OperatorManagerDown" && state == "firing")
            {
                Ok(())
            } else {
                Err(format!("{alerts:?}"))
            }
        })
        .await?;
        println!(
            "OperatorManagerDown fired {:.0}s after the manager stopped",
            down.elapsed().as_secs_f64()
        );
        Ok(())
    }
    .await;
    manager.terminate();
    if manager
        .wait_timeout(Duration::from_secs(30))
        .await?
        .is_none()
    {
        manager.kill().await?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    result.with_context(|| {
        format!(
            "Prometheus log: {}\nmanager log:\n{}",
            prometheus.log().display(),
            manager.log_text()
        )
    })
}
