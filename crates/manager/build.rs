//! Records what `manager --version` reports beside the crate's version: the git revision the
//! binary was built from and the date of the build (`SOURCE_DATE_EPOCH` when set, for a
//! reproducible build). Outside a git checkout the revision is `unknown`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

fn main() {
    let revision = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=MANAGER_GIT_REVISION={revision}");
    println!("cargo:rustc-env=MANAGER_BUILD_DATE={}", build_date());
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    // Built again when the checkout moves to another commit, and only then: a path that does
    // not exist would make every build run this again.
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]).map(PathBuf::from) {
        let head = dir.join("HEAD");
        let mut watched = vec![head.clone(), dir.join("packed-refs")];
        if let Some(branch) = std::fs::read_to_string(&head)
            .ok()
            .and_then(|h| h.strip_prefix("ref: ").map(|r| r.trim().to_owned()))
        {
            watched.push(dir.join(branch));
        }
        for path in watched.iter().filter(|p| Path::exists(p)) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}

/// What `git args` prints, trimmed; `None` without git or outside a checkout.
fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    (output.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}

/// The build's date and time in UTC, RFC 3339 (`2026-12-06T03:04:05Z`).
fn build_date() -> String {
    let seconds = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .unwrap_or_else(|| {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            i64::try_from(now.as_secs()).unwrap_or_default()
        });
    let (days, of_day) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}
