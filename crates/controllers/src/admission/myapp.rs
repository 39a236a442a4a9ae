//! `MyApp` admission: the image trimmed of copied whitespace, and refused when malformed.

use apis::MyApp;

use super::{check_image, trim_image};
use kube_operator_runtime::webhook::{AdmissionWebhook, Defaulter, Validator, Verdict};

/// The webhooks the MyApp controller declares.
pub fn webhooks() -> Vec<AdmissionWebhook> {
    vec![
        AdmissionWebhook::defaulting::<MyAppAdmission>(),
        AdmissionWebhook::validating::<MyAppAdmission>(),
    ]
}

/// The admission of `MyApp` objects: their defaulting and validation.
#[derive(Debug)]
pub struct MyAppAdmission;

impl Defaulter for MyAppAdmission {
    type Object = MyApp;

    fn default_fields(app: &mut MyApp) -> Vec<String> {
        let image = &mut app.spec.image;
        if trim_image(image) {
            vec![format!(
                "spec.image: surrounding whitespace removed, {image:?} is used"
            )]
        } else {
            Vec::new()
        }
    }
}

impl Validator for MyAppAdmission {
    type Object = MyApp;

    fn validate_create(app: &MyApp) -> Verdict {
        let mut verdict = Verdict::default();
        check_image(&mut verdict, "spec.image", &app.spec.image);
        verdict
    }
}

#[cfg(test)]
mod tests {
    use apis::MyAppSpec;

    use super::*;

    fn myapp(image: &str) -> MyApp {
        MyApp::new(
            "a",
            MyAppSpec {
                replicas: 1,
                image: image.to_owned(),
            },
        )
    }

    #[test]
    fn the_image_is_trimmed() {
        let mut app = myapp("\tnginx:1.29 ");
        assert_eq!(MyAppAdmission::default_fields(&mut app).len(), 1);
        assert_eq!(app.spec.image, "nginx:1.29");
        assert!(MyAppAdmission::default_fields(&mut app).is_empty());
    }

    #[test]
    fn a_malformed_image_is_refused_and_an_untagged_one_warned_about() {
        let verdict = MyAppAdmission::validate_create(&myapp("nginx:"));
        assert_eq!(verdict.refusals[0].field, "spec.image");
        assert!(
            verdict.refusals[0].detail.contains("malformed tag"),
            "{verdict:?}"
        );
        let verdict = MyAppAdmission::validate_create(&myapp("nginx"));
        assert!(verdict.refusals.is_empty());
        assert_eq!(verdict.warnings.len(), 1);
    }
}
