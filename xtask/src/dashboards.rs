//! `cargo xtask dashboards`: the generated Grafana dashboards as pictures, drawn from a real run.
//!
//! The release manager runs against the local cluster with the generated RBAC, leader election,
//! its metrics served over HTTPS and its admission webhooks registered (the generated
//! configurations, calling it at its loopback address, for one namespace only). A real
//! Prometheus scrapes it every 2 s with a token the API server authenticates, as the generated
//! ServiceMonitor has it. Memcacheds are created in that namespace and resized one after another
//! for five minutes (the dashboards' rate window) and then `--minutes` more, now and then with
//! a change the validating webhook refuses. Then every panel's queries are asked of Prometheus
//! over those last minutes (`query_range`, with the dashboard's `$job` set
//! as Grafana sets it) and each panel is drawn as an SVG into `docs/book/src/dashboards/`, named
//! after its dashboard and title ([`Panel::file_name`]), which the book's metrics page shows.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use apis::{Memcached, MemcachedSpec};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::Value;
use testkit::{Prometheus, TestCluster, TestNamespace};

use crate::bench::plot::{Chart, Scale, Series, XScale};

/// The scrape job a ServiceMonitor of the metrics Service gives the manager, which the
/// dashboards select with their `job` variable.
const JOB: &str = concat!(product::name!(), "-metrics");
/// Where the pictures go, relative to the workspace root.
pub const OUTPUT: &str = "docs/book/src/dashboards";
/// The generated dashboards.
const DASHBOARDS: &str = "deploy/grafana/dashboards.yaml";
/// The Memcacheds resized during the run.
const MEMCACHEDS: usize = 10;
/// One resize every this often, round the Memcacheds.
const RESIZE_EVERY: Duration = Duration::from_millis(500);
/// Every this many changes, one the validating webhook refuses.
const REFUSED_EVERY: usize = 20;
/// The dashboards' rate window: the workload runs this long before the drawn part, so that
/// every rate drawn covers the workload alone.
const WARM_UP: Duration = Duration::from_secs(5 * 60);
/// The resolution of the pictures: a point every this often.
const STEP: Duration = Duration::from_secs(5);
/// The most lines a panel shows; the rest, the smallest, are counted under its title.
const MOST_SERIES: usize = 8;
/// The longest legend entry, in characters; longer ones lose their middle.
const LEGEND_CHARS: usize = 30;
/// Lines, in the order a panel's series get them.
const PALETTE: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// `cargo xtask dashboards`' options.
#[derive(Debug, Clone, clap::Args)]
pub struct DashboardsArgs {
    /// How many minutes of the run are drawn, after five minutes that fill the dashboards'
    /// rate windows.
    #[arg(long, default_value_t = 5)]
    pub minutes: u64,
    /// The directory the pictures are written to.
    #[arg(long, default_value = OUTPUT)]
    pub output: PathBuf,
}

/// A line's `(seconds into the drawn part, value)`, `None` where it has no number.
type Points = Vec<(f64, Option<f64>)>;

/// One panel of a generated dashboard: what it queries and how its values read.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// The dashboard's `uid` and title.
    pub dashboard_uid: String,
    pub dashboard: String,
    pub title: String,
    /// Grafana's unit of the values (`s`, `bytes`, `ops`, `reqps`, `short`).
    pub unit: String,
    /// Each query, with `$job` as in the dashboard, and its legend format.
    pub targets: Vec<(String, String)>,
}

impl Panel {
    /// `<dashboard uid>-<title in lower case, words joined by dashes>.svg`.
    pub fn file_name(&self) -> String {
        format!("{}-{}.svg", self.dashboard_uid, slug(&self.title))
    }

    /// The y axis' label, and the factor values are shown multiplied by.
    fn axis(&self) -> (&'static str, f64) {
        match self.unit.as_str() {
            "s" => ("seconds", 1.0),
            "bytes" => ("MiB", 1.0 / 1024.0 / 1024.0),
            "ops" | "reqps" => ("per second", 1.0),
            _ => ("", 1.0),
        }
    }
}

