//! A pre-pass over protobuf text format that writes the colon prost-reflect needs before a list of
//! messages, with a map back to the user's offsets.
//!
//! Triton's configs write lists of messages without a colon, `input [ { name: "x" } ]`, as the
//! text-format spec allows (`MessageField = FieldName [ ":" ] ( MessageValue | MessageList )`)
//! and protobuf's C++ parser accepts. prost-reflect's parser allows leaving out the colon only
//! before `{` or `<`, so this pass inserts one after a field name exactly where the name is
//! followed by `[` whose first element is `{` or `<`, or by an empty list `[ ]` (which Triton
//! accepts for a message field; for a scalar field it reads as the empty list it spells).
//! A scalar list still needs its colon (`dims [ 4 ]` stays an error, as in protobuf's parser).
//!
//! The pass tokenizes just enough to get this right: strings (`'...'`, `"..."`, with escapes) and
//! `#` comments are skipped, values after a `:` and elements of a list are not field names.

use std::borrow::Cow;

/// The text handed to the parser, and where its bytes were in the user's text.
#[derive(Debug)]
pub(crate) struct Prepared<'a> {
    text: Cow<'a, str>,
    /// Offsets in the user's text where a `:` was inserted, ascending.
    insertions: Vec<usize>,
}

impl Prepared<'_> {
    /// The text to parse.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// The offset in the user's text of byte `offset` of [`Prepared::text`]. An inserted colon
    /// maps to the end of the field name it follows.
    pub(crate) fn original_offset(&self, offset: usize) -> usize {
        // Insertion `i` is at offset `insertions[i] + i` of the prepared text. This runs once per
        // parse error, so a linear count is enough.
        let before = self.insertions.iter().enumerate().take_while(|&(i, &at)| at + i < offset).count();
        offset - before
    }
}

/// What an open bracket started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Open {
    /// `{` or `<`: a message, whose fields follow.
    Message,
    /// `[` after a field name or a colon: a list of values.
    List,
    /// `[` where a field name is expected: an extension or `Any` type name.
    Name,
}

/// The kind of the previous token, as far as this pass cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Previous {
    /// `:`, possibly followed by `-`: a value comes next.
    Colon,
    /// A field name: a `[` after it opens a list.
    FieldName,
    /// Anything else.
    Other,
}

/// Inserts the colons prost-reflect needs before lists of messages.
pub(crate) fn prepare(text: &str) -> Prepared<'_> {
    let insertions = insertion_points(text.as_bytes());
    if insertions.is_empty() {
        return Prepared { text: Cow::Borrowed(text), insertions };
    }
    let mut prepared = String::with_capacity(text.len() + insertions.len());
    let mut copied = 0;
    for &at in &insertions {
        prepared.push_str(&text[copied..at]);
        prepared.push(':');
        copied = at;
    }
    prepared.push_str(&text[copied..]);
    Prepared { text: Cow::Owned(prepared), insertions }
}

