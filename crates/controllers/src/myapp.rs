//! The MyApp controller: for every `MyApp`, a Deployment of `spec.replicas` pods running
//! `spec.image`, kept exactly as specified.
//!
//! # Watches
//! - `MyApp` objects (its own watch): new ones, spec changes and deletions;
//! - Deployments, from the cache shared with the Memcached controller, mapped to the `MyApp`
//!   that controls them (or to the `MyApp` of the same name, which reports the clash).
//!
//! # Reconcile
//! As for Memcached: a foreign Deployment of the same name is left untouched and reported
//! (`Degraded`, `DeploymentNotOwned`, Warning Event); otherwise the desired Deployment is
//! server-side applied with force. Every change to an owned Deployment triggers a reconcile, so
//! a hand edit of a field this controller sets (the image, the replica count, the security
//! context) is undone at once. Status: `replicas`, `readyReplicas`, `observedGeneration` and the
//! conditions, written only when changed (a state the rollout passes through waits up to
//! [`crate::workload::PROGRESS_HOLD`] for the next).

use std::collections::BTreeMap;
use std::sync::Arc;

use apis::{MyApp, MyAppStatus};
use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Controller;
use kube::runtime::reflector;

use crate::driver::{Driver, Outcome};
use crate::events::{EVENTS_FLUSH, Events};
use crate::memcached::FOREIGN_RECHECK;
use crate::owned::{self, DeploymentOwner, Ensured, OwnedDeployments};
use crate::rbac::{self, MANAGE, STATUS};
use crate::status::{self, Rollout, merge_conditions, not_owned_conditions};
use crate::workload::{StatusWrite, StatusWriter, WithStatus};
use crate::{Error, ManagedController, PolicyRule, RunContext, labels};

/// The controller's name: metrics label, configuration key, log field.
pub const NAME: &str = "myapp";
/// The server-side apply field manager of the Deployments this controller writes.
pub const FIELD_MANAGER: &str = "operator-manager/myapp";
/// The value of `app.kubernetes.io/name` on the Deployment and its pods.
pub const APP: &str = "myapp";
/// The application container's name.
pub const CONTAINER: &str = "app";
/// The numeric user the application runs as (the common "nonroot" user of distroless images):
/// the `restricted` Pod Security Standard needs a non-root user the kubelet can verify, and an
/// arbitrary image's user is unknown. Images must tolerate an arbitrary non-root user, as on
/// OpenShift.
pub const RUN_AS_USER: i64 = 65532;

const KIND: &str = "MyApp";

static RULES: [PolicyRule; 6] = [
    PolicyRule {
        api_groups: &["myscheme.example.com"],
        resources: &["myapps"],
        verbs: MANAGE,
    },
    PolicyRule {
        api_groups: &["myscheme.example.com"],
        resources: &["myapps/status"],
        verbs: STATUS,
    },
    PolicyRule {
        api_groups: &["myscheme.example.com"],
        resources: &["myapps/finalizers"],
        verbs: &["update"],
    },
    rbac::DEPLOYMENTS,
    rbac::EVENTS[0],
    rbac::EVENTS[1],
];

/// The MyApp controller, as registered in [`crate::all`].
#[derive(Clone, Copy, Debug, Default)]
pub struct MyAppController;

impl ManagedController for MyAppController {
    fn name(&self) -> &'static str {
        NAME
    }

    fn rbac_rules(&self) -> &'static [PolicyRule] {
        &RULES
    }

    fn run(&self, ctx: RunContext) -> BoxFuture<'static, Result<(), Error>> {
        Box::pin(run(ctx))
    }
}

struct Context {
    status: StatusWriter<MyApp>,
    events: Events,
    deployments: OwnedDeployments,
}

async fn run(ctx: RunContext) -> Result<(), Error> {
    let deployments = ctx.watches.deployments();
    let unmanaged = ctx.watches.unmanaged_deployments();
    if !deployments.ready(&ctx.shutdown).await? || !unmanaged.ready(&ctx.shutdown).await? {
        return Ok(());
    }
    let driver = Driver::<MyApp>::new(NAME, &ctx);
    let (reader, writer) = reflector::store();
    let resources = driver.watch_resources(Api::all(ctx.client.clone()), writer);
    let by_deployment = owned::deployment_triggers(reader.clone(), &deployments, &unmanaged);
    let controller =
        Controller::for_stream(resources, reader).reconcile_on(driver.track(by_deployment));
    let (events, publisher) = Events::start(ctx.client.clone(), NAME, &ctx.options.instance);
    let context = Arc::new(Context {
        status: StatusWriter::new(ctx.client.clone()),
        events,
        deployments: OwnedDeployments::new(
            ctx.client.clone(),
            deployments.store(),
            unmanaged.store(),
            FIELD_MANAGER,
        ),
    });
    let result = driver.run(controller, reconcile, context).await;
    publisher.finish(EVENTS_FLUSH).await;
    result
}