/// Every panel of the dashboards in `path` (the generated ConfigMaps), in order.
///
/// # Errors
/// When the file cannot be read, or a dashboard is not what the generator writes.
pub fn panels(path: &Path) -> anyhow::Result<Vec<Panel>> {
    let mut panels = Vec::new();
    for map in testkit::read_yaml_file(path)? {
        let data = map.data["data"]
            .as_object()
            .with_context(|| format!("a ConfigMap without data in {}", path.display()))?;
        for json in data.values() {
            let dashboard: Value = serde_json::from_str(json.as_str().unwrap_or_default())
                .with_context(|| format!("a dashboard of {}", path.display()))?;
            let text = |value: &Value| value.as_str().unwrap_or_default().to_owned();
            for panel in dashboard["panels"]
                .as_array()
                .context("a dashboard's panels")?
            {
                let targets = panel["targets"]
                    .as_array()
                    .context("a panel's targets")?
                    .iter()
                    .map(|t| (text(&t["expr"]), text(&t["legendFormat"])))
                    .collect();
                panels.push(Panel {
                    dashboard_uid: text(&dashboard["uid"]),
                    dashboard: text(&dashboard["title"]),
                    title: text(&panel["title"]),
                    unit: text(&panel["fieldConfig"]["defaults"]["unit"]),
                    targets,
                });
            }
        }
    }
    if panels.is_empty() {
        bail!("no panels in {}", path.display());
    }
    Ok(panels)
}

/// Runs the workload, then draws every panel.
///
/// # Errors
/// When the manager cannot be built or started, the cluster or Prometheus fails, or a picture
/// cannot be written.
pub fn run(args: &DashboardsArgs) -> anyhow::Result<()> {
    let root = crate::workspace_root();
    let panels = panels(&root.join(DASHBOARDS))?;
    let binary = crate::bench::build_release_manager()?;
    let output = root.join(&args.output);
    std::fs::create_dir_all(&output).with_context(|| format!("creating {}", output.display()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let minutes = args.minutes;
    runtime.block_on(async move {
        let cluster = testkit::cluster().await?;
        let ns = TestNamespace::create(&cluster, "dashboards").await?;
        let result = draw_from_a_run(&cluster, &ns, &binary, &panels, minutes, &output).await;
        let removed = remove_webhook_configurations(&cluster).await;
        ns.delete().await?;
        result.and(removed)
    })
}

async fn draw_from_a_run(
    cluster: &TestCluster,
    ns: &TestNamespace,
    binary: &Path,
    panels: &[Panel],
    minutes: u64,
    output: &Path,
) -> anyhow::Result<()> {
    let identity = testkit::manager_kubeconfig(cluster, &testkit::deploy_dir()).await?;
    let dir = tempfile::tempdir().context("a directory for the run's files")?;
    let metrics_port = testkit::free_port()?;
    let webhook_port = testkit::free_port_other_than(&[metrics_port])?;
    // The webhooks and the secure metrics are served with a certificate of the run's own, which
    // the webhook configurations trust; nothing is provisioned in the cluster.
    let certs = dir.path().join("certs");
    std::fs::create_dir_all(&certs)?;
    let generated = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()])
        .context("a certificate for the webhooks")?;
    std::fs::write(certs.join("tls.crt"), generated.cert.pem())?;
    std::fs::write(certs.join("tls.key"), generated.signing_key.serialize_pem())?;
    install_webhook_configurations(cluster, ns, webhook_port, generated.cert.pem()).await?;
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, "groups: []\n")?;

    let lease = format!(
        "--leader-election-id={}",
        testkit::unique_name("dashboards")
    );
    let mut manager = testkit::spawn_manager_binary(
        binary,
        &identity.path,
        &[
            &format!("--metrics-bind-address=127.0.0.1:{metrics_port}"),
            "--metrics-secure",
            &format!("--webhook-bind-address=127.0.0.1:{webhook_port}"),
            &format!("--webhook-cert-path={}", certs.display()),
            "--health-probe-bind-address=0",
            "--leader-elect",
            &lease,
            &format!("--leader-election-namespace={}", identity.namespace),
        ],
        &[],
    )
    .await?;
    let target = format!("127.0.0.1:{metrics_port}");
    let drawn = async {
        let prometheus = Prometheus::start_static(cluster, JOB, &target, &rules).await?;
        let shown = Duration::from_secs(minutes * 60);
        println!(
            "resizing {MEMCACHEDS} Memcacheds in {} for {} minutes, scraped by Prometheus \
             every 2 s; the last {minutes} are drawn",
            ns.name(),
            (WARM_UP + shown).as_secs() / 60,
        );
        let start = unix_now() + WARM_UP.as_secs_f64();
        resize_for(cluster, ns, WARM_UP + shown).await?;
        let end = unix_now();
        for panel in panels {
            let chart = chart(&prometheus, panel, start, end, minutes).await?;
            let file = output.join(panel.file_name());
            std::fs::write(&file, crate::bench::plot::render(&chart))
                .with_context(|| format!("writing {}", file.display()))?;
            println!("{}", file.display());
        }
        anyhow::Ok(())
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
    drawn.with_context(|| format!("the manager's log: {}", manager.log().display()))
}

