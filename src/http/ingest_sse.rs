//! The SSE ingest of publish (PROTOCOL §2): an AG-UI event stream piped in as the request body
//! (`Content-Type: text/event-stream`), appended as its events arrive; the answer says exactly
//! what was appended, and why the ingest stopped if it did not reach the stream's end.
//!
//! Events are parsed by the `eventsource-stream` crate (WHATWG HTML §9.2.6). What that parser
//! cannot tell, or would do silently, is checked here on the bytes before it sees them
//! ([`checked`], [`Framing`]):
//! - a line that is neither a comment nor a field of an event stream (`data`, `id`, `event`,
//!   `retry`): the parser ignores it, so a JSON body or anything else would be an empty stream
//!   and a silent `200`;
//! - a stream that ends inside an event (a `data` line not followed by the blank line that ends
//!   the event): the parser, like a browser's, drops the incomplete event without a word
//!   (WHATWG: "If the file ends in the middle of an event, before the final empty line, the
//!   incomplete event is not dispatched"). An ingest refuses it the same way, but says so: the
//!   producer learns that its last event (often the run's `RUN_FINISHED`) was not appended;
//! - an event over `limits.max_event_bytes` before its end (the parser would buffer it without
//!   bound), and bytes that are not UTF-8 (it would buffer everything after them);
//! - line ends are rewritten to LF (from CRLF or a lone CR): the parser waits for the byte after
//!   a CR (it could start a CRLF), so a stream whose last line ends with a CR would lose its
//!   last event.

use super::body::too_large;
use super::publish::{count_published, reply};
use super::{ApiError, AppState};
use crate::event::{ThreadId, ValidEvent, validate_event};
use crate::ingest::{Appended, Ingest, IngestError, Producer};
use crate::log::EventId;
use axum::Json;
use axum::body::Body;
use axum::http::StatusCode;
use bytes::Bytes;
use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use serde_json::json;

/// Most events appended in one round trip by an SSE ingest (what was ready at once); lower when
/// a batch may hold fewer ([`Ingest::max_batch`]).
const INGEST_BATCH: usize = 256;

/// Runs an SSE ingest: each event's `data` is one AG-UI event; `id:`, `event:`, `retry:` and
/// comments are ignored (AG-UI HTTP binding). Events ready together are appended in one round
/// trip; an event refused by the order checks takes none of the events before it with it.
///
/// # Errors
/// Every error object carries `appended` (events appended by this ingest) and `lastId` (the
/// last of them, or `null`), which is exactly what the log holds of the stream:
/// 400 `invalid_event_stream` (not an event stream, not UTF-8, a stream that ends inside an
/// event: `index` names the event); 400 `invalid_event` (an event whose data is not a valid
/// AG-UI event, or a stream with no event); 409/422 (order, `STATE_DELTA`); 413 (an event too
/// large); 503 `draining` (the node's drain ended while the stream was still open; with
/// `Retry-After`); 503 from the log.
pub(super) async fn ingest(
    state: &AppState,
    thread: &ThreadId,
    body: Body,
    producer: Option<Producer>,
) -> Result<Json<super::publish::Reply>, ApiError> {
    let max_event = state.config.limits.max_event_bytes;
    let batch_max = state
        .ingest
        .max_batch()
        .map_or(INGEST_BATCH, |max| max.min(INGEST_BATCH));
    let events = checked(body.into_data_stream(), max_event)
        .eventsource()
        .ready_chunks(batch_max);
    let mut events = std::pin::pin!(events);
    let mut tally = Tally::default();
    loop {
        let chunk = tokio::select! {
            biased;
            () = state.drain_ended.cancelled() => return Err(tally.fail(cut_by_drain())),
            chunk = events.next() => match chunk {
                Some(chunk) => chunk,
                None => break,
            },
        };
        let (batch, error) = parse_chunk(chunk, thread, max_event, tally.count());
        // In batches a subscriber's queue takes whole (`queue.max_bytes`).
        for piece in state.ingest.pieces(&batch) {
            if let Err(e) = tally
                .append(&state.ingest, thread, producer.as_ref(), piece)
                .await
            {
                return Err(tally.fail(e));
            }
        }
        if let Some(e) = error {
            return Err(tally.fail(e));
        }
    }
    if tally.count() == 0 {
        return Err(tally.fail(ApiError::invalid_event(
            "the event stream holds no event",
            None,
        )));
    }
    Ok(Json(reply(
        tally.appended,
        tally.first.as_ref(),
        tally.last.as_ref(),
        tally.duplicates,
    )))
}

