//! Durations on the command line and in environment variables, parsed the same way by
//! both binaries (and matching the Go-style values the Helm chart passes): `500ms`,
//! `15s`, `10m`, `1h30m`, ISO 8601 `PT15S`, or a bare number of seconds.

use std::time::Duration;

/// Why a duration was refused; the message names the input and what is accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("invalid duration {input:?} (expected e.g. 500ms, 15s, 10m, 1h30m): {reason}")]
    Invalid { input: String, reason: String },
    #[error("duration {0:?} must not be negative")]
    Negative(String),
}

/// Parses a non-negative duration.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let s = s.trim();
    let invalid = |reason: &dyn std::fmt::Display| DurationError::Invalid {
        input: s.to_owned(),
        reason: reason.to_string(),
    };
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|e| invalid(&e));
    }
    let signed: jiff::SignedDuration = s.parse().map_err(|e| invalid(&e))?;
    Duration::try_from(signed).map_err(|_| DurationError::Negative(s.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_forms() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("PT15S"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration(" 2 "), Ok(Duration::from_secs(2)));
    }

    #[test]
    fn rejected_forms() {
        for bad in ["", "x", "soon", "-1s", "1d", "15 parsecs"] {
            let err = parse_duration(bad).expect_err(bad);
            assert!(err.to_string().contains("duration"), "{bad}: {err}");
        }
    }
}