/// The generated webhook configurations, calling `https://127.0.0.1:port` with `ca` trusted,
/// for `ns` only.
async fn install_webhook_configurations(
    cluster: &TestCluster,
    ns: &TestNamespace,
    port: u16,
    ca: String,
) -> anyhow::Result<()> {
    let (mut mutating, mut validating) =
        codegen::webhook_configurations(&codegen::WebhookTarget::Url {
            base: format!("https://127.0.0.1:{port}"),
        })?;
    codegen::limit_to_namespace(&mut mutating, &mut validating, ns.name(), Some(&ca));
    let apply = PatchParams::apply("xtask-dashboards").force();
    Api::<MutatingWebhookConfiguration>::all(cluster.client.clone())
        .patch(
            product::MUTATING_CONFIGURATION,
            &apply,
            &Patch::Apply(&mutating),
        )
        .await
        .context("registering the mutating webhooks")?;
    Api::<ValidatingWebhookConfiguration>::all(cluster.client.clone())
        .patch(
            product::VALIDATING_CONFIGURATION,
            &apply,
            &Patch::Apply(&validating),
        )
        .await
        .context("registering the validating webhooks")?;
    Ok(())
}

async fn remove_webhook_configurations(cluster: &TestCluster) -> anyhow::Result<()> {
    let gone = |result: Result<_, kube::Error>| match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(anyhow::Error::from(e).context("removing the webhook configurations")),
    };
    let delete = DeleteParams::default();
    gone(
        Api::<MutatingWebhookConfiguration>::all(cluster.client.clone())
            .delete(product::MUTATING_CONFIGURATION, &delete)
            .await
            .map(|_| ()),
    )?;
    gone(
        Api::<ValidatingWebhookConfiguration>::all(cluster.client.clone())
            .delete(product::VALIDATING_CONFIGURATION, &delete)
            .await
            .map(|_| ()),
    )
}

