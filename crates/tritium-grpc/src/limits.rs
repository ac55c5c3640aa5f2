//! `--grpc-max-message-size`: tonic refuses a request message over the limit with
//! `OUT_OF_RANGE` and its own text; gRPC's C++ core (and so Triton) answers `RESOURCE_EXHAUSTED`.
//! [`name_the_flag`] rewrites that answer into `RESOURCE_EXHAUSTED` with a message that names the
//! flag. (A compressed message over the limit once decompressed is already `RESOURCE_EXHAUSTED`
//! from tonic.)

use tonic::{Code, Status};

/// The start of tonic's text for a received message over the limit (`codec/decode.rs`).
const TONIC_TOO_LARGE: &str = "Error, decoded message length too large";

/// The flag that changes the limit, as the rewritten message names it.
pub(crate) const FLAG_HINT: &str = "Use --grpc-max-message-size to increase the limit.";

/// The status for tonic's over-size status, or `None` for any other.
pub(crate) fn over_size(status: &Status) -> Option<Status> {
    let named = status.code() == Code::ResourceExhausted && !status.message().contains(FLAG_HINT);
    if (status.code() == Code::OutOfRange && status.message().starts_with(TONIC_TOO_LARGE)) || named {
        return Some(Status::resource_exhausted(format!("{}. {FLAG_HINT}", status.message())));
    }
    None
}

/// Rewrites a trailers-only error response (a unary call refused while its request was read)
/// whose status is tonic's over-size one.
pub(crate) fn name_the_flag<B>(mut resp: http::Response<B>) -> http::Response<B> {
    let Some(status) = Status::from_header_map(resp.headers()).and_then(|s| over_size(&s)) else { return resp };
    if status.add_header(resp.headers_mut()).is_err() {
        tracing::debug!("could not rewrite an over-size gRPC status");
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_only_tonic_over_size() {
        let s = Status::out_of_range("Error, decoded message length too large: found 10 bytes, the limit is: 8 bytes");
        let r = over_size(&s).expect("rewritten");
        assert_eq!(r.code(), Code::ResourceExhausted);
        assert_eq!(
            r.message(),
            "Error, decoded message length too large: found 10 bytes, the limit is: 8 bytes. Use --grpc-max-message-size to increase the limit."
        );
        assert!(over_size(&Status::out_of_range("something else")).is_none());
        assert!(over_size(&Status::invalid_argument("x")).is_none());
        assert!(over_size(&r).is_none(), "already named");
    }

    #[test]
    fn rewrites_headers() {
        let mut resp = http::Response::new(());
        Status::out_of_range("Error, decoded message length too large: found 10 bytes, the limit is: 8 bytes")
            .add_header(resp.headers_mut())
            .expect("header");
        let resp = name_the_flag(resp);
        let s = Status::from_header_map(resp.headers()).expect("a status");
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert!(s.message().ends_with(FLAG_HINT), "{}", s.message());
        let plain = name_the_flag(http::Response::new(()));
        assert!(Status::from_header_map(plain.headers()).is_none());
    }
}