/// The offsets (just after a field name, always on a char boundary) where a colon goes.
fn insertion_points(bytes: &[u8]) -> Vec<usize> {
    let mut insertions = Vec::new();
    let mut stack: Vec<Open> = Vec::new();
    let mut previous = Previous::Other;
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        let in_name_or_list = matches!(stack.last(), Some(Open::List | Open::Name));
        match byte {
            b' ' | b'\t' | b'\n' | b'\r' | b'\x0b' | b'\x0c' => {
                i += 1;
                continue;
            }
            b'#' => {
                i = skip_comment(bytes, i);
                continue;
            }
            b'"' | b'\'' => {
                i = skip_string(bytes, i);
                previous = Previous::Other;
            }
            b'A'..=b'Z' | b'a'..=b'z' | b'_' => {
                let end = skip_identifier(bytes, i);
                let field_name = previous != Previous::Colon && !in_name_or_list;
                if field_name && message_list_follows(bytes, end) {
                    insertions.push(end);
                }
                previous = if field_name { Previous::FieldName } else { Previous::Other };
                i = end;
            }
            b'0'..=b'9' => {
                i = skip_number(bytes, i);
                previous = Previous::Other;
            }
            b'.' if bytes.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                i = skip_number(bytes, i);
                previous = Previous::Other;
            }
            b':' => {
                previous = Previous::Colon;
                i += 1;
            }
            // A sign keeps a value a value: `x: -inf`.
            b'-' => i += 1,
            b'{' | b'<' => {
                stack.push(Open::Message);
                previous = Previous::Other;
                i += 1;
            }
            b'[' => {
                let list = previous != Previous::Other || in_name_or_list;
                stack.push(if list { Open::List } else { Open::Name });
                previous = Previous::Other;
                i += 1;
            }
            b']' => {
                i += 1;
                previous = Previous::Other;
                if stack.pop() == Some(Open::Name) {
                    // `[ext.name]` is a field name too.
                    if message_list_follows(bytes, i) {
                        insertions.push(i);
                    }
                    previous = Previous::FieldName;
                }
            }
            b'}' | b'>' => {
                if stack.last() == Some(&Open::Message) {
                    stack.pop();
                }
                previous = Previous::Other;
                i += 1;
            }
            _ => {
                previous = Previous::Other;
                i += 1;
            }
        }
    }
    insertions
}

/// Whether the text at `from` is (after whitespace and comments) `[` followed by `{`, `<` or `]`.
fn message_list_follows(bytes: &[u8], from: usize) -> bool {
    let i = skip_blank(bytes, from);
    if bytes.get(i) != Some(&b'[') {
        return false;
    }
    let i = skip_blank(bytes, i + 1);
    matches!(bytes.get(i), Some(b'{' | b'<' | b']'))
}

/// The offset of the first byte at or after `i` that is neither whitespace nor in a comment.
fn skip_blank(bytes: &[u8], mut i: usize) -> usize {
    while let Some(&byte) = bytes.get(i) {
        match byte {
            b' ' | b'\t' | b'\n' | b'\r' | b'\x0b' | b'\x0c' => i += 1,
            b'#' => i = skip_comment(bytes, i),
            _ => break,
        }
    }
    i
}

/// The offset just after the comment starting at `i` (and its newline).
fn skip_comment(bytes: &[u8], i: usize) -> usize {
    bytes[i..].iter().position(|&b| b == b'\n').map_or(bytes.len(), |n| i + n + 1)
}

