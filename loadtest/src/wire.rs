//! The subscriber's side of the wire, hand-written for speed: an HTTP/1.1 response head
//! reader, a chunked transfer-coding decoder and a minimal SSE frame splitter.
//!
//! This is a load generator, not the product: the SSE parser understands exactly what the
//! broker writes (`id:`, one `data:` line, `retry:`, `:` comments, LF line endings, a blank
//! line after each frame) and nothing more. A frame with several `data:` lines keeps the last.

use memchr::memmem;

/// How the response body is delimited (RFC 9112 §6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyKind {
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// `Content-Length: n`.
    Length(u64),
    /// Neither: the body ends when the server closes the connection.
    UntilClose,
}

/// The parts of a response head the load generator needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseHead {
    /// The status code.
    pub status: u16,
    /// How the body is delimited.
    pub body: BodyKind,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
}

/// Finds the end of a response head in `buf`: the offset just after `\r\n\r\n`.
pub fn head_end(buf: &[u8]) -> Option<usize> {
    memmem::find(buf, b"\r\n\r\n").map(|i| i + 4)
}

/// Parses a response head (status line and headers, up to and including the blank line).
///
/// # Errors
/// A message naming what is malformed.
pub fn parse_head(head: &[u8]) -> Result<ResponseHead, String> {
    let text = std::str::from_utf8(head).map_err(|_| "response head is not UTF-8".to_string())?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") {
        return Err(format!("not an HTTP/1.x status line: {status_line:?}"));
    }
    let status = parts
        .next()
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| format!("bad status line: {status_line:?}"))?;
    let mut body = BodyKind::UntilClose;
    let mut content_type = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("transfer-encoding") {
            if value.to_ascii_lowercase().contains("chunked") {
                body = BodyKind::Chunked;
            }
        } else if name.eq_ignore_ascii_case("content-length") {
            if body != BodyKind::Chunked {
                let n = value
                    .parse::<u64>()
                    .map_err(|_| format!("bad Content-Length: {value:?}"))?;
                body = BodyKind::Length(n);
            }
        } else if name.eq_ignore_ascii_case("content-type") {
            content_type = Some(value.to_string());
        }
    }
    Ok(ResponseHead {
        status,
        body,
        content_type,
    })
}

/// State of the chunked decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChunkState {
    /// Reading a chunk-size line: the value so far, whether inside an extension.
    Size { value: u64, ext: bool },
    /// Inside chunk data: bytes left.
    Data(u64),
    /// After chunk data: the CRLF.
    DataEnd,
    /// The last chunk was read (trailers are ignored).
    Done,
}

/// Decodes a body of any [`BodyKind`] incrementally into its payload bytes.
#[derive(Clone, Debug)]
pub struct BodyDecoder {
    kind: BodyKind,
    chunk: ChunkState,
    left: u64,
}

impl BodyDecoder {
    /// A decoder for a body delimited as `kind`.
    pub fn new(kind: BodyKind) -> Self {
        BodyDecoder {
            kind,
            chunk: ChunkState::Size {
                value: 0,
                ext: false,
            },
            left: match kind {
                BodyKind::Length(n) => n,
                _ => 0,
            },
        }
    }

    /// Whether the body has ended (last chunk, or all of `Content-Length`).
    pub fn done(&self) -> bool {
        match self.kind {
            BodyKind::Chunked => self.chunk == ChunkState::Done,
            BodyKind::Length(_) => self.left == 0,
            BodyKind::UntilClose => false,
        }
    }

    /// Feeds received bytes; calls `out` with each run of payload bytes.
    ///
    /// # Errors
    /// A malformed chunk-size line.
    pub fn decode(&mut self, mut input: &[u8], mut out: impl FnMut(&[u8])) -> Result<(), String> {
        match self.kind {
            BodyKind::UntilClose => {
                out(input);
                return Ok(());
            }
            BodyKind::Length(_) => {
                let n = input.len().min(self.left as usize);
                out(&input[..n]);
                self.left -= n as u64;
                return Ok(());
            }
            BodyKind::Chunked => {}
        }
        while !input.is_empty() {
            match &mut self.chunk {
                ChunkState::Size { value, ext } => {
                    let b = input[0];
                    input = &input[1..];
                    match b {
                        b'\n' => {
                            self.chunk = if *value == 0 {
                                ChunkState::Done
                            } else {
                                ChunkState::Data(*value)
                            };
                        }
                        b'\r' => {}
                        _ if *ext => {}
                        b';' | b' ' | b'\t' => *ext = true,
                        _ => {
                            let d = (b as char)
                                .to_digit(16)
                                .ok_or_else(|| format!("bad chunk size byte {b:#04x}"))?;
                            *value = value
                                .checked_mul(16)
                                .and_then(|v| v.checked_add(u64::from(d)))
                                .ok_or("chunk size overflows")?;
                        }
                    }
                }
                ChunkState::Data(left) => {
                    let n = input.len().min(*left as usize);
                    out(&input[..n]);
                    input = &input[n..];
                    *left -= n as u64;
                    if *left == 0 {
                        self.chunk = ChunkState::DataEnd;
                    }
                }
                ChunkState::DataEnd => {
                    let b = input[0];
                    input = &input[1..];
                    if b == b'\n' {
                        self.chunk = ChunkState::Size {
                            value: 0,
                            ext: false,
                        };
                    }
                }
                ChunkState::Done => return Ok(()),
            }
        }
        Ok(())
    }
}

