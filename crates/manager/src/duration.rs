//! Durations written the way Kubernetes tools write them: `15s`, `500ms`, `1m30s`.
//!
//! The grammar is Go's `time.ParseDuration` (which controller-runtime's flags use) without the
//! sign: one or more `<number><unit>` pairs, the number may have a fraction, units are `ns`,
//! `us` (or `µs`), `ms`, `s`, `m` and `h`. A bare `0` is zero; any other bare number is refused,
//! because `15` could mean seconds or milliseconds.
//!
//! Why not `kube::core::Duration`, which parses the same grammar: its parser panics on a value
//! that overflows (it multiplies with `Duration::mul_f64`), so `--lease-duration=9999999999999h`
//! would abort the manager instead of exiting 2 with the key named; it takes an empty string as
//! zero and accepts negative durations, which no setting here means; and it prints `3600s` for
//! an hour, where error messages and the effective configuration should echo what users write
//! (`1h`: see [`Display`]).

use std::fmt;
use std::time::Duration;

/// Why a duration did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {reason} (expected e.g. `15s`, `500ms`, `1m30s`)")]
pub struct ParseDurationError {
    input: String,
    reason: &'static str,
}

/// Parses a duration such as `15s`, `500ms` or `1m30s`.
///
/// # Errors
/// When the text is empty, negative, has a number without a unit (other than `0`), has an
/// unknown unit or overflows.
pub fn parse(input: &str) -> Result<Duration, ParseDurationError> {
    let fail = |reason| ParseDurationError {
        input: input.to_owned(),
        reason,
    };
    let text = input.trim();
    if text.is_empty() {
        return Err(fail("empty"));
    }
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.starts_with('-') {
        return Err(fail("negative"));
    }
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(number_len);
        if number.is_empty() || number == "." {
            return Err(fail("expected a number"));
        }
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let nanos_per_unit: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(fail("missing unit")),
            _ => return Err(fail("unknown unit")),
        };
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if fraction.contains('.') {
            return Err(fail("expected a number"));
        }
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| fail("number too large"))?
        };
        let mut nanos = whole
            .checked_mul(nanos_per_unit)
            .ok_or_else(|| fail("too large"))?;
        // Fractional digits beyond nanosecond precision are dropped, as Go does.
        let mut scale = nanos_per_unit;
        for digit in fraction.bytes() {
            scale /= 10;
            if scale == 0 {
                break;
            }
            nanos += u128::from(digit - b'0') * scale;
        }
        total = total.checked_add(nanos).ok_or_else(|| fail("too large"))?;
        rest = tail;
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| fail("too large"))?;
    // The remainder is below 10^9 and fits.
    let subsec = u32::try_from(total % 1_000_000_000).map_err(|_| fail("too large"))?;
    Ok(Duration::new(secs, subsec))
}

/// Displays a duration in the shortest exact form [`parse`] reads back: `15s`, `1500ms`,
/// `250us`, `0s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Display(pub Duration);

impl fmt::Display for Display {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        let nanos = d.subsec_nanos();
        if nanos == 0 {
            write!(f, "{}s", d.as_secs())
        } else if nanos.is_multiple_of(1_000_000) {
            write!(f, "{}ms", d.as_millis())
        } else if nanos.is_multiple_of(1_000) {
            write!(f, "{}us", d.as_micros())
        } else {
            write!(f, "{}ns", d.as_nanos())
        }
    }
}

/// `#[serde(with = "crate::duration::serde")]`: a duration as text (`15s`).
pub mod serde {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer, de};

    /// Writes the duration as text, e.g. `15s`.
    ///
    /// # Errors
    /// Only those of the serializer.
    pub fn serialize<S: Serializer>(value: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&super::Display(*value))
    }

    /// Reads a duration from text such as `15s`; a bare integer is accepted only when it is 0.
    ///
    /// # Errors
    /// When the value is not a string, or not a valid duration.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Number(u64),
        }
        match Raw::deserialize(deserializer) {
            Ok(Raw::Text(text)) => super::parse(&text).map_err(de::Error::custom),
            Ok(Raw::Number(0)) => Ok(Duration::ZERO),
            Ok(Raw::Number(n)) => Err(de::Error::custom(format!(
                "invalid duration {n}: missing unit (expected e.g. `15s`, `500ms`, `1m30s`)"
            ))),
            Err(_) => Err(de::Error::custom(
                "expected a duration such as `15s`, `500ms` or `1m30s`",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_style_durations() {
        let cases = [
            ("15s", Duration::from_secs(15)),
            ("500ms", Duration::from_millis(500)),
            ("1m30s", Duration::from_secs(90)),
            ("1h", Duration::from_secs(3600)),
            ("1.5s", Duration::from_millis(1500)),
            (".5s", Duration::from_millis(500)),
            ("250us", Duration::from_micros(250)),
            ("250µs", Duration::from_micros(250)),
            ("10ns", Duration::from_nanos(10)),
            ("0", Duration::ZERO),
            ("0s", Duration::ZERO),
            (" 2s ", Duration::from_secs(2)),
            ("1h2m3s4ms", Duration::new(3723, 4_000_000)),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn refuses_bad_durations() {
        for text in [
            "",
            "15",
            "-1s",
            "1x",
            "s",
            "1.2.3s",
            "ms5",
            "1s2",
            "99999999999999999999999h",
        ] {
            assert!(parse(text).is_err(), "{text} should not parse");
        }
        let message = parse("15").map(|_| ()).unwrap_err().to_string();
        assert!(
            message.contains("missing unit") && message.contains("\"15\""),
            "{message}"
        );
    }

    #[test]
    fn displays_what_it_parses() {
        for d in [
            Duration::from_secs(15),
            Duration::from_millis(1500),
            Duration::from_micros(3),
            Duration::from_nanos(7),
            Duration::ZERO,
        ] {
            let text = Display(d).to_string();
            assert_eq!(parse(&text), Ok(d), "{text}");
        }
        assert_eq!(Display(Duration::from_secs(15)).to_string(), "15s");
        assert_eq!(Display(Duration::from_millis(500)).to_string(), "500ms");
    }
}