/// The 503 of an ingest still open when the node's drain ends (PROTOCOL §9).
fn cut_by_drain() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "draining",
        "the node is shutting down and stopped reading the stream: the events after lastId \
         were not appended; send them to another node",
    )
    .retry_after(1)
}

/// The schema-valid events of one chunk of parsed events, up to the first failure, and that
/// failure (its `index` counted from the ingest's start, `before` events preceding the chunk).
fn parse_chunk(
    chunk: Vec<Result<Event, EventStreamError<ApiError>>>,
    thread: &ThreadId,
    max_event: usize,
    before: usize,
) -> (Vec<ValidEvent>, Option<ApiError>) {
    let mut batch = Vec::with_capacity(chunk.len());
    for item in chunk {
        let index = before + batch.len();
        let ev = match item {
            Ok(ev) => ev,
            Err(EventStreamError::Transport(e)) => return (batch, Some(e.at(index))),
            Err(other) => {
                let e = ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_event_stream",
                    other.to_string(),
                );
                return (batch, Some(e.at(index)));
            }
        };
        if ev.data.is_empty() {
            continue;
        }
        if ev.data.len() > max_event {
            return (batch, Some(too_large("the event", max_event).at(index)));
        }
        match validate_event(ev.data.as_bytes(), Some(thread)) {
            Ok(v) => batch.push(v),
            Err(e) => {
                let e = ApiError::invalid_event(e.message, e.field).at(index);
                return (batch, Some(e));
            }
        }
    }
    (batch, None)
}

/// What an ingest appended so far.
#[derive(Default)]
struct Tally {
    appended: usize,
    /// Events acknowledged as a producer's earlier appends (not appended again).
    duplicates: usize,
    first: Option<EventId>,
    last: Option<EventId>,
}

impl Tally {
    /// Events of the stream dealt with so far (the index of the next one).
    fn count(&self) -> usize {
        self.appended + self.duplicates
    }

    /// Appends `batch`. When the order checks refuse one of its events, the events before it
    /// are appended all the same (an ingest appends as its events arrive: how they happened to
    /// be grouped must not decide what is kept), then the refusal is returned.
    async fn append(
        &mut self,
        ingest: &Ingest,
        thread: &ThreadId,
        producer: Option<&Producer>,
        batch: &[ValidEvent],
    ) -> Result<(), ApiError> {
        let before = self.count();
        // The producer numbers events from the ingest's first one.
        let numbered = producer.map(|p| Producer {
            id: p.id.clone(),
            seq: p.seq + before as u64,
        });
        let refused = match ingest.append(thread, batch, numbered.as_ref()).await {
            Ok(done) => {
                self.record(batch, done);
                return Ok(());
            }
            Err(IngestError::Rejected(r)) => r,
            Err(e) => return Err(ApiError::from(e).offset_index(before)),
        };
        let valid = refused.index().min(batch.len());
        let refusal = ApiError::from(IngestError::Rejected(refused)).offset_index(before);
        if valid > 0 {
            match ingest
                .append(thread, &batch[..valid], numbered.as_ref())
                .await
            {
                Ok(done) => self.record(&batch[..valid], done),
                // Another node appended meanwhile: this refusal is the one that stands.
                Err(e) => return Err(ApiError::from(e).offset_index(before)),
            }
        }
        Err(refusal)
    }

    fn record(&mut self, batch: &[ValidEvent], done: Appended) {
        count_published(&batch[done.duplicates..]);
        self.duplicates += done.duplicates;
        self.appended += done.ids.len();
        self.first = self.first.or(done.ids.first().copied());
        self.last = done.ids.last().copied().or(self.last);
    }

    /// `e` with what was appended: `appended` and `lastId`.
    fn fail(&self, e: ApiError) -> ApiError {
        e.with("appended", json!(self.appended))
            .with("lastId", json!(self.last.map(|id| id.to_string())))
    }
}

