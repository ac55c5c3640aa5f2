//! Header forwarding (`--http-header-forward-pattern`, `--grpc-header-forward-pattern`): the
//! headers of an inference request whose names match a regular expression become string
//! parameters of the request, which the model reads in `request.parameters()`, as Triton's
//! `ForwardHeaders` (`src/http_server.cc`) and `ForwardHeadersAsParameters`
//! (`src/grpc/infer_handler.h`) do. One implementation for both frontends.

use regex::Regex;

use crate::types::{ErrorKind, InferError, ParamValue};

/// The parameter keys Triton keeps for itself (`kReservedParameterKeys` in `src/common.h`); a
/// matching header with one of these names, or starting with `triton_`, fails the request.
pub const RESERVED_PARAMETER_KEYS: [&str; 7] =
    ["sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers", "binary_data_output"];

/// A compiled forwarding pattern.
#[derive(Debug, Clone)]
pub struct HeaderForward {
    regex: Regex,
}

impl HeaderForward {
    /// Compiles `pattern`; a header is forwarded when the pattern matches anywhere in its name
    /// (RE2's `PartialMatch`, as Triton).
    pub fn new(pattern: &str) -> Result<Self, regex::Error> {
        Ok(Self { regex: Regex::new(pattern)? })
    }

    /// The parameters for a request's headers, given as (name, value) pairs with the names
    /// lowercase as HTTP/2 and hyper deliver them. A value that is not UTF-8 is forwarded with
    /// its invalid bytes replaced.
    pub fn parameters<'a>(
        &self,
        headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> Result<Vec<(String, ParamValue)>, InferError> {
        let mut out = Vec::new();
        for (name, value) in headers {
            if !self.regex.is_match(name) {
                continue;
            }
            if RESERVED_PARAMETER_KEYS.contains(&name) || name.starts_with("triton_") {
                return Err(InferError::new(
                    ErrorKind::InvalidArg,
                    format!("Header '{name}' is reserved for Triton usage and cannot be forwarded."),
                ));
            }
            out.push((name.to_string(), ParamValue::Str(String::from_utf8_lossy(value).into_owned())));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matching_headers_become_string_parameters() {
        let f = HeaderForward::new("^x-team|trace").expect("pattern");
        let headers = [
            ("x-team-name", &b"blue"[..]),
            ("content-type", b"application/json"),
            ("my-traceparent", b"00-ab"),
            ("x-other", b"no"),
        ];
        let got = f.parameters(headers).expect("forwarded");
        assert_eq!(
            got,
            vec![
                ("x-team-name".to_string(), ParamValue::Str("blue".into())),
                ("my-traceparent".to_string(), ParamValue::Str("00-ab".into()))
            ]
        );
    }

    #[test]
    fn reserved_names_fail_the_request_with_tritons_text() {
        let f = HeaderForward::new(".*").expect("pattern");
        for name in ["priority", "triton_enable_empty_final_response"] {
            let e = f.parameters([(name, &b"1"[..])]).expect_err("reserved");
            assert_eq!(e.kind, ErrorKind::InvalidArg);
            assert_eq!(e.message, format!("Header '{name}' is reserved for Triton usage and cannot be forwarded."));
        }
        assert!(HeaderForward::new("(").is_err());
    }
}
