//! Admission webhooks, declared next to the controllers that need them.
//!
//! A controller's [`crate::Registration`] lists its webhooks; the manager serves every one of
//! them (on every replica: admission is not leader-gated) and `cargo xtask manifests` renders
//! the MutatingWebhookConfiguration and ValidatingWebhookConfiguration from the same list, so
//! the cluster calls exactly the paths the manager serves, for exactly the operations the code
//! handles.
//!
//! A type opts in through a type of the controller's that implements [`Defaulter`] (fill in
//! what the schema cannot default) or [`Validator`] (refuse what the schema cannot express,
//! naming the field and why) for it, as controller-runtime's `CustomDefaulter` and
//! `CustomValidator` are, and declaring [`AdmissionWebhook::defaulting`] or
//! [`AdmissionWebhook::validating`] of that type. This module
//! turns an `AdmissionReview` into the typed call and the answer back into a review: a
//! defaulting answer is the JSON patch from the object as sent to the object as defaulted, a
//! refusal is a 422 `Invalid` status whose causes name each field, as the API server's own
//! validation reports them.
//!
//! A review's body is read once: the review around the objects is parsed with the objects
//! left as slices of the body, and each object is then parsed once, straight into the type
//! that judges it (a defaulting webhook also keeps it as JSON, to patch what it changed). No
//! copy of the objects is made on the way, which matters when the body is several MiB.

pub mod conversion;

use std::borrow::Cow;
use std::time::Duration;

use kube::core::admission::{AdmissionResponse, AdmissionReview, Operation};
use kube::core::response::{StatusCause, StatusDetails};
use kube::core::{DynamicObject, GroupVersionKind, Status, TypeMeta};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

/// The port the manager serves webhooks on (`--webhook-bind-address`, Kubebuilder's 9443).
pub const PORT: u16 = 9443;
/// The name of [`PORT`] on the manager's container.
pub const PORT_NAME: &str = "webhook-server";
/// How long the API server waits for a webhook's answer (`timeoutSeconds` of every generated
/// webhook). Past it, the API server applies the failure policy.
pub const TIMEOUT_SECONDS: i32 = 10;

/// How long the manager lets one review take before it answers on its own: well below
/// [`TIMEOUT_SECONDS`], so the API server hears why instead of timing out.
pub const HANDLER_BUDGET: Duration = Duration::from_secs(5);

/// The AdmissionReview version the webhooks speak (their `admissionReviewVersions`).
pub const REVIEW_VERSION: &str = "admission.k8s.io/v1";

/// The operations every generated webhook is called for.
pub const CREATE_UPDATE: &[&str] = &["CREATE", "UPDATE"];

/// Whether a webhook may change the object or only judge it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AdmissionKind {
    /// Mutating: fills in defaults, answered with a JSON patch.
    Defaulting,
    /// Validating: admits or refuses, and may warn.
    Validating,
}

/// One admission webhook: what it is called for, where it is served, and how it answers.
#[derive(Clone, Debug)]
pub struct AdmissionWebhook {
    /// Defaulting or validating.
    pub kind: AdmissionKind,
    /// The webhook's name in its configuration, e.g. `mmemcached-v1alpha1.cache.example.com`.
    pub name: String,
    /// The path the manager serves it on, e.g. `/mutate-cache-example-com-v1alpha1-memcached`
    /// (Kubebuilder's scheme).
    pub path: String,
    /// The API group of the resource it admits.
    pub group: String,
    /// The version of the resource it admits.
    pub version: String,
    /// The resource (plural) it admits.
    pub resource: String,
    /// The kind it admits.
    pub kind_name: String,
    /// The operations it is called for (`CREATE`, `UPDATE`).
    pub operations: &'static [&'static str],
    admit: fn(&Request<'_>) -> AdmissionResponse,
}