/// The offset just after the string starting at `i`. An unterminated string ends at the end of
/// its line, where the parser reports it.
fn skip_string(bytes: &[u8], i: usize) -> usize {
    let quote = bytes[i];
    let mut i = i + 1;
    while let Some(&byte) = bytes.get(i) {
        match byte {
            b'\\' if bytes.get(i + 1).is_some_and(|&b| b != b'\n') => i += 2,
            b'\n' => return i,
            _ if byte == quote => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// The offset just after the identifier starting at `i`.
fn skip_identifier(bytes: &[u8], i: usize) -> usize {
    let mut i = i;
    while bytes.get(i).is_some_and(|&b| b.is_ascii_alphanumeric() || b == b'_') {
        i += 1;
    }
    i
}

/// The offset just after the number starting at `i`: `12`, `0x1F`, `1.5e-3f`, `.5`.
fn skip_number(bytes: &[u8], start: usize) -> usize {
    let hex = bytes.get(start + 1).is_some_and(|&b| b == b'x' || b == b'X') && bytes[start] == b'0';
    let mut i = start;
    while let Some(&byte) = bytes.get(i) {
        let exponent_sign = (byte == b'+' || byte == b'-') && !hex && i > start && matches!(bytes[i - 1], b'e' | b'E');
        if byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'.' || exponent_sign {
            i += 1;
        } else {
            break;
        }
    }
    i
}

#[cfg(test)]
mod tests {
    use super::prepare;

    /// The prepared text of `text`.
    fn prepared(text: &str) -> String {
        prepare(text).text().to_owned()
    }

    #[test]
    fn colon_before_lists_of_messages() {
        for (text, expected) in [
            ("input [ { name: \"x\" } ]", "input: [ { name: \"x\" } ]"),
            ("input [{ name: \"x\" }, { name: \"y\" }]", "input: [{ name: \"x\" }, { name: \"y\" }]"),
            ("input [ < name: \"x\" > ]", "input: [ < name: \"x\" > ]"),
            ("input\n[\n  {\n    name: \"x\"\n  }\n]\n", "input:\n[\n  {\n    name: \"x\"\n  }\n]\n"),
            ("input # the inputs\n [ # first\n { }\n]", "input: # the inputs\n [ # first\n { }\n]"),
            ("instance_group [ ]", "instance_group: [ ]"),
            ("name: \"m\" max_batch_size: 8 input [ {} ]", "name: \"m\" max_batch_size: 8 input: [ {} ]"),
            ("[ext.field] [ {} ]", "[ext.field]: [ {} ]"),
        ] {
            assert_eq!(prepared(text), expected, "{text:?}");
        }
    }

    #[test]
    fn nested_lists_of_messages() {
        let text = "sequence_batching { control_input [ { name: \"START\" control [ { kind: CONTROL_SEQUENCE_START \
                    fp32_false_true: [ 0, 1 ] } ] } ] state [ { initial_state [ { name: \"z\" } ] } ] }";
        let expected = "sequence_batching { control_input: [ { name: \"START\" control: [ { kind: \
                        CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] } ] state: [ { initial_state: [ { \
                        name: \"z\" } ] } ] }";
        assert_eq!(prepared(text), expected);
    }

    #[test]
    fn everything_else_is_left_alone() {
        for text in [
            // A colon already there.
            "input: [ { name: \"x\" } ]",
            "input : [ { name: \"x\" } ]",
            // Scalar lists, with or without their (required) colon.
            "dims: [ 1, 2 ]",
            "dims [ 1, 2 ]",
            "dims [ -1 ]",
            "dims: [ ]",
            // Messages without a list.
            "dynamic_batching { }",
            "dynamic_batching < >",
            // Strings and comments that look like a list of messages.
            "name: \"input [ { x } ]\"",
            "name: 'input [ { x } ]'",
            "name: \"a \\\" input [ {\"",
            "name: 'a \\' input [ {'",
            "# input [ { name: \"x\" } ]\nname: \"m\"",
            "name: \"m\" # input [ {\n",
            // Values are not field names, even before a list.
            "kind: KIND_GPU [ { } ]",
            "x: - inf [ { } ]",
            "dims: [ a [ { } ] ]",
            // Numbers, including ones with letters in them.
            "x: 1e-5 y: 0x1F z: .5f",
            "",
        ] {
            assert_eq!(prepared(text), text, "{text:?}");
        }
    }

    #[test]
    fn offsets_map_back_to_the_users_text() {
        let text = "input [ { a [ {} ] } ] output [ ] x: 1";
        let prepared = prepare(text);
        assert_eq!(prepared.text(), "input: [ { a: [ {} ] } ] output: [ ] x: 1");
        // Every byte of the user's text is found again where it was.
        let mut original = 0;
        for (offset, byte) in prepared.text().bytes().enumerate() {
            let mapped = prepared.original_offset(offset);
            if byte == b':' && text.as_bytes()[mapped] != b':' {
                // An inserted colon maps to the end of its field name.
                assert!(
                    text[..mapped].ends_with("input")
                        || text[..mapped].ends_with('a')
                        || text[..mapped].ends_with("output")
                );
                continue;
            }
            assert_eq!(mapped, original, "prepared offset {offset}");
            assert_eq!(text.as_bytes()[mapped], byte, "prepared offset {offset}");
            original += 1;
        }
        assert_eq!(prepared.original_offset(prepared.text().len()), text.len());
    }

    #[test]
    fn unterminated_strings_and_comments_end_the_scan_safely() {
        for text in ["name: \"abc", "name: 'abc\ninput [ {} ]", "# comment without newline", "name: \"\\"] {
            let prepared = prepare(text);
            assert!(prepared.text().len() <= text.len() + 1, "{text:?}");
        }
        assert_eq!(prepared("name: 'abc\ninput [ {} ]"), "name: 'abc\ninput: [ {} ]");
    }
}
