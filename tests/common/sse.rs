//! The tests' one SSE wire parser, strict to what the broker emits (PROTOCOL §3; WHATWG HTML §9.2
//! event stream format): UTF-8, LF line ends only (a CR anywhere is an error), frames ended by
//! a blank line, and only the lines the broker writes: `id:`, one `data:`, `retry:` and
//! comments (`:`). One optional space after the colon is removed, as §9.2 prescribes.

/// One frame: the text between two blank lines, parsed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Frame {
    /// The frame's text, without the terminating blank line.
    pub text: String,
    /// `id:` value, if the frame has one.
    pub id: Option<String>,
    /// `data:` value, if the frame has one.
    pub data: Option<String>,
    /// `retry:` value, if the frame has one.
    pub retry: Option<String>,
    /// Comment lines (without the leading `:` and one optional space).
    pub comments: Vec<String>,
}

/// Parses one frame's text (without its terminating blank line).
///
/// # Errors
/// A CR, an empty line inside the frame, a second `id:`, `data:` or `retry:` line, a field the
/// broker never writes (`event:` included), or a line without a colon.
pub fn parse_frame(text: &str) -> Result<Frame, String> {
    if text.contains('\r') {
        return Err(format!("SSE must use LF only: {text:?}"));
    }
    let mut f = Frame {
        text: text.to_string(),
        ..Frame::default()
    };
    for line in text.split('\n') {
        let Some((field, value)) = line.split_once(':') else {
            return Err(format!("a line without a field: {line:?} in {text:?}"));
        };
        let value = value.strip_prefix(' ').unwrap_or(value).to_string();
        let slot = match field {
            "" => {
                f.comments.push(value);
                continue;
            }
            "id" => &mut f.id,
            "data" => &mut f.data,
            "retry" => &mut f.retry,
            _ => return Err(format!("unexpected line {line:?} in {text:?}")),
        };
        if slot.replace(value).is_some() {
            return Err(format!("two {field}: lines in {text:?}"));
        }
    }
    Ok(f)
}

/// Splits the complete frame at the start of `buf`, if `buf` holds one: the frame's text and
/// the rest.
pub fn split_frame(buf: &[u8]) -> Option<(&[u8], &[u8])> {
    let pos = buf.windows(2).position(|w| w == b"\n\n")?;
    Some((&buf[..pos], &buf[pos + 2..]))
}

/// Parses a body of whole frames (empty, or ending with a blank line).
///
/// # Errors
/// Bytes that are not UTF-8, a body that does not end with a blank line, or a frame
/// [`parse_frame`] refuses.
pub fn parse_body(body: &[u8]) -> Result<Vec<Frame>, String> {
    let text = std::str::from_utf8(body).map_err(|e| format!("SSE is UTF-8: {e}"))?;
    if text.contains('\r') {
        return Err(format!("SSE must use LF only: {text:?}"));
    }
    if !text.is_empty() && !text.ends_with("\n\n") {
        return Err(format!(
            "a body of whole frames ends with a blank line: {text:?}"
        ));
    }
    text.split_terminator("\n\n").map(parse_frame).collect()
}

/// The JSON of every frame with data in a body of whole frames.
///
/// # Panics
/// On a body [`parse_body`] refuses or data that is not JSON (the broker never sends such).
pub fn body_events(body: &[u8]) -> Vec<serde_json::Value> {
    parse_body(body)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .filter_map(|f| f.data)
        .map(|d| serde_json::from_str(&d).unwrap_or_else(|e| panic!("data is not JSON ({e}): {d}")))
        .collect()
}
