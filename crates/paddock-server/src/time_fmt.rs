//! RFC 3339 timestamps, as the OpenSandbox API writes them.

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Milliseconds since the epoch → `2026-11-29T17:20:00.123Z`.
pub fn rfc3339(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_default()
}

/// An RFC 3339 timestamp (any offset) → milliseconds since the epoch.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    OffsetDateTime::parse(s, &Rfc3339).ok().and_then(|t| i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_accepts_offsets() {
        let ms = 1_795_000_000_123;
        assert_eq!(parse_rfc3339(&rfc3339(ms)), Some(ms));
        assert!(rfc3339(ms).ends_with('Z'));
        assert_eq!(parse_rfc3339("2026-01-01T01:00:00+01:00"), parse_rfc3339("2026-01-01T00:00:00Z"));
        assert_eq!(parse_rfc3339("yesterday"), None);
    }
}
