//! The value rules Envoy applies to a bootstrap before it runs it, for the
//! values tunnel-agent acts on: protobuf JSON's `Duration` form and range,
//! Envoy's own bound on every duration (`strict_duration_validation`), and
//! the protoc-gen-validate (PGV) rules its API declares on the fields read
//! here. The same bounds hold for the flags that set those values, so a
//! reload or a command line cannot bring in what Envoy would refuse.

use std::time::Duration;

/// The largest `google.protobuf.Duration` protobuf accepts: ±10,000 years.
pub const PROTOBUF_MAX_SECONDS: u64 = 315_576_000_000;

/// The largest duration Envoy accepts anywhere in its configuration
/// (`validateDurationUnifiedNoThrow`: (i64::MAX - 999,999,999) ns, about
/// 292 years, so that no conversion to nanoseconds overflows).
pub const ENVOY_MAX_SECONDS: u64 = 9_223_372_035;

/// PGV `gte: 1ms` on `KeepaliveSettings.interval`, `.timeout` and
/// `.connection_idle_interval`: a PING every nanosecond would make the
/// connection flap.
pub const MIN_KEEPALIVE: Duration = Duration::from_millis(1);

/// Parses a protobuf JSON `Duration` (`"5s"`, `"0.1s"`, `"1.000000001s"`)
/// as Envoy would accept it: the form protobuf's JSON parser reads (an
/// optional sign, decimal seconds with at most nine fractional digits, `s`),
/// within protobuf's range, not negative, and within Envoy's bound.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || format!("{s:?} is not a duration like \"5s\" or \"0.25s\"");
    let body = s.strip_suffix('s').ok_or_else(bad)?;
    let (negative, body) = match body.as_bytes().first() {
        Some(b'-') => (true, &body[1..]),
        Some(b'+') => (false, &body[1..]),
        _ => (false, body),
    };
    let (int, frac) = match body.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (body, None),
    };
    let digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
    // protobuf: "0" or no leading zero; something before or after the dot.
    let int_ok = digits(int) && (int.len() <= 1 || !int.starts_with('0'));
    let frac_ok = frac.is_none_or(|f| f.len() <= 9 && digits(f));
    if !int_ok || !frac_ok || (int.is_empty() && frac.is_none_or(str::is_empty)) {
        return Err(bad());
    }
    // Digits beyond u64 are beyond every bound below.
    let secs: u64 = if int.is_empty() {
        0
    } else {
        int.parse().unwrap_or(u64::MAX)
    };
    let nanos: u32 = match frac {
        Some(f) if !f.is_empty() => {
            let n: u32 = f.parse().map_err(|_| bad())?;
            n * 10u32.pow(9 - f.len() as u32)
        }
        _ => 0,
    };
    if secs > PROTOBUF_MAX_SECONDS {
        return Err(format!(
            "{s:?} is out of protobuf's Duration range (at most {PROTOBUF_MAX_SECONDS} s)"
        ));
    }
    if negative && (secs > 0 || nanos > 0) {
        return Err(format!("{s:?}: a duration must not be negative"));
    }
    let d = Duration::new(secs, nanos);
    check_envoy_bound(d).map_err(|e| format!("{s:?}: {e}"))?;
    Ok(d)
}

/// Envoy's bound on every duration in its configuration.
pub fn check_envoy_bound(d: Duration) -> Result<(), String> {
    if d.as_secs() > ENVOY_MAX_SECONDS {
        return Err(format!(
            "longer than Envoy accepts for any duration ({ENVOY_MAX_SECONDS} s, about 292 years)"
        ));
    }
    Ok(())
}

/// PGV `gt: 0s` (`Cluster.connect_timeout`).
pub fn check_positive(d: Duration) -> Result<(), String> {
    if d.is_zero() {
        return Err("must be greater than 0s".into());
    }
    Ok(())
}

/// PGV `gte: 1ms` (`KeepaliveSettings` durations).
pub fn check_keepalive(d: Duration) -> Result<(), String> {
    if d < MIN_KEEPALIVE {
        return Err(format!(
            "{d:?} is shorter than 1ms, the least Envoy accepts for an HTTP/2 keepalive"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str) -> String {
        match parse_duration(text) {
            Ok(d) => panic!("{text:?} accepted as {d:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn durations_as_protobuf_json_within_envoys_bounds() {
        for (text, want) in [
            ("0.1s", Duration::from_millis(100)),
            ("30s", Duration::from_secs(30)),
            ("1.5s", Duration::from_millis(1500)),
            ("0s", Duration::ZERO),
            ("-0s", Duration::ZERO),
            ("+2s", Duration::from_secs(2)),
            (".5s", Duration::from_millis(500)),
            ("5.s", Duration::from_secs(5)),
            ("0.000000001s", Duration::from_nanos(1)),
            (
                "9223372035.999999999s",
                Duration::new(9_223_372_035, 999_999_999),
            ),
        ] {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
        for bad in [
            "",
            "s",
            "5",
            "5m",
            "1e3s",
            "NaNs",
            "infs",
            "1.2.3s",
            ".s",
            "05s",
            "1.0000000001s",
            " 5s",
            "5 s",
        ] {
            let e = refused(bad);
            assert!(e.contains("is not a duration"), "{bad}: {e}");
        }
        let e = refused("-1s");
        assert!(e.contains("negative"), "{e}");
        // 10^17 s: beyond protobuf's own range.
        let e = refused("100000000000000000s");
        assert!(e.contains("protobuf"), "{e}");
        let e = refused("99999999999999999999999s");
        assert!(e.contains("protobuf"), "{e}");
        // Within protobuf's, beyond Envoy's.
        let e = refused("9223372036s");
        assert!(e.contains("292 years"), "{e}");
    }

    #[test]
    fn pgv_rules() {
        assert!(check_keepalive(Duration::from_nanos(1)).is_err());
        assert!(check_keepalive(Duration::from_micros(999)).is_err());
        assert!(check_keepalive(Duration::from_millis(1)).is_ok());
        assert!(check_positive(Duration::ZERO).is_err());
        assert!(check_positive(Duration::from_nanos(1)).is_ok());
    }
}
