//! Log probabilities, passed through from a vLLM-shaped model as Triton's frontend does: the
//! request asks vLLM for `logprobs: N` in the sampling parameters and sets `return_logprobs`;
//! the model answers a `logprobs` output, a JSON list with one object per token,
//! `{"<token id>": {"logprob": x, "rank": r, "decoded_token": "..."}}`, whose rank-1 entry is the
//! chosen token. Chat answers get OpenAI's `{"content": [...]}`, completions the four lists.

use serde_json::{json, Map, Value};

/// The entries of one token, chosen first (lowest rank).
fn ranked(token: &Map<String, Value>) -> Vec<(&str, f64)> {
    let mut entries: Vec<(i64, &str, f64)> = token
        .values()
        .filter_map(|e| {
            let text = e.get("decoded_token")?.as_str()?;
            let lp = e.get("logprob")?.as_f64()?;
            Some((e.get("rank").and_then(Value::as_i64).unwrap_or(i64::MAX), text, lp))
        })
        .collect();
    entries.sort_by_key(|e| e.0);
    entries.into_iter().map(|(_, t, lp)| (t, lp)).collect()
}

/// Parses the model's `logprobs` text; `None` for `null`, nothing, or text that is not the
/// expected list (logged).
fn tokens(raw: &str) -> Option<Vec<Vec<(String, f64)>>> {
    let v: Value = match serde_json::from_str(raw) {
        Ok(v) => v,
        Err(e) => {
            tracing::debug!("the model's logprobs output is not JSON: {e}");
            return None;
        }
    };
    let list = v.as_array()?;
    Some(
        list.iter()
            .filter_map(Value::as_object)
            .map(|t| ranked(t).into_iter().map(|(s, lp)| (s.to_owned(), lp)).collect::<Vec<_>>())
            .filter(|t| !t.is_empty())
            .collect(),
    )
}

/// Chat's `content` entries for the model's `logprobs` text.
pub fn chat_entries(raw: &str) -> Vec<Value> {
    tokens(raw)
        .unwrap_or_default()
        .into_iter()
        .map(|t| {
            let top: Vec<Value> =
                t.iter().map(|(s, lp)| json!({"token": s, "logprob": lp, "bytes": s.as_bytes()})).collect();
            let (s, lp) = &t[0];
            json!({"token": s, "logprob": lp, "bytes": s.as_bytes(), "top_logprobs": top})
        })
        .collect()
}

/// A completion's four lists for the model's `logprobs` text, its text offsets starting at
/// `offset` (characters); returns them and the offset after them.
pub fn completion_lists(raw: &str, mut offset: usize) -> (Value, usize) {
    let mut text_offset = Vec::new();
    let mut token_logprobs = Vec::new();
    let mut toks = Vec::new();
    let mut top = Vec::new();
    for t in tokens(raw).unwrap_or_default() {
        let (s, lp) = &t[0];
        text_offset.push(offset);
        token_logprobs.push(*lp);
        toks.push(s.clone());
        top.push(t.iter().map(|(s, lp)| (s.clone(), json!(lp))).collect::<Map<String, Value>>());
        offset += s.chars().count();
    }
    let v = json!({"text_offset": text_offset, "token_logprobs": token_logprobs, "tokens": toks, "top_logprobs": top});
    (v, offset)
}

/// Appends a completion's lists `more` to `acc`.
pub fn extend_lists(acc: &mut Value, more: &Value) {
    for key in ["text_offset", "token_logprobs", "tokens", "top_logprobs"] {
        if let (Some(a), Some(b)) =
            (acc.get_mut(key).and_then(Value::as_array_mut), more.get(key).and_then(Value::as_array))
        {
            a.extend(b.iter().cloned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RAW: &str = r#"[{"5": {"logprob": -0.5, "rank": 2, "decoded_token": "b"}, "4": {"logprob": -0.1, "rank": 1, "decoded_token": "a"}}, {"9": {"logprob": -1.0, "rank": 1, "decoded_token": "é"}}]"#;

    #[test]
    fn chat_entries_put_the_chosen_token_first() {
        let e = chat_entries(RAW);
        assert_eq!(e.len(), 2);
        assert_eq!(e[0]["token"], "a");
        assert_eq!(e[0]["top_logprobs"][1], json!({"token": "b", "logprob": -0.5, "bytes": [98]}));
        assert_eq!(e[1]["bytes"], json!([195, 169]));
        assert!(chat_entries("null").is_empty());
        assert!(chat_entries("not json").is_empty());
    }

    #[test]
    fn completion_lists_continue_offsets() {
        let (v, end) = completion_lists(RAW, 3);
        assert_eq!(v["text_offset"], json!([3, 4]));
        assert_eq!(v["tokens"], json!(["a", "é"]));
        assert_eq!(v["top_logprobs"][0], json!({"a": -0.1, "b": -0.5}));
        assert_eq!(end, 5);
        let mut acc = v.clone();
        extend_lists(&mut acc, &v);
        assert_eq!(acc["tokens"], json!(["a", "é", "a", "é"]));
    }
}