/// The request body as the SSE parser gets it: a UTF-8 BOM removed, line ends rewritten to LF,
/// and its line structure checked ([`Framing`]). The complete events before a refused line, an
/// oversized event or the end of a stream inside an event still pass, then the error.
fn checked(
    body: impl Stream<Item = Result<Bytes, axum::Error>> + Send + 'static,
    max_event: usize,
) -> impl Stream<Item = Result<Bytes, ApiError>> + Send + 'static {
    let reader = Reader {
        body: Box::pin(body),
        framing: Framing::new(max_event),
        utf8_tail: Vec::new(),
        first: true,
        after_cr: false,
        done: false,
    };
    futures::stream::unfold(reader, |mut r| async move {
        let out = r.next_items().await?;
        Some((futures::stream::iter(out), r))
    })
    .flatten()
}

/// The state of [`checked`].
struct Reader<S> {
    body: std::pin::Pin<Box<S>>,
    framing: Framing,
    /// The bytes of a UTF-8 sequence split across chunks (at most 3).
    utf8_tail: Vec<u8>,
    first: bool,
    /// The last chunk ended with a CR: a LF at the start of the next one belongs to it.
    after_cr: bool,
    done: bool,
}

impl<S: Stream<Item = Result<Bytes, axum::Error>>> Reader<S> {
    /// What the next chunk of the body gives the parser; `None` once the stream ended.
    async fn next_items(&mut self) -> Option<Vec<Result<Bytes, ApiError>>> {
        if self.done {
            return None;
        }
        let chunk = match self.body.next().await {
            Some(Ok(chunk)) => chunk,
            Some(Err(e)) => {
                self.done = true;
                return Some(vec![Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "body_error",
                    format!("could not read the body: {e}"),
                ))]);
            }
            None => {
                self.done = true;
                return match self.finish() {
                    Ok(()) => None,
                    Err(e) => Some(vec![Err(e)]),
                };
            }
        };
        let mut chunk = chunk;
        if self.first && !chunk.is_empty() {
            // A UTF-8 BOM is tolerated (WHATWG SSE strips it); removed here because the parser
            // crate mishandles it.
            self.first = false;
            if chunk.starts_with(b"\xEF\xBB\xBF") {
                chunk = chunk.slice(3..);
            }
        }
        // The stream must be UTF-8 (WHATWG SSE): refuse a bad byte at once, since the parser
        // would otherwise buffer everything after it until the end of the body.
        if let Err(e) = check_utf8(&mut self.utf8_tail, &chunk) {
            self.done = true;
            return Some(vec![Err(e)]);
        }
        let chunk = to_lf(chunk, &mut self.after_cr);
        Some(match self.framing.feed(&chunk) {
            Ok(()) => vec![Ok(chunk)],
            Err((boundary, e)) => {
                self.done = true;
                vec![Ok(chunk.slice(..boundary)), Err(e)]
            }
        })
    }

    /// At the end of the body: nothing may be left half done.
    fn finish(&mut self) -> Result<(), ApiError> {
        if !self.utf8_tail.is_empty() {
            return Err(not_utf8());
        }
        self.framing.finish()
    }
}

/// Rewrites CRLF and a lone CR to LF (WHATWG's three line ends). `after_cr` carries a CR that
/// ended the previous chunk: a LF starting this one is the rest of its CRLF.
fn to_lf(chunk: Bytes, after_cr: &mut bool) -> Bytes {
    let skip_lf = std::mem::take(after_cr) && chunk.first() == Some(&b'\n');
    if !skip_lf && memchr::memchr(b'\r', &chunk).is_none() {
        return chunk;
    }
    let bytes = &chunk[usize::from(skip_lf)..];
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\r' {
            out.push(b'\n');
            match bytes.get(i + 1) {
                Some(b'\n') => i += 1,
                Some(_) => {}
                None => *after_cr = true,
            }
        } else {
            out.push(bytes[i]);
        }
        i += 1;
    }
    Bytes::from(out)
}

/// Checks that `chunk`, after the incomplete sequence `tail` left by the previous chunk, is
/// UTF-8; keeps a sequence this chunk leaves incomplete in `tail`.
fn check_utf8(tail: &mut Vec<u8>, chunk: &[u8]) -> Result<(), ApiError> {
    let joined;
    let bytes: &[u8] = if tail.is_empty() {
        chunk
    } else {
        joined = [tail.as_slice(), chunk].concat();
        &joined
    };
    match std::str::from_utf8(bytes) {
        Ok(_) => {
            tail.clear();
            Ok(())
        }
        Err(e) if e.error_len().is_none() => {
            *tail = bytes[e.valid_up_to()..].to_vec();
            Ok(())
        }
        Err(_) => Err(not_utf8()),
    }
}

