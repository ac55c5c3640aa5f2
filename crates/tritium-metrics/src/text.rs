//! Prometheus text exposition helpers: name checks, escaping and number formatting.

use std::fmt::Write;

/// Whether `name` is a valid Prometheus metric name: `[a-zA-Z_:][a-zA-Z0-9_:]*`, not starting
/// with `__` (reserved for Prometheus' internal use). The same rule as prometheus-cpp's
/// `CheckMetricName`, which Triton uses.
pub(crate) fn is_valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':' => {}
        _ => return false,
    }
    !name.starts_with("__") && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Whether `name` is a valid Prometheus label name: `[a-zA-Z_][a-zA-Z0-9_]*`, not starting with
/// `__` (prometheus-cpp's `CheckLabelName`).
pub(crate) fn is_valid_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
        _ => return false,
    }
    !name.starts_with("__") && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Appends a label value escaped for the text format: `\` as `\\`, `"` as `\"`, newline as `\n`.
pub(crate) fn push_label_value(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Appends a HELP text escaped for the text format: `\` as `\\`, newline as `\n`.
pub(crate) fn push_help(out: &mut String, help: &str) {
    for c in help.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Appends a sample value the way Prometheus parses it back exactly: integers without a
/// fraction (`3`, as Triton prints them), other finite values in Rust's shortest round-trip
/// form (`0.1`, `1e-7`), and `NaN`, `+Inf`, `-Inf`.
pub(crate) fn push_value(out: &mut String, value: f64) {
    if value.is_nan() {
        out.push_str("NaN");
    } else if value.is_infinite() {
        out.push_str(if value > 0.0 { "+Inf" } else { "-Inf" });
    } else if value.fract() == 0.0 && value.abs() < 9_007_199_254_740_992.0 {
        // Exactly representable integer (|v| < 2^53): print it without ".0".
        let _ = write!(out, "{}", value as i64);
    } else {
        let _ = write!(out, "{value:?}");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn value(v: f64) -> String {
        let mut s = String::new();
        push_value(&mut s, v);
        s
    }

    #[test]
    fn metric_names() {
        for ok in ["a", "_a", ":a", "a:b_c9", "requests_process_latency_ns", "A"] {
            assert!(is_valid_metric_name(ok), "{ok}");
        }
        for bad in ["", "9a", "a-b", "a b", "__a", "é", "a.b"] {
            assert!(!is_valid_metric_name(bad), "{bad}");
        }
    }

    #[test]
    fn label_names() {
        for ok in ["a", "_a", "model", "a9_b"] {
            assert!(is_valid_label_name(ok), "{ok}");
        }
        for bad in ["", "9a", "a:b", "a-b", "__name__", "é"] {
            assert!(!is_valid_label_name(bad), "{bad}");
        }
    }

    #[test]
    fn values() {
        assert_eq!(value(0.0), "0");
        assert_eq!(value(-0.0), "0");
        assert_eq!(value(3.0), "3");
        assert_eq!(value(-7.0), "-7");
        assert_eq!(value(7.5), "7.5");
        assert_eq!(value(0.1), "0.1");
        assert_eq!(value(1e-7), "1e-7");
        assert_eq!(value(1e300), "1e300");
        assert_eq!(value(f64::NAN), "NaN");
        assert_eq!(value(f64::INFINITY), "+Inf");
        assert_eq!(value(f64::NEG_INFINITY), "-Inf");
        assert_eq!(value(1e20).parse::<f64>().ok(), Some(1e20));
    }

    #[test]
    fn escaping() {
        let mut s = String::new();
        push_label_value(&mut s, "a\\b\"c\nd");
        assert_eq!(s, r#"a\\b\"c\nd"#);
        let mut h = String::new();
        push_help(&mut h, "a\\b\"c\nd");
        assert_eq!(h, r#"a\\b"c\nd"#);
    }
}
