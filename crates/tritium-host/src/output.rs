//! Reading a stub's stdout and stderr into log lines. Model output is untrusted: it may hold
//! bytes that are not UTF-8, or a line of any length. Lines are read as bytes, a line longer than
//! [`MAX_LINE`] is split into pieces (never buffered whole), invalid UTF-8 is replaced, and
//! nothing a model writes ends the reader: only the end of the pipe does.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, ErrorKind, Read};
use std::sync::{Arc, Mutex};

use tritium_sync::Locked;

/// Longest piece of model output kept as one log line, in bytes.
pub const MAX_LINE: usize = 16 * 1024;

/// Reads `reader` to its end, calling `emit` with every line (without its `\n` or `\r\n`),
/// lines longer than `max` bytes split into pieces of at most `max` bytes at UTF-8 character
/// boundaries where possible.
pub fn read_lines(reader: impl Read, max: usize, mut emit: impl FnMut(String)) {
    let mut reader = BufReader::with_capacity(64 * 1024, reader);
    let mut lines = Lines::new(max);
    loop {
        let buf = match reader.fill_buf() {
            Ok(buf) => buf,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        if buf.is_empty() {
            break;
        }
        let n = buf.len();
        lines.push(buf, &mut emit);
        reader.consume(n);
    }
    lines.finish(&mut emit);
}

/// Splits bytes as they come into lines, as [`read_lines`] does: for a reader that is handed
/// what it reads (a poller) rather than reading itself.
#[derive(Debug)]
pub struct Lines {
    max: usize,
    line: Vec<u8>,
}

impl Lines {
    /// Lines of at most `max` bytes.
    pub fn new(max: usize) -> Self {
        Self { max: max.max(4), line: Vec::new() }
    }

    /// Takes `buf`, calling `emit` with every line it completes.
    pub fn push(&mut self, mut buf: &[u8], emit: &mut impl FnMut(String)) {
        while !buf.is_empty() {
            let room = self.max - self.line.len();
            let window = &buf[..buf.len().min(room)];
            if let Some(i) = window.iter().position(|&b| b == b'\n') {
                self.line.extend_from_slice(&window[..i]);
                buf = &buf[i + 1..];
                emit(finish(&self.line));
                self.line.clear();
                continue;
            }
            let n = window.len();
            self.line.extend_from_slice(window);
            buf = &buf[n..];
            if self.line.len() >= self.max {
                // Split at the last complete character; an incomplete one moves to the next piece.
                let cut = match std::str::from_utf8(&self.line) {
                    Err(e) if e.error_len().is_none() && e.valid_up_to() > 0 => e.valid_up_to(),
                    _ => self.line.len(),
                };
                emit(String::from_utf8_lossy(&self.line[..cut]).into_owned());
                self.line.drain(..cut);
            }
        }
    }

    /// The end of the input: emits the last line if it had no newline.
    pub fn finish(&mut self, emit: &mut impl FnMut(String)) {
        if !self.line.is_empty() {
            emit(finish(&self.line));
            self.line.clear();
        }
    }
}

fn finish(line: &[u8]) -> String {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    String::from_utf8_lossy(line).into_owned()
}

/// How many of a process's last stderr lines are kept.
const STDERR_TAIL: usize = 20;

/// The last lines a process wrote to stderr.
#[derive(Debug, Clone, Default)]
pub struct StderrTail(pub(crate) Arc<Mutex<VecDeque<String>>>);

impl StderrTail {
    pub(crate) fn push(&self, line: String) {
        let mut q = self.0.locked();
        if q.len() == STDERR_TAIL {
            q.pop_front();
        }
        q.push_back(line);
    }

    /// The kept lines, joined with newlines.
    pub fn text(&self) -> String {
        let q = self.0.locked();
        q.iter().map(String::as_str).collect::<Vec<_>>().join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], max: usize) -> Vec<String> {
        let mut out = Vec::new();
        read_lines(input, max, |l| out.push(l));
        out
    }

    #[test]
    fn plain_lines_with_and_without_a_final_newline() {
        assert_eq!(lines(b"a\nbc\r\n\nlast", 100), ["a", "bc", "", "last"]);
        assert_eq!(lines(b"", 100), Vec::<String>::new());
    }

    #[test]
    fn a_long_line_is_split_not_buffered_whole() {
        let input = vec![b'x'; 10_000];
        let got = lines(&input, 4096);
        assert_eq!(got.iter().map(String::len).collect::<Vec<_>>(), [4096, 4096, 1808]);
        // A 20 MB line with MAX_LINE pieces keeps memory at one piece.
        let big = vec![b'y'; 20 << 20];
        let mut count = 0;
        read_lines(&big[..], MAX_LINE, |l| {
            assert!(l.len() <= MAX_LINE);
            count += 1;
        });
        assert_eq!(count, (20 << 20) / MAX_LINE);
    }

    #[test]
    fn invalid_utf8_is_replaced_and_reading_goes_on() {
        assert_eq!(lines(b"ok\n\xff\xfe bad\nafter\n", 100), ["ok", "\u{fffd}\u{fffd} bad", "after"]);
    }

    #[test]
    fn bytes_handed_in_pieces_make_the_same_lines() {
        let input = "one\ntwo é\r\nthree is long enough to split\nlast".as_bytes();
        let whole = lines(input, 8);
        for step in 1..input.len() {
            let mut got = Vec::new();
            let mut l = Lines::new(8);
            for piece in input.chunks(step) {
                l.push(piece, &mut |s| got.push(s));
            }
            l.finish(&mut |s| got.push(s));
            assert_eq!(got, whole, "pieces of {step}");
        }
    }

    #[test]
    fn pieces_end_on_character_boundaries() {
        // "é" is two bytes; with a 5-byte limit "aaaé" would be cut inside it.
        let got = lines("aaaééé\n".as_bytes(), 5);
        assert!(got.iter().all(|l| !l.contains('\u{fffd}')), "{got:?}");
        assert_eq!(got.concat(), "aaaééé");
    }
}
