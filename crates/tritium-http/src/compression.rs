//! HTTP body compression as Triton's HTTP server does it: request bodies may come with
//! `Content-Encoding: gzip` or `deflate` (zlib-wrapped, as `zlib.compress` and Triton produce),
//! and inference responses are compressed with the encoding `Accept-Encoding` prefers.

use std::io::{Read, Write};

use flate2::read::{MultiGzDecoder, ZlibDecoder};
use flate2::write::{GzEncoder, ZlibEncoder};
use flate2::Compression;
use tritium_server::{ErrorKind, InferError};

/// A body encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Not compressed.
    Identity,
    /// gzip (RFC 1952).
    Gzip,
    /// `deflate`, which HTTP means as the zlib format (RFC 1950).
    Deflate,
}

impl Encoding {
    /// The header value.
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Identity => "identity",
            Encoding::Gzip => "gzip",
            Encoding::Deflate => "deflate",
        }
    }
}

/// The encoding of a request body from its `Content-Encoding` header. Anything other than
/// `gzip`, `deflate` or `identity` is Triton's `UNSUPPORTED` "Unsupported compression type"
/// (HTTP 501; the response then carries `Accept-Encoding: gzip, deflate`).
pub fn request_encoding(content_encoding: Option<&str>) -> Result<Encoding, InferError> {
    match content_encoding.map(str::trim) {
        None | Some("") | Some("identity") => Ok(Encoding::Identity),
        Some("gzip") => Ok(Encoding::Gzip),
        Some("deflate") => Ok(Encoding::Deflate),
        Some(_) => Err(InferError::new(ErrorKind::Unsupported, "Unsupported compression type")),
    }
}

/// The response encoding for an `Accept-Encoding` header: Triton's `CompressionTypeUsed`. Among
/// `identity`, `gzip` and `deflate`, the one with the highest `q` wins (the first on a tie);
/// malformed entries are skipped; anything else means identity.
pub fn response_encoding(accept_encoding: Option<&str>) -> Encoding {
    let Some(accept) = accept_encoding else { return Encoding::Identity };
    let mut best = Encoding::Identity;
    let mut best_weight = 0.0f64;
    for entry in accept.split(',') {
        let Some(start) = entry.find(|c| c != ' ') else { continue };
        let weight_pos = entry.find(";q=");
        if weight_pos.is_some_and(|w| start >= w) {
            continue;
        }
        let name = match weight_pos {
            Some(w) => &entry[start..w],
            None => &entry[start..],
        };
        let weight = match weight_pos {
            Some(w) => match parse_weight(&entry[w + 3..]) {
                Some(q) => q,
                None => continue,
            },
            None => 1.0,
        };
        let encoding = match name {
            "identity" => Encoding::Identity,
            "gzip" => Encoding::Gzip,
            "deflate" => Encoding::Deflate,
            _ => continue,
        };
        if weight > best_weight {
            best = encoding;
            best_weight = weight;
        }
    }
    best
}

/// `std::stod` on a q-value: leading whitespace, then the longest numeric prefix.
fn parse_weight(s: &str) -> Option<f64> {
    let s = s.trim_start();
    let end = s
        .char_indices()
        .take_while(|&(i, c)| c.is_ascii_digit() || c == '.' || ((c == '-' || c == '+') && i == 0))
        .map(|(i, c)| i + c.len_utf8())
        .last()?;
    s[..end].parse().ok()
}

/// Decompresses a request body, refusing to produce more than `limit` bytes. Like Triton (zlib's
/// `inflateInit2(15 | 32)`), both encodings accept a gzip or a zlib stream.
pub fn decompress(encoding: Encoding, data: &[u8], limit: usize) -> Result<Vec<u8>, InferError> {
    if encoding == Encoding::Identity {
        return Ok(data.to_vec());
    }
    let is_gzip = data.starts_with(&[0x1f, 0x8b]);
    let reader: Box<dyn Read + '_> =
        if is_gzip { Box::new(MultiGzDecoder::new(data)) } else { Box::new(ZlibDecoder::new(data)) };
    let mut out = Vec::with_capacity(data.len().saturating_mul(2).min(limit));
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    reader.take(cap).read_to_end(&mut out).map_err(|e| {
        InferError::invalid(format!(
            "failed to decompress the {} request body: {e}; send a valid {} stream or drop the Content-Encoding header",
            encoding.as_str(),
            if is_gzip { "gzip" } else { "zlib (deflate)" }
        ))
    })?;
    if out.len() > limit {
        return Err(InferError::invalid(format!(
            "the decompressed request body exceeds the maximum allowed size of {limit} bytes"
        )));
    }
    Ok(out)
}

