//! A minimal JSON writer for inference responses, byte-compatible with what Triton's rapidjson
//! writer produces where clients can tell: strings are written byte for byte (a `BYTES` output
//! that is not UTF-8 is sent as is, as Triton does), and non-finite floats are written as `NaN`,
//! `Infinity` and `-Infinity` (rapidjson's `kWriteNanAndInfFlag`).

/// Appends `s` as a JSON string, escaping `"`, `\` and control characters; every other byte is
/// copied unchanged.
pub(crate) fn string(out: &mut Vec<u8>, s: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    out.reserve(s.len() + 2);
    out.push(b'"');
    let mut start = 0;
    for (i, &b) in s.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0..=0x1f => &[],
            _ => continue,
        };
        out.extend_from_slice(&s[start..i]);
        if esc.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(esc);
        }
        start = i + 1;
    }
    out.extend_from_slice(&s[start..]);
    out.push(b'"');
}

/// Appends `"key":`.
pub(crate) fn key(out: &mut Vec<u8>, k: &str) {
    string(out, k.as_bytes());
    out.push(b':');
}

/// Appends an unsigned integer.
pub(crate) fn uint(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// Appends a signed integer.
pub(crate) fn int(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

/// Appends a double in its shortest round-trip form (`1.0`, `0.1`, `1e300`), or `NaN`,
/// `Infinity`, `-Infinity`.
pub(crate) fn double(out: &mut Vec<u8>, v: f64) {
    if v.is_nan() {
        out.extend_from_slice(b"NaN");
    } else if v.is_infinite() {
        out.extend_from_slice(if v > 0.0 { b"Infinity" } else { b"-Infinity" });
    } else {
        out.extend_from_slice(ryu::Buffer::new().format_finite(v).as_bytes());
    }
}

/// Appends `true` or `false`.
pub(crate) fn boolean(out: &mut Vec<u8>, v: bool) {
    out.extend_from_slice(if v { b"true" } else { b"false" });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        string(&mut out, bytes);
        out
    }

    #[test]
    fn strings_are_escaped_and_parse_back() {
        let text = "a\"b\\c\nd\te\u{1}f/é😀";
        let out = s(text.as_bytes());
        let back: String = serde_json::from_slice(&out).expect("valid JSON");
        assert_eq!(back, text);
        assert_eq!(&out[..], "\"a\\\"b\\\\c\\nd\\te\\u0001f/é😀\"".as_bytes());
    }

    #[test]
    fn non_utf8_bytes_are_copied_raw() {
        assert_eq!(s(&[0xff, b'a', 0xfe]), vec![b'"', 0xff, b'a', 0xfe, b'"']);
    }

    #[test]
    fn numbers() {
        let mut out = Vec::new();
        double(&mut out, 1.0);
        out.push(b',');
        double(&mut out, f64::from(0.1f32));
        out.push(b',');
        double(&mut out, f64::NAN);
        out.push(b',');
        double(&mut out, f64::NEG_INFINITY);
        out.push(b',');
        int(&mut out, -5);
        out.push(b',');
        uint(&mut out, u64::MAX);
        assert_eq!(
            String::from_utf8(out).expect("utf8"),
            "1.0,0.10000000149011612,NaN,-Infinity,-5,18446744073709551615"
        );
    }
}
