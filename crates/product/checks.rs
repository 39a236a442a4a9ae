//! The shape of the product's names, checked when they are read (`build.rs`), with tests.

/// A lowercase RFC 1123 label of at most `max` characters, or why `value` (of `key`) is not.
pub fn label(key: &str, value: &str, max: usize) -> Result<(), String> {
    let valid = !value.is_empty()
        && value.len() <= max
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{key} = {value:?}: must be lowercase letters, digits and '-', start and end with a \
             letter or digit, and have at most {max} characters"
        ))
    }
}

/// A lowercase RFC 1123 subdomain with at least one dot, or why `value` (of `key`) is not.
pub fn subdomain(key: &str, value: &str) -> Result<(), String> {
    if value.len() > 253 || !value.contains('.') {
        return Err(format!(
            "{key} = {value:?}: must be a DNS name with at least one dot, at most 253 characters"
        ));
    }
    value.split('.').try_for_each(|part| label(key, part, 63))
}
