//! `--wait`: a human duration (`10s`, `2m`, `250ms`), `forever` or `none`.

use std::time::Duration;

use distlock::Wait;

/// Parse a `--wait` value.
pub(crate) fn parse_wait(text: &str) -> Result<Wait, String> {
    match text.trim() {
        "forever" => Ok(Wait::Forever),
        "none" | "0" => Ok(Wait::No),
        other => parse_duration(other).map(Wait::UpTo),
    }
}

/// Parse a human duration (`30s`, `5m`, `1h 30m`, `250ms`).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{e} (expected a duration such as 250ms, 30s, 5m or 1h)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_and_durations() {
        assert_eq!(parse_wait("forever"), Ok(Wait::Forever));
        assert_eq!(parse_wait("none"), Ok(Wait::No));
        assert_eq!(parse_wait("10s"), Ok(Wait::UpTo(Duration::from_secs(10))));
        assert_eq!(
            parse_wait("250ms"),
            Ok(Wait::UpTo(Duration::from_millis(250)))
        );
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        for bad in ["", "ten", "5x", "-1s"] {
            assert!(parse_wait(bad).is_err(), "{bad:?} accepted");
        }
    }
}