/// The parts of an `AdmissionReview` the webhooks read. The objects stay the JSON text they
/// arrived as, a slice of the body, until the webhook parses each, once, into what it needs.
#[derive(Deserialize)]
struct Review<'a> {
    #[serde(default, rename = "apiVersion")]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(borrow)]
    request: Option<Request<'a>>,
}

/// The request of an `AdmissionReview`, its objects unparsed.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request<'a> {
    uid: String,
    kind: GroupVersionKind,
    /// The kind as the client sent it, before conversion (absent from old API servers).
    #[serde(default)]
    request_kind: Option<GroupVersionKind>,
    #[serde(default)]
    name: String,
    operation: Operation,
    #[serde(borrow, default)]
    object: Option<&'a RawValue>,
    #[serde(borrow, default)]
    old_object: Option<&'a RawValue>,
}

impl Request<'_> {
    /// The answer that admits this request as it is.
    fn allowed(&self) -> AdmissionResponse {
        let mut response = AdmissionResponse::invalid("");
        response.types = TypeMeta {
            api_version: REVIEW_VERSION.to_owned(),
            kind: "AdmissionReview".to_owned(),
        };
        response.uid.clone_from(&self.uid);
        response.allowed = true;
        response.result = Status::default();
        response
    }
}

impl AdmissionWebhook {
    /// The defaulting webhook of `D`'s object type, called on create and update.
    pub fn defaulting<D: Defaulter>() -> Self {
        Self::new::<D::Object>(AdmissionKind::Defaulting, admit_defaulting::<D>)
    }

    /// The validating webhook of `V`'s object type, called on create and update.
    pub fn validating<V: Validator>() -> Self {
        Self::new::<V::Object>(AdmissionKind::Validating, admit_validating::<V>)
    }

    fn new<K: kube::Resource<DynamicType = ()>>(
        kind: AdmissionKind,
        admit: fn(&Request<'_>) -> AdmissionResponse,
    ) -> Self {
        let (group, version, kind_name) = (K::group(&()), K::version(&()), K::kind(&()));
        let lower = kind_name.to_lowercase();
        let (prefix, verb) = match kind {
            AdmissionKind::Defaulting => ("m", "mutate"),
            AdmissionKind::Validating => ("v", "validate"),
        };
        Self {
            kind,
            name: format!("{prefix}{lower}-{version}.{group}"),
            path: format!("/{verb}-{}-{version}-{lower}", group.replace('.', "-")),
            group: group.into_owned(),
            version: version.into_owned(),
            resource: K::plural(&()).into_owned(),
            kind_name: kind_name.into_owned(),
            operations: CREATE_UPDATE,
            admit,
        }
    }

    /// Answers one `AdmissionReview` body with the review to send back.
    ///
    /// # Errors
    /// [`MalformedReview`] when the body is no `admission.k8s.io/v1` review with a request: the
    /// server answers it with 400 and the reason.
    pub fn review(&self, body: &[u8]) -> Result<AdmissionReview<DynamicObject>, MalformedReview> {
        let review: Review<'_> = serde_json::from_slice(body)
            .map_err(|e| MalformedReview(format!("the body is not an AdmissionReview: {e}")))?;
        if review.api_version != REVIEW_VERSION || review.kind != "AdmissionReview" {
            return Err(MalformedReview(format!(
                "expected an AdmissionReview of {REVIEW_VERSION}, got kind {:?} of {:?}",
                review.kind, review.api_version
            )));
        }
        let request = review
            .request
            .ok_or_else(|| MalformedReview("the AdmissionReview has no request".into()))?;
        let response = if request.kind.group != self.group || request.kind.kind != self.kind_name {
            request.allowed().deny(format!(
                "webhook {} admits {}.{}, not {}.{}: its configuration sends it the wrong kind",
                self.name, self.kind_name, self.group, request.kind.kind, request.kind.group
            ))
        } else {
            (self.admit)(&request)
        };
        Ok(response.into_review())
    }

    /// The answer to `request` when its review took longer than [`HANDLER_BUDGET`]: a
    /// refusal that says so, rather than the API server's bare timeout.
    pub fn out_of_time(request_uid: &str) -> AdmissionReview<DynamicObject> {
        let mut response = AdmissionResponse::invalid(format!(
            "the webhook did not decide within {}s",
            HANDLER_BUDGET.as_secs()
        ));
        response.uid = request_uid.to_owned();
        response.into_review()
    }
}

/// A review body the webhook cannot read; answered with 400 and this reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed admission review: {0}")]
pub struct MalformedReview(pub String);

/// The defaulting of one resource type: fills in what its schema cannot default.
pub trait Defaulter: 'static {
    /// The type it defaults.
    type Object: kube::Resource<DynamicType = ()> + Serialize + DeserializeOwned;

