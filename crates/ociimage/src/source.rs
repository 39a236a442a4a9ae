//! Where an image's timestamp and revision come from, so rebuilding the same sources gives the
//! same bytes.

use std::path::Path;
use std::process::Command;

use crate::Error;

/// The time to stamp on an image built from the sources in `repository`, in seconds since 1970.
///
/// `SOURCE_DATE_EPOCH` when set (the convention reproducible builds share), else the time of the
/// last commit, else 0. Never the current time: that would change the digest on every build.
///
/// # Errors
///
/// [`Error::SourceDateEpoch`] when the variable is set but is not a number.
pub fn source_date_epoch(repository: &Path) -> Result<u64, Error> {
    epoch_from(std::env::var("SOURCE_DATE_EPOCH").ok(), repository)
}

fn epoch_from(variable: Option<String>, repository: &Path) -> Result<u64, Error> {
    if let Some(value) = variable {
        return value
            .trim()
            .parse()
            .map_err(|_| Error::SourceDateEpoch { value });
    }
    Ok(git(repository, &["log", "-1", "--format=%ct"])
        .and_then(|out| out.parse().ok())
        .unwrap_or(0))
}

/// The commit checked out in `repository`, if it is a git work tree and git is installed.
pub fn git_revision(repository: &Path) -> Option<String> {
    git(repository, &["rev-parse", "HEAD"])
}

fn git(repository: &Path, args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .arg("-C")
        .arg(repository)
        .args(args)
        .output()
        .ok()?;
    let out = String::from_utf8(output.stdout).ok()?;
    let out = out.trim();
    (output.status.success() && !out.is_empty()).then(|| out.to_owned())
}

/// `epoch` (seconds since 1970, UTC) as RFC 3339, e.g. `2024-05-01T12:00:00Z`: the form of the
/// image config's `created` and the `org.opencontainers.image.created` annotation.
pub fn rfc3339(epoch: u64) -> String {
    let days = epoch / 86_400;
    let seconds = epoch % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's `civil_from_days`,
/// restricted to dates after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(4_107_542_399), "2100-02-28T23:59:59Z");
    }

    #[test]
    fn a_directory_outside_git_has_no_revision_and_time_zero() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(git_revision(dir.path()), None);
        assert_eq!(epoch_from(None, dir.path()).unwrap(), 0);
    }

    #[test]
    fn source_date_epoch_wins_and_must_be_a_number() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            epoch_from(Some("1700000000\n".into()), dir.path()).unwrap(),
            1_700_000_000
        );
        let error = epoch_from(Some("yesterday".into()), dir.path()).unwrap_err();
        assert!(error.to_string().contains("\"yesterday\""), "{error}");
    }
}