/// Compresses the concatenation of `parts`.
pub fn compress(encoding: Encoding, parts: &[&[u8]]) -> std::io::Result<Vec<u8>> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let buf = Vec::with_capacity(total / 2 + 64);
    match encoding {
        Encoding::Identity => Ok(parts.concat()),
        Encoding::Gzip => {
            let mut enc = GzEncoder::new(buf, Compression::default());
            for p in parts {
                enc.write_all(p)?;
            }
            enc.finish()
        }
        Encoding::Deflate => {
            let mut enc = ZlibEncoder::new(buf, Compression::default());
            for p in parts {
                enc.write_all(p)?;
            }
            enc.finish()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_encoding_choice() {
        assert_eq!(response_encoding(None), Encoding::Identity);
        assert_eq!(response_encoding(Some("gzip")), Encoding::Gzip);
        assert_eq!(response_encoding(Some("deflate")), Encoding::Deflate);
        assert_eq!(response_encoding(Some("br")), Encoding::Identity);
        assert_eq!(response_encoding(Some("gzip, deflate")), Encoding::Gzip);
        assert_eq!(response_encoding(Some("gzip;q=0.5, deflate")), Encoding::Deflate);
        assert_eq!(response_encoding(Some("deflate;q=0.2,gzip;q=0.9")), Encoding::Gzip);
        assert_eq!(response_encoding(Some("identity, gzip;q=0.5")), Encoding::Identity);
        assert_eq!(response_encoding(Some("gzip;q=abc, deflate;q=0.1")), Encoding::Deflate);
        assert_eq!(response_encoding(Some("gzip;q=0")), Encoding::Identity);
    }

    #[test]
    fn content_encoding() {
        assert_eq!(request_encoding(None).ok(), Some(Encoding::Identity));
        assert_eq!(request_encoding(Some("identity")).ok(), Some(Encoding::Identity));
        assert_eq!(request_encoding(Some("gzip")).ok(), Some(Encoding::Gzip));
        assert_eq!(request_encoding(Some("deflate")).ok(), Some(Encoding::Deflate));
        let err = request_encoding(Some("br")).expect_err("br is unsupported");
        assert_eq!(err.kind, ErrorKind::Unsupported);
        assert_eq!(err.message, "Unsupported compression type");
    }

    #[test]
    fn round_trips() {
        let data: Vec<u8> = (0..10_000u32).flat_map(|i| (i % 251).to_le_bytes()).collect();
        for enc in [Encoding::Gzip, Encoding::Deflate] {
            let packed = compress(enc, &[&data[..100], &data[100..]]).expect("compress");
            assert!(packed.len() < data.len());
            assert_eq!(decompress(enc, &packed, data.len()).expect("decompress"), data);
            // Either header is accepted under either name, as zlib's auto-detection does.
            let other = if enc == Encoding::Gzip { Encoding::Deflate } else { Encoding::Gzip };
            assert_eq!(decompress(other, &packed, data.len()).expect("decompress"), data);
            let err = decompress(enc, &packed, data.len() - 1).expect_err("over the limit");
            assert!(err.message.contains("exceeds the maximum"), "{}", err.message);
        }
    }

    #[test]
    fn garbage_is_a_clear_error() {
        let err = decompress(Encoding::Gzip, b"not compressed at all", 1 << 20).expect_err("garbage");
        assert_eq!(err.kind, ErrorKind::InvalidArg);
        assert!(err.message.starts_with("failed to decompress the gzip request body"), "{}", err.message);
    }
}
