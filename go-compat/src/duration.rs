//! Go's `time.Duration` text form (`1h0m0s`, `100ms`, `1.5s`), which upstream
//! manifests and test frameworks pass verbatim.

use std::time::Duration;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("time: invalid duration {0:?}")]
pub struct InvalidDuration(pub String);

/// Parses a duration the way Go's `time.ParseDuration` does. Negative values are
/// rejected because no flag here means anything by them.
pub fn parse(s: &str) -> Result<Duration, InvalidDuration> {
    let err = || InvalidDuration(s.to_string());
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest.starts_with('-') {
        return Err(err());
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(err());
    }
    let mut total_nanos: u128 = 0;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        let (num, tail) = rest.split_at(num_end);
        if num.is_empty() || num == "." {
            return Err(err());
        }
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        let scale: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3600 * 1_000_000_000,
            _ => return Err(err()),
        };
        let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
        if frac_part.contains('.') {
            return Err(err());
        }
        let int: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| err())?
        };
        let mut nanos = int.checked_mul(scale).ok_or_else(err)?;
        // Fractions are exact down to the nanosecond, like Go.
        let mut frac_scale = scale;
        for d in frac_part.bytes() {
            frac_scale /= 10;
            nanos += u128::from(d - b'0') * frac_scale;
        }
        total_nanos = total_nanos.checked_add(nanos).ok_or_else(err)?;
        rest = tail;
    }
    let secs = u64::try_from(total_nanos / 1_000_000_000).map_err(|_| err())?;
    Ok(Duration::new(secs, (total_nanos % 1_000_000_000) as u32))
}

/// Formats like Go's `Duration.String()`: `1h0m0s`, `1.5s`, `100ms`, `0s`.
pub fn format(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    if nanos < 1_000_000_000 {
        let (unit, scale) = if nanos < 1_000 {
            ("ns", 1)
        } else if nanos < 1_000_000 {
            ("µs", 1_000)
        } else {
            ("ms", 1_000_000)
        };
        return format!("{}{unit}", frac(nanos, scale));
    }
    let hours = nanos / 3_600_000_000_000;
    let mins = (nanos / 60_000_000_000) % 60;
    let secs = frac(nanos % 60_000_000_000, 1_000_000_000);
    if hours > 0 {
        format!("{hours}h{mins}m{secs}s")
    } else if mins > 0 {
        format!("{mins}m{secs}s")
    } else {
        format!("{secs}s")
    }
}

fn frac(v: u128, scale: u128) -> String {
    let int = v / scale;
    let rem = v % scale;
    if rem == 0 {
        return int.to_string();
    }
    let width = scale.ilog10() as usize;
    let digits = format!("{rem:0width$}");
    format!("{int}.{}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_forms() {
        let cases = [
            ("0", Duration::ZERO),
            ("1h0m0s", Duration::from_secs(3600)),
            ("100ms", Duration::from_millis(100)),
            ("1.5s", Duration::from_millis(1500)),
            ("2m30s", Duration::from_secs(150)),
            ("300us", Duration::from_micros(300)),
            ("300µs", Duration::from_micros(300)),
            ("1ns", Duration::from_nanos(1)),
            (".5s", Duration::from_millis(500)),
            ("10s", Duration::from_secs(10)),
        ];
        for (s, want) in cases {
            assert_eq!(parse(s), Ok(want), "{s}");
        }
    }

    #[test]
    fn rejects_what_go_rejects() {
        for s in ["", "1", "-1s", "1x", "s", "1.2.3s", ".s", "1h-2m"] {
            assert!(parse(s).is_err(), "{s:?} should be rejected");
        }
    }

    #[test]
    fn formats_like_go_and_round_trips() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_millis(100), "100ms"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_micros(1), "1µs"),
        ];
        for (d, want) in cases {
            assert_eq!(format(d), want);
            assert_eq!(parse(want), Ok(d));
        }
    }
}