    /// Sets defaults in place; returns warnings for the user (shown by kubectl).
    fn default_fields(object: &mut Self::Object) -> Vec<String>;
}

/// The validation of one resource type: refuses what its schema cannot express.
pub trait Validator: 'static {
    /// The type it validates.
    type Object: kube::Resource<DynamicType = ()> + DeserializeOwned;

    /// Judges a new object.
    fn validate_create(object: &Self::Object) -> Verdict;

    /// Judges an update; by default, the new object as if it were created.
    fn validate_update(object: &Self::Object, old: &Self::Object) -> Verdict {
        let _ = old;
        Self::validate_create(object)
    }

    /// Judges, besides the above, a write made through another version of the type
    /// (`version`, say `v1alpha1`), which the API server converted before it came here: what
    /// that version cannot express, it must not change. `old` is `None` for a create. By
    /// default nothing more is checked.
    fn validate_through(
        version: &str,
        object: &Self::Object,
        old: Option<&Self::Object>,
    ) -> Verdict {
        let _ = (version, object, old);
        Verdict::default()
    }
}

/// What a validation found: refusals (any refuses the request) and warnings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Why the object is refused, one entry per field.
    pub refusals: Vec<FieldError>,
    /// What the user should know even though the object is admitted.
    pub warnings: Vec<String>,
}

impl Verdict {
    /// Refuses the object for `error`.
    pub fn refuse(&mut self, error: FieldError) {
        self.refusals.push(error);
    }

    /// Warns the user with `message`.
    pub fn warn(&mut self, message: impl Into<String>) {
        self.warnings.push(message.into());
    }
}

/// A field's value refused, reported the way the API server reports its own validation:
/// `spec.image: Invalid value: "x y": must not contain ' '`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// The field's path, e.g. `spec.image`.
    pub field: Cow<'static, str>,
    /// The value refused, as shown to the user.
    pub value: String,
    /// Why.
    pub detail: String,
}

impl FieldError {
    /// `field` cannot hold `value`, because `detail`.
    pub fn invalid(
        field: impl Into<Cow<'static, str>>,
        value: impl Into<String>,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            field: field.into(),
            value: value.into(),
            detail: detail.into(),
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: Invalid value: {:?}: {}",
            self.field, self.value, self.detail
        )
    }
}

fn admit_defaulting<D: Defaulter>(request: &Request<'_>) -> AdmissionResponse {
    let allowed = request.allowed();
    let Some(object) = request.object else {
        return allowed;
    };
    let raw: Value = match serde_json::from_str(object.get()) {
        Ok(raw) => raw,
        Err(e) => return allowed.deny(format!("cannot read the object: {e}")),
    };
    // Defaulting runs before the schema is checked: an object that does not read as `K` is
    // left alone for the schema to refuse with its own, better message.
    let Ok(mut typed) = D::Object::deserialize(&raw) else {
        return allowed;
    };
    let before = serde_json::to_value(&typed);
    let warnings = D::default_fields(&mut typed);
    let after = serde_json::to_value(&typed);
    let (Ok(before), Ok(after)) = (before, after) else {
        return allowed.deny("cannot write the defaulted object");
    };
    let mut patched = raw.clone();
    apply_changes(&mut patched, &before, &after);
    let patch = json_patch::diff(&raw, &patched);
    let response = with_warnings(allowed, warnings);
    if patch.0.is_empty() {
        return response;
    }
    response.with_patch(patch).unwrap_or_else(|e| {
        request
            .allowed()
            .deny(format!("cannot write the patch: {e}"))
    })
}