fn not_utf8() -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_event_stream",
        "the event stream is not valid UTF-8",
    )
}

/// The longest field name of an event stream (`event`, `retry`).
const LONGEST_NAME: usize = 5;

/// What a line of an event stream is (WHATWG HTML §9.2.6, "Interpreting an event stream").
#[derive(Clone, Copy, Debug, PartialEq)]
enum Line {
    Blank,
    Comment,
    Data,
    /// `id`, `event` or `retry`: ignored by an ingest, but part of an event stream.
    Other,
}

/// Checks the line structure of an event stream as its bytes arrive (LF line ends only:
/// [`to_lf`] runs first): every line is blank, a comment or a field named `data`, `id`,
/// `event` or `retry` (with or without a value); no more than `cap` bytes come between two
/// blank lines; the stream does not end inside an event.
struct Framing {
    /// Most bytes from one blank line to the next: an event's data and its field names.
    cap: usize,
    /// The event's data limit, for messages.
    max_event: usize,
    /// Number of the current line, from 1.
    line: usize,
    /// The start of the current line until its kind is known (its field name).
    name: Vec<u8>,
    /// The current line's kind, once known.
    kind: Option<Line>,
    /// Bytes since the last blank line.
    since_blank: usize,
    /// Line of the first `data` field since the last blank line: an event is under way.
    event_line: Option<usize>,
}

impl Framing {
    fn new(max_event: usize) -> Framing {
        Framing {
            // Field names, `data: ` prefixes and line ends of a multi-line event.
            cap: max_event + 1024,
            max_event,
            line: 1,
            name: Vec::with_capacity(LONGEST_NAME + 1),
            kind: None,
            since_blank: 0,
            event_line: None,
        }
    }

    /// Checks the next `bytes` of the stream. On failure: the length of the prefix of `bytes`
    /// that ends at the last blank line (the complete events in it may still be appended), and
    /// the error.
    fn feed(&mut self, bytes: &[u8]) -> Result<(), (usize, ApiError)> {
        let mut boundary = 0;
        let mut at = 0;
        loop {
            let rest = &bytes[at..];
            let (line, ended) = match memchr::memchr(b'\n', rest) {
                Some(n) => (&rest[..n], true),
                None => (rest, false),
            };
            self.since_blank += line.len() + usize::from(ended);
            self.read(line).map_err(|e| (boundary, e))?;
            if !ended {
                break;
            }
            at += line.len() + 1;
            if self.end_line().map_err(|e| (boundary, e))? == Line::Blank {
                boundary = at;
                self.since_blank = 0;
            }
        }
        if self.since_blank > self.cap {
            return Err((boundary, too_large("the event", self.max_event)));
        }
        Ok(())
    }

