//! `MyApp` admission: the image trimmed of copied whitespace, and refused when malformed.

use apis::MyApp;

use super::{check_image, trim_image};
use crate::webhook::{AdmissionWebhook, Defaulter, Validator, Verdict};

/// The webhooks the MyApp controller declares.
pub fn webhooks() -> Vec<AdmissionWebhook> {
    vec![
        AdmissionWebhook::defaulting::<MyApp>(),
        AdmissionWebhook::validating::<MyApp>(),
    ]
}

impl Defaulter for MyApp {
    fn default_fields(&mut self) -> Vec<String> {
        let image = &mut self.spec.image;
        if trim_image(image) {
            vec![format!(
                "spec.image: surrounding whitespace removed, {image:?} is used"
            )]
        } else {
            Vec::new()
        }
    }
}

impl Validator for MyApp {
    fn validate_create(&self) -> Verdict {
        let mut verdict = Verdict::default();
        check_image(&mut verdict, "spec.image", &self.spec.image);
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
        assert_eq!(app.default_fields().len(), 1);
        assert_eq!(app.spec.image, "nginx:1.29");
        assert!(app.default_fields().is_empty());
    }

    #[test]
    fn a_malformed_image_is_refused_and_an_untagged_one_warned_about() {
        let verdict = myapp("nginx:").validate_create();
        assert_eq!(verdict.refusals[0].field, "spec.image");
        assert!(
            verdict.refusals[0].detail.contains("malformed tag"),
            "{verdict:?}"
        );
        let verdict = myapp("nginx").validate_create();
        assert!(verdict.refusals.is_empty());
        assert_eq!(verdict.warnings.len(), 1);
    }
}