/// Carries into `raw` (the object as sent) what changed from `before` to `after` (the typed
/// object before and after defaulting), and nothing else: a field the type would write
/// differently but did not change stays as the user sent it.
fn apply_changes(raw: &mut Value, before: &Value, after: &Value) {
    if before == after {
        return;
    }
    match (raw, before, after) {
        (Value::Object(raw), Value::Object(before), Value::Object(after)) => {
            let keys: std::collections::BTreeSet<&String> =
                before.keys().chain(after.keys()).collect();
            for key in keys {
                match (before.get(key), after.get(key)) {
                    (b, a) if b == a => {}
                    (_, None) => {
                        raw.remove(key);
                    }
                    (Some(b), Some(a)) if raw.contains_key(key) => {
                        if let Some(slot) = raw.get_mut(key) {
                            apply_changes(slot, b, a);
                        }
                    }
                    (_, Some(a)) => {
                        raw.insert(key.clone(), a.clone());
                    }
                }
            }
        }
        (raw, _, after) => *raw = after.clone(),
    }
}

fn admit_validating<V: Validator>(request: &Request<'_>) -> AdmissionResponse {
    let allowed = request.allowed();
    let read = |object: Option<&RawValue>| -> Option<Result<V::Object, String>> {
        object.map(|object| {
            serde_json::from_str::<V::Object>(object.get()).map_err(|e| {
                format!(
                    "cannot read the object as {}: {e}",
                    <V::Object as kube::Resource>::kind(&())
                )
            })
        })
    };
    let (new, old) = (read(request.object), read(request.old_object));
    let (mut verdict, new_and_old) = match (&request.operation, &new, &old) {
        (_, Some(Err(e)), _) | (Operation::Update, _, Some(Err(e))) => return allowed.deny(e),
        (Operation::Create, Some(Ok(new)), _) => (V::validate_create(new), (new, None)),
        (Operation::Update, Some(Ok(new)), Some(Ok(old))) => {
            (V::validate_update(new, old), (new, Some(old)))
        }
        _ => return allowed,
    };
    let sent_as = request.request_kind.as_ref().map(|k| k.version.as_str());
    if let Some(version) = sent_as.filter(|v| *v != request.kind.version) {
        let (new, old) = new_and_old;
        let through = V::validate_through(version, new, old);
        verdict.refusals.extend(through.refusals);
        verdict.warnings.extend(through.warnings);
    }
    if verdict.refusals.is_empty() {
        return with_warnings(allowed, verdict.warnings);
    }
    let name = match &new {
        Some(Ok(new)) => kube::Resource::meta(new).name.clone(),
        _ => None,
    }
    .unwrap_or_else(|| request.name.clone());
    let mut response = with_warnings(allowed, verdict.warnings)
        .deny(invalid_message::<V::Object>(&name, &verdict.refusals));
    response.result.code = 422;
    response.result.reason = "Invalid".into();
    response.result.details = Some(StatusDetails {
        name,
        group: <V::Object as kube::Resource>::group(&()).into_owned(),
        kind: <V::Object as kube::Resource>::kind(&()).into_owned(),
        uid: String::new(),
        causes: verdict
            .refusals
            .iter()
            .map(|refusal| StatusCause {
                reason: "FieldValueInvalid".into(),
                message: format!("Invalid value: {:?}: {}", refusal.value, refusal.detail),
                field: refusal.field.clone().into_owned(),
            })
            .collect(),
        retry_after_seconds: 0,
    });
    response
}