    /// The end of the stream: its last line counts even without a line end; an event under
    /// way (a `data` field and no blank line after it) is refused.
    fn finish(&mut self) -> Result<(), ApiError> {
        if self.kind.is_some() || !self.name.is_empty() {
            self.end_line()?;
        }
        match self.event_line {
            None => Ok(()),
            Some(line) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_event_stream",
                format!(
                    "the stream ended inside the event that starts on line {line}: an event \
                     ends with a blank line, and an incomplete one is not appended (WHATWG \
                     HTML §9.2.6)"
                ),
            )),
        }
    }

    /// More bytes of the current line (no line end): its field name until it is known.
    fn read(&mut self, bytes: &[u8]) -> Result<(), ApiError> {
        if self.kind.is_some() {
            return Ok(());
        }
        for &b in bytes {
            if b == b':' {
                self.kind = Some(self.classify()?);
                return Ok(());
            }
            self.name.push(b);
            if self.name.len() > LONGEST_NAME {
                return Err(self.not_sse());
            }
        }
        Ok(())
    }

    /// The end of the current line; its kind.
    fn end_line(&mut self) -> Result<Line, ApiError> {
        let kind = match self.kind.take() {
            Some(kind) => kind,
            None if self.name.is_empty() => Line::Blank,
            // A field without a colon: its name is the whole line (WHATWG).
            None => self.classify()?,
        };
        match kind {
            Line::Blank => self.event_line = None,
            Line::Data => {
                self.event_line.get_or_insert(self.line);
            }
            Line::Comment | Line::Other => {}
        }
        self.name.clear();
        self.line += 1;
        Ok(kind)
    }

    /// The kind of a line whose field name (up to a colon, or the line's end) is `self.name`.
    fn classify(&self) -> Result<Line, ApiError> {
        match self.name.as_slice() {
            b"" => Ok(Line::Comment),
            b"data" => Ok(Line::Data),
            b"id" | b"event" | b"retry" => Ok(Line::Other),
            _ => Err(self.not_sse()),
        }
    }

    fn not_sse(&self) -> ApiError {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_event_stream",
            format!(
                "line {} is not part of an event stream: it starts with {:?}, which is neither a \
                 comment (\":\") nor a field (data, id, event, retry)",
                self.line,
                String::from_utf8_lossy(&self.name)
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `chunks` to a fresh [`Framing`] and finishes it; the first error's message.
    fn framing(chunks: &[&str]) -> Result<(), String> {
        let mut f = Framing::new(64);
        for c in chunks {
            f.feed(c.as_bytes()).map_err(|(_, e)| e.to_string())?;
        }
        f.finish().map_err(|e| e.to_string())
    }

    #[test]
    fn event_streams_pass() {
        for chunks in [
            &["data: {}\n\n"][..],
            &[": comment\nid: 1\nevent: x\nretry: 5\ndata: {}\n\n"],
            &["da", "ta: {}\n", "\n"],
            &["data\n\n"],
            &["data: {}\n\n: a comment without a line end"],
            &["id: 7"],
            &[""],
        ] {
            assert_eq!(framing(chunks), Ok(()), "{chunks:?}");
        }
    }

    #[test]
    fn what_is_not_an_event_stream_is_refused() {
        for (chunks, line, shown) in [
            (&["{\"type\":\"RUN_STARTED\"}"][..], 1, "{\"type"),
            (&["hello\n\n"], 1, "hello"),
            (&["data: {}\n\nnot sse at all"], 3, "not ss"),
            (&["data: {}\n", " data: {}\n\n"], 2, " data"),
            (&["dat", "um: 1\n\n"], 1, "datum"),
        ] {
            let e = framing(chunks).unwrap_err();
            assert!(e.contains("invalid_event_stream"), "{chunks:?}: {e}");
            assert!(e.contains(&format!("line {line} ")), "{chunks:?}: {e}");
            assert!(e.contains(&format!("{shown:?}")), "{chunks:?}: {e}");
        }
    }

    #[test]
    fn a_stream_that_ends_inside_an_event_is_refused() {
        for (chunks, line) in [
            (&["data: {}"][..], 1),
            (&["data: {}\n"], 1),
            (&["data: {}\n\nid: 2\ndata: {\n", "data: }\n"], 4),
            (&["data"], 1),
        ] {
            let e = framing(chunks).unwrap_err();
            assert!(
                e.contains(&format!(
                    "ended inside the event that starts on line {line}:"
                )),
                "{chunks:?}: {e}"
            );
        }
    }

    #[test]
    fn the_prefix_before_a_refused_line_ends_at_the_last_blank_line() {
        let mut f = Framing::new(64);
        let bytes = b"data: {}\n\ndata: {}\nnope: 1\n\n";
        let (boundary, _) = f.feed(bytes).unwrap_err();
        assert_eq!(boundary, "data: {}\n\n".len());
        let mut f = Framing::new(8);
        let long = format!("data: 1\n\ndata: {}", "x".repeat(2000));
        let (boundary, e) = f.feed(long.as_bytes()).unwrap_err();
        assert_eq!((boundary, e.status()), (9, StatusCode::PAYLOAD_TOO_LARGE));
    }

    #[test]
    fn line_ends_become_lf() {
        let mut after_cr = false;
        let mut lf = |s: &'static str| to_lf(Bytes::from_static(s.as_bytes()), &mut after_cr);
        assert_eq!(lf("a\r\nb\rc\n"), "a\nb\nc\n");
        assert_eq!(lf("d\r"), "d\n");
        assert_eq!(lf("\ne\r\r"), "e\n\n", "the LF of a split CRLF is dropped");
        assert_eq!(lf("\nf"), "f", "the LF after a CR ending the last chunk");
        assert_eq!(lf("\ng"), "\ng");
    }
}