/// Creates the Memcacheds, then resizes them one after another, every [`RESIZE_EVERY`], for
/// `duration`; every [`REFUSED_EVERY`]th change is one the validating webhook refuses.
async fn resize_for(
    cluster: &TestCluster,
    ns: &TestNamespace,
    duration: Duration,
) -> anyhow::Result<()> {
    let api: Api<Memcached> = Api::namespaced(cluster.client.clone(), ns.name());
    let names: Vec<String> = (0..MEMCACHEDS).map(|i| format!("memcached-{i}")).collect();
    // The webhooks may take a moment to be called once registered and served.
    for name in &names {
        let memcached = Memcached::new(
            name,
            MemcachedSpec {
                size: 1,
                image: apis::memcached::DEFAULT_IMAGE.to_owned(),
                ..Default::default()
            },
        );
        testkit::wait_for(
            &format!("the webhooks to admit {name}"),
            Duration::from_secs(60),
            || async { api.create(&PostParams::default(), &memcached).await },
        )
        .await?;
    }
    let started = std::time::Instant::now();
    let mut resizes = 0usize;
    while started.elapsed() < duration {
        let name = &names[resizes % names.len()];
        let refused = resizes % REFUSED_EVERY == REFUSED_EVERY - 1;
        let spec = if refused {
            // Less memory for items than the validating webhook admits.
            serde_json::json!({"memory": "512Ki"})
        } else {
            serde_json::json!({"size": 1 + resizes / names.len() % 3})
        };
        let patch = Patch::Merge(serde_json::json!({ "spec": spec }));
        match api.patch(name, &PatchParams::default(), &patch).await {
            Ok(_) if refused => bail!("the validating webhook admitted {spec} for {name}"),
            Err(error) if !refused => {
                return Err(error).with_context(|| format!("changing {name} to {spec}"));
            }
            _ => {}
        }
        resizes += 1;
        tokio::time::sleep(RESIZE_EVERY).await;
    }
    println!("made {resizes} size changes");
    Ok(())
}

/// The panel's series over `[start, end]`, as a chart.
async fn chart(
    prometheus: &Prometheus,
    panel: &Panel,
    start: f64,
    end: f64,
    minutes: u64,
) -> anyhow::Result<Chart> {
    let (y_label, factor) = panel.axis();
    // Each line's legend and its points.
    let mut series: Vec<(String, Points)> = Vec::new();
    for (expr, legend) in &panel.targets {
        let query = expr.replace("$job", JOB);
        let results = prometheus
            .query_range(&query, start, end, STEP)
            .await
            .with_context(|| format!("{:?}: {query}", panel.title))?;
        for (labels, samples) in results {
            let points = samples
                .into_iter()
                .map(|(t, v)| (t - start, Some(v * factor).filter(|v| v.is_finite())))
                .collect();
            series.push((legend_of(legend, &labels), points));
        }
    }
    let peak = |points: &Points| {
        points
            .iter()
            .filter_map(|(_, v)| *v)
            .fold(f64::NEG_INFINITY, f64::max)
    };
    let all = series.len();
    // Lines at zero, or without data, throughout say nothing beside the others; a panel with
    // nothing else (no errors, say) shows its zeros.
    let moving: Vec<_> = series
        .iter()
        .filter(|(_, points)| points.iter().any(|(_, v)| v.is_some_and(|v| v != 0.0)))
        .cloned()
        .collect();
    if moving.is_empty() {
        series.retain(|(_, points)| points.iter().any(|(_, v)| v.is_some()));
    } else {
        series = moving;
    }
    series.sort_by(|a, b| peak(&b.1).total_cmp(&peak(&a.1)).then(a.0.cmp(&b.0)));
    series.truncate(MOST_SERIES);
    series.sort_by(|a, b| a.0.cmp(&b.0));
    let mut subtitle = vec![format!(
        "{}: {MEMCACHEDS} Memcacheds resized every {} ms, {minutes} minutes, scraped every 2 s",
        panel.dashboard,
        RESIZE_EVERY.as_millis()
    )];
    if series.len() < all {
        let lowest = if series.len() == MOST_SERIES {
            ", or are the lowest"
        } else {
            ""
        };
        subtitle.push(format!(
            "{} of {all} lines: the rest stay at zero or have no data{lowest}",
            series.len()
        ));
    }
    // Every other line dashed, the top one first, so that a line exactly under another (the
    // mutating and validating webhooks, called once each per write) still shows.
    let many = series.len() > 1;
    let dashed = |index: usize| many && index.is_multiple_of(2);
    Ok(Chart {
        file: "",
        title: panel.title.clone(),
        subtitle,
        footer: vec![format!(
            "Prometheus query_range, a point every {} s; the dashboard's job is {JOB}",
            STEP.as_secs()
        )],
        y_label: y_label.to_owned(),
        y_scale: Scale::Linear,
        x_scale: XScale::Seconds,
        rule: None,
        series: series
            .into_iter()
            .enumerate()
            .map(|(index, (name, points))| Series {
                name: shortened(&name),
                color: PALETTE[index % PALETTE.len()],
                dashed: dashed(index),
                marker: None,
                points,
            })
            .collect(),
    })
}