/// `Memcached.cache.example.com "name" is invalid: <error>`, or with `[a, b]` for several: the
/// API server's own wording for an invalid object.
fn invalid_message<K: kube::Resource<DynamicType = ()>>(
    name: &str,
    errors: &[FieldError],
) -> String {
    let listed: Vec<String> = errors.iter().map(ToString::to_string).collect();
    let errors = match listed.as_slice() {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    format!(
        "{}.{} {name:?} is invalid: {errors}",
        K::kind(&()),
        K::group(&())
    )
}

fn with_warnings(mut response: AdmissionResponse, warnings: Vec<String>) -> AdmissionResponse {
    if !warnings.is_empty() {
        response.warnings = Some(warnings);
    }
    response
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A small custom resource for the machinery's tests.
    #[derive(
        kube::CustomResource,
        Serialize,
        serde::Deserialize,
        Clone,
        Debug,
        PartialEq,
        schemars::JsonSchema,
    )]
    #[kube(
        group = "test.example.com",
        version = "v1",
        kind = "Widget",
        namespaced
    )]
    struct WidgetSpec {
        #[serde(default)]
        color: String,
        #[serde(default)]
        size: i32,
    }

    /// The admission of [`Widget`]s.
    struct WidgetAdmission;

    impl Defaulter for WidgetAdmission {
        type Object = Widget;

        fn default_fields(widget: &mut Widget) -> Vec<String> {
            if widget.spec.color.trim().is_empty() {
                widget.spec.color = "blue".into();
                return vec!["spec.color: none given, blue chosen".into()];
            }
            Vec::new()
        }
    }

    impl Validator for WidgetAdmission {
        type Object = Widget;

        fn validate_create(widget: &Widget) -> Verdict {
            let mut verdict = Verdict::default();
            if widget.spec.color == "red" {
                verdict.refuse(FieldError::invalid(
                    "spec.color",
                    "red",
                    "red widgets are sold out",
                ));
            }
            if widget.spec.size > 10 {
                verdict.refuse(FieldError::invalid(
                    "spec.size",
                    widget.spec.size.to_string(),
                    "at most 10",
                ));
            }
            if widget.spec.size == 0 {
                verdict.warn("spec.size: 0 makes an empty widget");
            }
            verdict
        }

        fn validate_update(widget: &Widget, old: &Widget) -> Verdict {
            let mut verdict = Self::validate_create(widget);
            if widget.spec.size < old.spec.size {
                verdict.refuse(FieldError::invalid(
                    "spec.size",
                    widget.spec.size.to_string(),
                    format!("may not shrink below {}", old.spec.size),
                ));
            }
            verdict
        }

        fn validate_through(version: &str, widget: &Widget, old: Option<&Widget>) -> Verdict {
            let mut verdict = Verdict::default();
            // v0 has no size: a write through it may not change one.
            if version == "v0" && Some(widget.spec.size) != old.map(|o| o.spec.size) {
                verdict.refuse(FieldError::invalid("spec.size", "", "not in v0"));
            }
            verdict
        }
    }

    fn review_body(operation: &str, object: Value, old: Option<Value>) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "0e3f-uid",
                "kind": {"group": "test.example.com", "version": "v1", "kind": "Widget"},
                "resource": {"group": "test.example.com", "version": "v1", "resource": "widgets"},
                "name": "w",
                "namespace": "ns",
                "operation": operation,
                "userInfo": {"username": "alice"},
                "object": object,
                "oldObject": old,
            }
        }))
        .expect("serializes")
    }

    fn widget(spec: Value) -> Value {
        json!({
            "apiVersion": "test.example.com/v1",
            "kind": "Widget",
            "metadata": {"name": "w", "namespace": "ns", "labels": {"keep": "me"}},
            "spec": spec,
        })
    }

    fn answer_of(review: AdmissionReview<DynamicObject>) -> Value {
        let value = serde_json::to_value(review).expect("serializes");
        assert_eq!(value["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(value["kind"], "AdmissionReview");
        assert_eq!(value["response"]["uid"], "0e3f-uid");
        value["response"].clone()
    }

    /// The JSON patch of an answer. kube sends the patch's bytes as a JSON array of numbers,
    /// which the API server's decoder reads into its `[]byte` like the base64 Go would write.
    fn patch_of(response: &Value) -> Value {
        let bytes: Vec<u8> = serde_json::from_value(response["patch"].clone()).expect("a patch");
        serde_json::from_slice(&bytes).expect("JSON")
    }

    #[test]
    fn names_and_paths_follow_kubebuilder() {
        let mutating = AdmissionWebhook::defaulting::<WidgetAdmission>();
        assert_eq!(mutating.name, "mwidget-v1.test.example.com");
        assert_eq!(mutating.path, "/mutate-test-example-com-v1-widget");
        assert_eq!(mutating.resource, "widgets");
        let validating = AdmissionWebhook::validating::<WidgetAdmission>();
        assert_eq!(validating.name, "vwidget-v1.test.example.com");
        assert_eq!(validating.path, "/validate-test-example-com-v1-widget");
        assert_eq!(validating.operations, ["CREATE", "UPDATE"]);
        assert!(HANDLER_BUDGET.as_secs() < TIMEOUT_SECONDS as u64);
    }

    #[test]
    fn defaulting_patches_only_what_it_changed() {
        let webhook = AdmissionWebhook::defaulting::<WidgetAdmission>();
        // `size` is absent: the type would write 0, but defaulting did not touch it.
        let review = webhook
            .review(&review_body("CREATE", widget(json!({"color": " "})), None))
            .expect("well-formed");
        let response = answer_of(review);
        assert_eq!(response["allowed"], true);
        assert_eq!(response["patchType"], "JSONPatch");
        assert_eq!(
            patch_of(&response),
            json!([{"op": "replace", "path": "/spec/color", "value": "blue"}])
        );
        assert_eq!(
            response["warnings"],
            json!(["spec.color: none given, blue chosen"])
        );

        // Nothing to default: no patch at all.
        let review = webhook
            .review(&review_body(
                "CREATE",
                widget(json!({"color": "green"})),
                None,
            ))
            .expect("well-formed");
        let response = answer_of(review);
        assert_eq!(response["allowed"], true);
        assert!(response.get("patch").is_none(), "{response}");
    }

    #[test]
    fn defaulting_adds_a_field_the_object_lacks() {
        let webhook = AdmissionWebhook::defaulting::<WidgetAdmission>();
        let review = webhook
            .review(&review_body("CREATE", widget(json!({})), None))
            .expect("well-formed");
        assert_eq!(
            patch_of(&answer_of(review)),
            json!([{"op": "add", "path": "/spec/color", "value": "blue"}])
        );
    }

    #[test]
    fn defaulting_leaves_an_unreadable_object_to_the_schema() {
        let webhook = AdmissionWebhook::defaulting::<WidgetAdmission>();
        let review = webhook
            .review(&review_body(
                "CREATE",
                widget(json!({"size": "large"})),
                None,
            ))
            .expect("well-formed");
        let response = answer_of(review);
        assert_eq!(response["allowed"], true);
        assert!(response.get("patch").is_none());
    }

    #[test]
    fn validation_refuses_naming_each_field_and_warns() {
        let webhook = AdmissionWebhook::validating::<WidgetAdmission>();
        let review = webhook
            .review(&review_body(
                "CREATE",
                widget(json!({"color": "red", "size": 11})),
                None,
            ))
            .expect("well-formed");
        let response = answer_of(review);
        assert_eq!(response["allowed"], false);
        let status = &response["status"];
        assert_eq!(status["code"], 422);
        assert_eq!(status["reason"], "Invalid");
        assert_eq!(
            status["message"],
            "Widget.test.example.com \"w\" is invalid: [spec.color: Invalid value: \"red\": red widgets are sold out, spec.size: Invalid value: \"11\": at most 10]"
        );
        let causes = status["details"]["causes"].as_array().expect("causes");
        assert_eq!(causes.len(), 2);
        assert_eq!(causes[0]["field"], "spec.color");
        assert_eq!(causes[1]["field"], "spec.size");

        let review = webhook
            .review(&review_body(
                "CREATE",
                widget(json!({"color": "green", "size": 0})),
                None,
            ))
            .expect("well-formed");
        let response = answer_of(review);
        assert_eq!(response["allowed"], true);
        assert_eq!(
            response["warnings"],
            json!(["spec.size: 0 makes an empty widget"])
        );
    }

    #[test]
    fn updates_are_judged_against_the_old_object() {
        let webhook = AdmissionWebhook::validating::<WidgetAdmission>();
        let old = widget(json!({"color": "green", "size": 5}));
        let review = webhook
            .review(&review_body(
                "UPDATE",
                widget(json!({"color": "green", "size": 4})),
                Some(old.clone()),
            ))
            .expect("well-formed");
        let response = answer_of(review);
        assert_eq!(response["allowed"], false);
        assert_eq!(
            response["status"]["message"],
            "Widget.test.example.com \"w\" is invalid: spec.size: Invalid value: \"4\": may not shrink below 5"
        );
        let review = webhook
            .review(&review_body(
                "UPDATE",
                widget(json!({"color": "green", "size": 6})),
                Some(old),
            ))
            .expect("well-formed");
        assert_eq!(answer_of(review)["allowed"], true);
    }

    #[test]
    fn malformed_reviews_are_refused_with_the_reason() {
        let webhook = AdmissionWebhook::validating::<WidgetAdmission>();
        let error = webhook.review(b"{not json").expect_err("not JSON");
        assert!(error.0.contains("not an AdmissionReview"), "{error}");

        let no_request = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#;
        let error = webhook.review(no_request).expect_err("no request");
        assert!(error.0.contains("no request"), "{error}");

        let mut old_version: Value =
            serde_json::from_slice(&review_body("CREATE", widget(json!({})), None)).expect("JSON");
        old_version["apiVersion"] = json!("admission.k8s.io/v1beta1");
        let error = webhook
            .review(&serde_json::to_vec(&old_version).expect("JSON"))
            .expect_err("v1beta1");
        assert!(error.0.contains("admission.k8s.io/v1beta1"), "{error}");
    }

    #[test]
    fn a_write_through_another_version_is_judged_for_it_too() {
        let webhook = AdmissionWebhook::validating::<WidgetAdmission>();
        let sent_as = |version: &str| {
            let old = widget(json!({"size": 2}));
            let mut body: Value = serde_json::from_slice(&review_body(
                "UPDATE",
                widget(json!({"size": 3})),
                Some(old),
            ))
            .expect("JSON");
            body["request"]["requestKind"] =
                json!({"group": "test.example.com", "version": version, "kind": "Widget"});
            let review = webhook
                .review(&serde_json::to_vec(&body).expect("JSON"))
                .expect("well-formed");
            answer_of(review)
        };
        assert_eq!(sent_as("v1")["allowed"], true);
        let through_v0 = sent_as("v0");
        assert_eq!(through_v0["allowed"], false);
        assert!(
            through_v0["status"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("spec.size") && m.contains("not in v0")),
            "{through_v0}"
        );
    }

    #[test]
    fn a_review_for_another_kind_is_refused_not_admitted() {
        let webhook = AdmissionWebhook::validating::<WidgetAdmission>();
        let mut body: Value =
            serde_json::from_slice(&review_body("CREATE", widget(json!({})), None)).expect("JSON");
        body["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
        let review = webhook
            .review(&serde_json::to_vec(&body).expect("JSON"))
            .expect("well-formed");
        let response = answer_of(review);
        assert_eq!(response["allowed"], false);
        assert!(
            response["status"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("wrong kind"))
        );
    }
}
