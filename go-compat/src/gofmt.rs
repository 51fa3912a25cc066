//! Go's formatting of numbers and strings, where our output must match what
//! a Go program prints byte for byte (Prometheus exposition, klog lines).

use std::fmt::Write as _;

/// `strconv.FormatFloat(f, 'g', -1, 64)`, as client_golang writes sample
/// values and bucket bounds: the shortest digits that read back as `f`, in
/// exponent form (`1e-06`, `2.26285087e+08`) when the decimal exponent is
/// below -4 or at least 6 (Go's rule for the shortest 'g' format).
pub fn go_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    if f == 0.0 {
        return if f.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "1.5e-7", "2e0".
    let e = format!("{f:e}");
    let (mantissa, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if !(-4..6).contains(&exp) {
        let mut out = String::with_capacity(mantissa.len() + 5);
        out.push_str(mantissa);
        let _ = write!(
            out,
            "e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.unsigned_abs()
        );
        out
    } else {
        format!("{f}")
    }
}

/// Go's `strconv.Quote`: `"` and `\` escaped, the usual control escapes,
/// other control characters as `\x`/`\u` escapes, printable Unicode kept.
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_as_go_writes_them() {
        for (f, want) in [
            (0.000001, "1e-06"),
            (0.00001, "1e-05"),
            (0.0001, "0.0001"),
            (0.005, "0.005"),
            (12.5, "12.5"),
            (10.0, "10"),
            (1.0, "1"),
            (100000.0, "100000"),
            (1e6, "1e+06"),
            (1234567.0, "1.234567e+06"),
            (20000.0, "20000"),
            (2.26285087e8, "2.26285087e+08"),
            (1.7955745164e9, "1.7955745164e+09"),
            (18446744073709551615.0, "1.8446744073709552e+19"),
            (f64::INFINITY, "+Inf"),
            (0.0, "0"),
            (-2.5, "-2.5"),
        ] {
            assert_eq!(go_float(f), want, "{f}");
        }
    }

    #[test]
    fn quotes_as_strconv_quote() {
        assert_eq!(go_quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(go_quote("\u{1}\t\u{7f}é"), "\"\\x01\\t\\x7fé\"");
        assert_eq!(go_quote("\u{85}"), "\"\\u0085\"");
    }
}