/// Grafana's legend format: each `{{label}}` replaced by the series' value of it.
fn legend_of(format: &str, labels: &Value) -> String {
    let mut legend = String::new();
    let mut rest = format;
    while let Some(open) = rest.find("{{") {
        legend.push_str(&rest[..open]);
        let Some(close) = rest[open..].find("}}") else {
            break;
        };
        let name = rest[open + 2..open + close].trim();
        legend.push_str(labels[name].as_str().unwrap_or_default());
        rest = &rest[open + close + 2..];
    }
    legend.push_str(rest);
    let legend = legend.trim().to_owned();
    if legend.is_empty() {
        // No format: the labels, as Prometheus prints them.
        labels.to_string()
    } else {
        legend
    }
}

/// `legend` in at most [`LEGEND_CHARS`] characters: a longer one keeps its start and its end.
fn shortened(legend: &str) -> String {
    let chars: Vec<char> = legend.chars().collect();
    if chars.len() <= LEGEND_CHARS {
        return legend.to_owned();
    }
    let end_keep = (LEGEND_CHARS - 1) / 2;
    let start: String = chars[..LEGEND_CHARS - 1 - end_keep].iter().collect();
    let end: String = chars[chars.len() - end_keep..].iter().collect();
    format!("{start}…{end}")
}

/// `title` in lower case, its words joined by dashes.
fn slug(title: &str) -> String {
    title
        .to_lowercase()
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_panel_has_its_picture_in_the_book() {
        let root = crate::workspace_root();
        let panels = panels(&root.join(DASHBOARDS)).unwrap();
        let page = std::fs::read_to_string(root.join("docs/book/src/metrics.md")).unwrap();
        let mut missing = Vec::new();
        for panel in &panels {
            let file = panel.file_name();
            let svg = std::fs::read_to_string(root.join(OUTPUT).join(&file)).unwrap_or_default();
            if !svg.contains(&format!("<title id=\"title\">{}</title>", panel.title))
                || !page.contains(&format!("dashboards/{file}"))
            {
                missing.push(file);
            }
        }
        assert!(
            missing.is_empty(),
            "run `cargo xtask dashboards` and show each picture in metrics.md: {missing:?}"
        );
    }

    #[test]
    fn legends_follow_grafanas_format() {
        let labels = serde_json::json!({"controller": "memcached", "result": "success"});
        assert_eq!(
            legend_of("{{controller}} {{result}}", &labels),
            "memcached success"
        );
        assert_eq!(legend_of("{{ controller }} p99", &labels), "memcached p99");
        assert_eq!(legend_of("errors", &labels), "errors");
        assert_eq!(legend_of("", &serde_json::json!({})), "{}");
    }

    #[test]
    fn long_legends_keep_their_start_and_end() {
        assert_eq!(shortened("memcached p99"), "memcached p99");
        let webhook = "/validate-cache-example-com-v1beta1-memcached 403";
        let short = shortened(webhook);
        assert_eq!(short.chars().count(), LEGEND_CHARS);
        assert!(short.starts_with("/validate-cac") && short.ends_with("memcached 403"));
    }

    #[test]
    fn file_names_are_the_dashboard_and_the_title() {
        let panel = Panel {
            dashboard_uid: "controller-runtime-metrics".into(),
            dashboard: "operator-manager: controller-runtime".into(),
            title: "Reconcile time (p50, p90, p99)".into(),
            unit: "s".into(),
            targets: Vec::new(),
        };
        assert_eq!(
            panel.file_name(),
            "controller-runtime-metrics-reconcile-time-p50-p90-p99.svg"
        );
        assert_eq!(panel.axis(), ("seconds", 1.0));
    }
}