/// One SSE frame, borrowed from the parser's input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The `id:` field, if present.
    pub id: Option<&'a [u8]>,
    /// The (last) `data:` field, if present.
    pub data: Option<&'a [u8]>,
    /// Whether the frame held a comment line.
    pub comment: bool,
}

/// Splits an SSE byte stream into frames, copying only a frame cut across two reads.
#[derive(Clone, Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
}

impl SseParser {
    /// A parser with nothing buffered.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes held back (an incomplete frame).
    #[cfg(test)]
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Feeds payload bytes; calls `on_frame` for every complete frame.
    pub fn feed(&mut self, input: &[u8], mut on_frame: impl FnMut(Frame<'_>)) {
        if self.buf.is_empty() {
            let used = split_frames(input, &mut on_frame);
            self.buf.extend_from_slice(&input[used..]);
        } else {
            self.buf.extend_from_slice(input);
            let used = split_frames(&self.buf, &mut on_frame);
            self.buf.drain(..used);
        }
    }
}

/// Calls `on_frame` for each complete frame in `buf`; returns the bytes consumed.
fn split_frames(buf: &[u8], on_frame: &mut impl FnMut(Frame<'_>)) -> usize {
    let mut pos = 0;
    while let Some(end) = memmem::find(&buf[pos..], b"\n\n") {
        let frame = &buf[pos..pos + end];
        pos += end + 2;
        let mut f = Frame::default();
        for line in frame.split(|&b| b == b'\n') {
            if let Some(rest) = line.strip_prefix(b"data:") {
                f.data = Some(rest.strip_prefix(b" ").unwrap_or(rest));
            } else if let Some(rest) = line.strip_prefix(b"id:") {
                f.id = Some(rest.strip_prefix(b" ").unwrap_or(rest));
            } else if line.first() == Some(&b':') {
                f.comment = true;
            }
        }
        if f.id.is_some() || f.data.is_some() || f.comment {
            on_frame(f);
        }
    }
    pos
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunked(parts: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in parts {
            out.extend_from_slice(format!("{:x}\r\n", p.len()).as_bytes());
            out.extend_from_slice(p);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\n\r\n");
        out
    }

    #[test]
    fn head_parses_status_and_chunked() {
        let raw = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\nrest";
        let end = head_end(raw).unwrap();
        assert_eq!(&raw[end..], b"rest");
        let head = parse_head(&raw[..end]).unwrap();
        assert_eq!(head.status, 200);
        assert_eq!(head.body, BodyKind::Chunked);
        assert_eq!(head.content_type.as_deref(), Some("text/event-stream"));
        let h =
            parse_head(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 12\r\n\r\n").unwrap();
        assert_eq!((h.status, h.body), (503, BodyKind::Length(12)));
        assert!(parse_head(b"SSH-2.0\r\n\r\n").is_err());
    }

    #[test]
    fn dechunks_across_every_split() {
        let body = chunked(&[b"id: 1\ndata: {\"a\":1}\n\n", b"retry: 2000\n\n", b"x"]);
        let want: Vec<u8> = b"id: 1\ndata: {\"a\":1}\n\nretry: 2000\n\nx".to_vec();
        for split in 0..=body.len() {
            let mut d = BodyDecoder::new(BodyKind::Chunked);
            let mut got = Vec::new();
            d.decode(&body[..split], |p| got.extend_from_slice(p))
                .unwrap();
            d.decode(&body[split..], |p| got.extend_from_slice(p))
                .unwrap();
            assert_eq!(got, want, "split at {split}");
            assert!(d.done());
        }
        let mut d = BodyDecoder::new(BodyKind::Chunked);
        assert!(d.decode(b"zz\r\n", |_| {}).is_err());
    }

    #[test]
    fn length_and_close_bodies() {
        let mut d = BodyDecoder::new(BodyKind::Length(3));
        let mut got = Vec::new();
        d.decode(b"abcdef", |p| got.extend_from_slice(p)).unwrap();
        assert_eq!(got, b"abc");
        assert!(d.done());
        let mut d = BodyDecoder::new(BodyKind::UntilClose);
        d.decode(b"xyz", |p| got.extend_from_slice(p)).unwrap();
        assert!(!d.done());
    }

    /// An owned frame: id, data, comment.
    type Owned = (Option<Vec<u8>>, Option<Vec<u8>>, bool);

    #[test]
    fn frames_split_anywhere() {
        let stream: &[u8] =
            b"retry: 2000\n\n: comment\n\ndata: {\"p\":1}\n\nid: e-0-1\ndata: {\"seq\":0}\n\n";
        for split in 0..=stream.len() {
            let mut p = SseParser::new();
            let mut frames: Vec<Owned> = Vec::new();
            for part in [&stream[..split], &stream[split..]] {
                p.feed(part, |f| {
                    frames.push((
                        f.id.map(<[u8]>::to_vec),
                        f.data.map(<[u8]>::to_vec),
                        f.comment,
                    ))
                });
            }
            assert_eq!(
                frames,
                vec![
                    (None, None, true),
                    (None, Some(b"{\"p\":1}".to_vec()), false),
                    (
                        Some(b"e-0-1".to_vec()),
                        Some(b"{\"seq\":0}".to_vec()),
                        false
                    ),
                ],
                "split at {split}"
            );
            assert_eq!(p.buffered(), 0);
        }
    }
}
