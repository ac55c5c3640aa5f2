//! HTTP body compression as Triton's HTTP server does it: request bodies may come with
//! `Content-Encoding: gzip` or `deflate` (zlib-wrapped, as `zlib.compress` and Triton produce),
//! and inference responses are compressed with the encoding `Accept-Encoding` prefers.

use std::io::{Read, Write};

use flate2::read::{MultiGzDecoder, ZlibDecoder};
use flate2::write::{GzEncoder, ZlibEncoder};
use flate2::Compression;
use tritium_server::{ErrorKind, InferError};

use crate::limits::TooLarge;

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

/// Decompresses a request body, refusing to produce more than `limit` bytes: the output grows
/// by doubling but never past `limit + 1` bytes, and decompression stops there (no zip bombs).
/// Like Triton (zlib's `inflateInit2(15 | 32)`), both encodings accept a gzip or a zlib stream.
pub fn decompress(encoding: Encoding, data: &[u8], limit: usize) -> Result<Vec<u8>, InferError> {
    if encoding == Encoding::Identity {
        return Ok(data.to_vec());
    }
    let is_gzip = data.starts_with(&[0x1f, 0x8b]);
    let mut reader: Box<dyn Read + '_> =
        if is_gzip { Box::new(MultiGzDecoder::new(data)) } else { Box::new(ZlibDecoder::new(data)) };
    let cap = limit.saturating_add(1);
    let mut out = vec![0u8; data.len().saturating_mul(2).clamp(64, cap.max(64)).min(cap)];
    let mut len = 0usize;
    loop {
        if len == out.len() {
            if len >= cap {
                return Err(TooLarge::Decompressed { limit }.into());
            }
            out.resize(len.saturating_mul(2).min(cap), 0);
        }
        let n = match reader.read(&mut out[len..]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(InferError::invalid(format!(
                    "failed to decompress the {} request body: {e}; send a valid {} stream or drop the Content-Encoding header",
                    encoding.as_str(),
                    if is_gzip { "gzip" } else { "zlib (deflate)" }
                )))
            }
        };
        if n == 0 {
            break;
        }
        len += n;
    }
    if len > limit {
        return Err(TooLarge::Decompressed { limit }.into());
    }
    out.truncate(len);
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
            assert_eq!(err.message, TooLarge::Decompressed { limit: data.len() - 1 }.to_string());
        }
    }

    #[test]
    fn a_bomb_stops_at_the_limit() {
        // 64 MiB of zeros packs into about 64 KiB; a 1 MiB limit must stop well before the end.
        let zeros = vec![0u8; 1 << 20];
        let mut enc = GzEncoder::new(Vec::new(), Compression::best());
        for _ in 0..64 {
            enc.write_all(&zeros).expect("write");
        }
        let bomb = enc.finish().expect("finish");
        assert!(bomb.len() < 256 << 10);
        let err = decompress(Encoding::Gzip, &bomb, 1 << 20).expect_err("a bomb");
        assert_eq!(err.kind, ErrorKind::InvalidArg);
        assert!(err.message.contains("Use --http-max-input-size to increase the limit."), "{}", err.message);
        // Exactly at the limit is accepted.
        let packed = compress(Encoding::Deflate, &[&zeros]).expect("compress");
        assert_eq!(decompress(Encoding::Deflate, &packed, 1 << 20).expect("at the limit").len(), 1 << 20);
        let empty = compress(Encoding::Gzip, &[]).expect("compress");
        assert!(decompress(Encoding::Gzip, &empty, 0).expect("empty").is_empty());
    }

    #[test]
    fn garbage_is_a_clear_error() {
        let err = decompress(Encoding::Gzip, b"not compressed at all", 1 << 20).expect_err("garbage");
        assert_eq!(err.kind, ErrorKind::InvalidArg);
        assert!(err.message.starts_with("failed to decompress the gzip request body"), "{}", err.message);
    }
}
