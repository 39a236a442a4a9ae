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
//! conditions, written only when changed (a state the rollout passes through is held back a
//! moment: see [`kube_operator_runtime::status_writer::StatusWriter`]).

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;

use apis::{MyApp, MyAppStatus};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Container;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use kube_operator_runtime::deployment_view::DeploymentView;
use kube_operator_runtime::status::{self, WorkloadOwner};
use kube_operator_runtime::{Builder, Context, Error, Outcome, Registration, RunContext};
use kube_operator_runtime::{labels, owned, rbac, watches, with_status_writer};

/// The controller's name: metrics label, configuration key, log field.
pub const NAME: &str = "myapp";
/// The server-side apply field manager of the Deployments this controller writes (the
/// runtime's `operator-manager/<controller>`).
pub const FIELD_MANAGER: &str = concat!(product::name!(), "/myapp");
/// The value of `app.kubernetes.io/name` on the Deployment and its pods.
pub const APP: &str = "myapp";
/// The application container's name.
pub const CONTAINER: &str = "app";
/// The numeric user the application runs as (the common "nonroot" user of distroless images):
/// the `restricted` Pod Security Standard needs a non-root user the kubelet can verify, and an
/// arbitrary image's user is unknown. Images must tolerate an arbitrary non-root user, as on
/// OpenShift.
pub const RUN_AS_USER: i64 = 65532;

/// The MyApp controller, as registered in [`crate::all`].
pub const CONTROLLER: Registration = Registration::new(
    NAME,
    &kube_operator_runtime::controller_rules!(
        product::group!(myscheme),
        "myapps",
        rbac::DEPLOYMENTS
    ),
    |ctx| Box::pin(run(ctx)),
)
.with_webhooks(crate::admission::myapp::webhooks)
.with_samples(crate::samples::myapp);

async fn run(ctx: RunContext) -> Result<(), Error> {
    Builder::<MyApp>::new(NAME, &ctx)
        .owns_one_as::<Deployment, DeploymentView>(watches::managed_deployments())
        .run(with_status_writer, reconcile)
        .await
}

/// The labels that select a `MyApp`'s pods.
pub fn selector_labels(myapp_name: &str) -> BTreeMap<String, String> {
    labels::instance(APP, myapp_name)
}

/// Every label of the Deployment and its pods.
pub fn object_labels(myapp_name: &str) -> BTreeMap<String, String> {
    labels::managed_instance(APP, myapp_name)
}

/// The Deployment a `MyApp` asks for: `spec.replicas` pods running `spec.image`, or
/// [`Error::MissingField`] when `app` was not read from the API server.
pub fn desired_deployment(app: &MyApp) -> Result<Deployment, Error> {
    let container = Container {
        image: Some(app.spec.image.clone()),
        name: CONTAINER.to_owned(),
        ..Container::default()
    };
    let (replicas, name) = (app.spec.replicas, app.name_any());
    let (labels, selector) = (object_labels(&name), selector_labels(&name));
    owned::desired_deployment(app, replicas, labels, selector, container, RUN_AS_USER)
}

/// The status a `MyApp` should report, given its Deployment (`None` when blocked by a foreign
/// one).
pub fn desired_status(app: &MyApp, deployment: Option<&DeploymentView>, now: &Time) -> MyAppStatus {
    let reported = status::report(app, app.spec.replicas, deployment, now);
    MyAppStatus {
        replicas: reported.replicas,
        ready_replicas: reported.ready,
        observed_generation: reported.observed_generation,
        conditions: reported.conditions,
    }
}

async fn reconcile(app: Arc<MyApp>, ctx: Arc<Context<MyApp>>) -> Result<Outcome, Error> {
    let (tools, statuses) = &*ctx;
    let app = &*statuses.latest(&app);
    if app.metadata.deletion_timestamp.is_some() {
        return Ok(Outcome::Done);
    }
    let desired = desired_deployment(app)?;
    let deployment: Option<Arc<DeploymentView>> =
        match owned::ensure_workload(tools, app, &desired).await? {
            ControlFlow::Continue(deployment) => deployment,
            ControlFlow::Break(outcome) => return Ok(outcome),
        };
    let status = desired_status(
        app,
        deployment.as_deref(),
        &kube_operator_runtime::conditions::now(),
    );
    let replicas = app.spec.replicas;
    let progress = status::progress(replicas, deployment.as_deref(), app.current_conditions());
    let written = statuses.write(app, status, progress).await?;
    Ok(owned::after_status(written, deployment.as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use apis::MyAppSpec;
    use k8s_openapi::api::apps::v1::DeploymentStatus;
    use kube::api::ObjectMeta;
    use kube_operator_runtime::conditions::{AVAILABLE, PROGRESSING};
    use kube_operator_runtime::testing;

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
        testing::assert_controlled_by(&d.metadata, "MyApp", "uid-2");
        testing::assert_selects_its_pods(&d.spec.selector, &d.spec.template);
        testing::assert_restricted(&d.spec.template);
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
        let rolling = DeploymentView {
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
            ..DeploymentView::default()
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
        crate::testing::assert_deployment_owner_rules(
            CONTROLLER.rbac_rules,
            product::group!(myscheme),
            "myapps",
        );
    }
}