/// The labels that select a `MyApp`'s pods.
pub fn selector_labels(myapp_name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::NAME.to_owned(), APP.to_owned()),
        (labels::INSTANCE.to_owned(), labels::label_value(myapp_name)),
    ])
}

/// Every label of the Deployment and its pods.
pub fn object_labels(myapp_name: &str) -> BTreeMap<String, String> {
    let mut all = selector_labels(myapp_name);
    all.extend([
        (labels::MANAGED_BY.to_owned(), labels::MANAGER.to_owned()),
        (labels::PART_OF.to_owned(), labels::PLATFORM.to_owned()),
    ]);
    all
}

/// The Deployment a `MyApp` asks for.
///
/// # Errors
/// [`Error::MissingField`] when `app` lacks a namespace or uid (it was not read from the server).
pub fn desired_deployment(app: &MyApp) -> Result<Deployment, Error> {
    let name = app.name_any();
    let container = Container {
        name: CONTAINER.to_owned(),
        image: Some(app.spec.image.clone()),
        ..Container::default()
    };
    owned::desired_deployment(
        app,
        object_labels(&name),
        selector_labels(&name),
        container,
        RUN_AS_USER,
    )
}

/// The status a `MyApp` should report, given its Deployment (`None` when blocked by a foreign
/// one).
pub fn desired_status(app: &MyApp, deployment: Option<&Deployment>, now: &Time) -> MyAppStatus {
    let old = app.status.clone().unwrap_or_default();
    let generation = app.metadata.generation;
    let (replicas, ready_replicas, conditions) = match deployment {
        Some(d) => {
            let rollout = Rollout::of(app.spec.replicas, d);
            (rollout.replicas, rollout.ready, rollout.conditions())
        }
        None => (
            0,
            0,
            not_owned_conditions(&app.namespace().unwrap_or_default(), &app.name_any(), KIND),
        ),
    };
    MyAppStatus {
        replicas,
        ready_replicas,
        observed_generation: generation,
        conditions: merge_conditions(&old.conditions, conditions, generation, now),
    }
}

async fn reconcile(app: Arc<MyApp>, ctx: Arc<Context>) -> Result<Outcome, Error> {
    owned::report_failure(app.as_ref(), &ctx.events, reconcile_inner(&app, &ctx).await)
}

async fn reconcile_inner(app: &MyApp, ctx: &Context) -> Result<Outcome, Error> {
    let app = &*ctx.status.latest(app);
    if app.metadata.deletion_timestamp.is_some() {
        return Ok(Outcome::Done);
    }
    let deployment = match ctx
        .deployments
        .ensure(app, &desired_deployment(app)?, &ctx.events)
        .await?
    {
        Ensured::NamespaceTerminating => return Ok(Outcome::Done),
        // The Deployment's watch event brings the news (and this object back).
        Ensured::Pending { recheck } => return Ok(Outcome::RequeueAfter(recheck)),
        Ensured::Foreign => None,
        Ensured::Ready(deployment) => Some(deployment),
    };
    let status = desired_status(app, deployment.as_deref(), &crate::status::now());
    let progress = status::progress(
        app.spec.replicas,
        deployment.as_deref(),
        app.current_conditions(),
    );
    Ok(
        match (ctx.status.write(app, status, progress).await?, deployment) {
            (StatusWrite::Held { retry }, _) => Outcome::RequeueAfter(retry),
            (_, None) => Outcome::RequeueAfter(FOREIGN_RECHECK),
            (_, Some(_)) => Outcome::Done,
        },
    )
}

impl WithStatus for MyApp {
    type Status = MyAppStatus;

    fn status(&self) -> Option<&MyAppStatus> {
        self.status.as_ref()
    }

    fn set_status(&mut self, status: MyAppStatus) {
        self.status = Some(status);
    }
}

impl DeploymentOwner for MyApp {
    const KIND: &'static str = KIND;
    const CONTAINER: &'static str = CONTAINER;

