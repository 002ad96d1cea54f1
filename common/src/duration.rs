//! Durations on the command line and in environment variables, parsed the same way by
//! both binaries (and matching the Go-style values the Helm chart passes): `500ms`,
//! `15s`, `10m`, `1h30m`, ISO 8601 `PT15S`, or a bare number of seconds.

use std::time::Duration;

/// Parses a non-negative duration; the error names the input and what is accepted.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|e| format!("invalid duration {s:?}: {e}"));
    }
    let signed: jiff::SignedDuration = s.parse().map_err(|e| {
        format!("invalid duration {s:?} (expected e.g. 500ms, 15s, 10m, 1h30m): {e}")
    })?;
    Duration::try_from(signed).map_err(|_| format!("duration {s:?} must not be negative"))
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
            assert!(err.contains("duration"), "{bad}: {err}");
        }
    }
}