    fn desired_replicas(&self) -> i32 {
        self.spec.replicas
    }

    fn desired_image(&self) -> &str {
        &self.spec.image
    }

    fn current_conditions(&self) -> &[Condition] {
        self.status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use apis::MyAppSpec;
    use apis::condition::{AVAILABLE, PROGRESSING};
    use k8s_openapi::api::apps::v1::DeploymentStatus;
    use kube::api::ObjectMeta;

    fn myapp(name: &str, replicas: i32, image: &str) -> MyApp {
        let mut app = MyApp::new(
            name,
            MyAppSpec {
                replicas,
                image: image.into(),
            },
        );
        app.metadata.namespace = Some("ns".into());
        app.metadata.uid = Some("uid-2".into());
        app.metadata.generation = Some(1);
        app
    }

    fn time(second: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(second).expect("valid time"))
    }

    #[test]
    fn desired_deployment_runs_the_image() {
        let d = desired_deployment(&myapp("web", 2, "nginx:1.29")).expect("desired deployment");
        let spec = &d.spec;
        assert_eq!(spec.replicas, Some(2));
        let pod = spec.template.spec.as_ref().expect("pod spec");
        assert_eq!(pod.containers.len(), 1);
        assert_eq!(pod.containers[0].name, "app");
        assert_eq!(pod.containers[0].image.as_deref(), Some("nginx:1.29"));
        let owner = &d
            .metadata
            .owner_references
            .as_ref()
            .expect("owner references")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.controller),
            ("MyApp", Some(true))
        );
        let selector = spec.selector.match_labels.clone().unwrap_or_default();
        let template_labels = spec
            .template
            .metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        assert!(
            selector
                .iter()
                .all(|(k, v)| template_labels.get(k) == Some(v))
        );
        assert_eq!(template_labels[labels::MANAGED_BY], labels::MANAGER);
        crate::workload::assert_restricted(&d);
    }

    #[test]
    fn long_names_get_valid_labels() {
        let name = "a".repeat(100);
        let d = desired_deployment(&myapp(&name, 1, "busybox")).expect("desired deployment");
        assert!(
            d.metadata
                .labels
                .iter()
                .flatten()
                .all(|(_, v)| labels::is_valid_label_value(v))
        );
    }

    #[test]
    fn status_follows_the_rollout() {
        let mut app = myapp("web", 2, "nginx");
        let rolling = Deployment {
            metadata: ObjectMeta {
                generation: Some(2),
                ..ObjectMeta::default()
            },
            status: Some(DeploymentStatus {
                observed_generation: Some(2),
                replicas: Some(3),
                updated_replicas: Some(1),
                ready_replicas: Some(2),
                available_replicas: Some(2),
                ..DeploymentStatus::default()
            }),
            ..Deployment::default()
        };
        let status = desired_status(&app, Some(&rolling), &time(5));
        assert_eq!(
            (
                status.replicas,
                status.ready_replicas,
                status.observed_generation
            ),
            (3, 2, Some(1))
        );
        let progressing = status
            .conditions
            .iter()
            .find(|c| c.type_ == PROGRESSING)
            .expect("Progressing");
        assert_eq!(
            (progressing.status.as_str(), progressing.reason.as_str()),
            ("True", "RollingOut")
        );
        app.status = Some(status.clone());
        assert_eq!(
            desired_status(&app, Some(&rolling), &time(50)),
            status,
            "unchanged: nothing to write"
        );
        let available = status
            .conditions
            .iter()
            .find(|c| c.type_ == AVAILABLE)
            .expect("Available");
        assert_eq!(
            available.status, "True",
            "2 of 2 available while the rollout proceeds"
        );
    }

    #[test]
    fn rbac_rules_cover_what_the_controller_does() {
        let rules = MyAppController.rbac_rules();
        let allows = |group: &str, resource: &str, verb: &str| {
            rules.iter().any(|r| {
                r.api_groups.contains(&group)
                    && r.resources.contains(&resource)
                    && r.verbs.contains(&verb)
            })
        };
        for verb in [
            "get", "list", "watch", "create", "update", "patch", "delete",
        ] {
            assert!(
                allows("myscheme.example.com", "myapps", verb),
                "myapps {verb}"
            );
            assert!(allows("apps", "deployments", verb), "deployments {verb}");
        }
        assert!(allows("myscheme.example.com", "myapps/status", "patch"));
        assert!(allows("events.k8s.io", "events", "create") && allows("", "events", "patch"));
    }
}
