//! Request bodies read whole (JSON and NDJSON publishes): bounded in size
//! (`limits.max_body_bytes`, 413 `too_large`), in time (`limits.body_timeout`, 408
//! `body_timeout`) and, across every connection of the node, in memory
//! (`limits.bodies_in_flight_bytes`, 503 `busy` with `Retry-After`).
//!
//! Why a budget as well as a size limit: the size limit bounds one body, not how many are
//! read at once; twenty connections each sending 15 MiB and never finishing held 400 MB. The
//! budget is taken as bytes arrive (or at once for a declared `Content-Length`) and given back
//! when the handler drops the [`HeldBody`]; the time limit makes a body that trickles in, or
//! never ends, give its share back within `limits.body_timeout`.

use super::ApiError;
use crate::config::LimitsConfig;
use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use bytes::Bytes;
use futures::StreamExt;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The node's budget for request bodies in flight, in bytes (`limits.bodies_in_flight_bytes`).
/// Cheap to clone (one `Arc`).
#[derive(Clone, Debug)]
pub struct BodyBudget {
    bytes: Arc<Semaphore>,
}

impl BodyBudget {
    /// A budget of `total` bytes.
    pub fn new(total: usize) -> Self {
        BodyBudget {
            bytes: Arc::new(Semaphore::new(total.min(Semaphore::MAX_PERMITS))),
        }
    }

    /// Bytes of the budget not taken now.
    pub fn available(&self) -> usize {
        self.bytes.available_permits()
    }

    /// Takes `n` more bytes of the budget, without waiting.
    ///
    /// # Errors
    /// 503 `busy` with `Retry-After: 1` when they are not free.
    pub(super) fn take(&self, n: usize) -> Result<OwnedSemaphorePermit, ApiError> {
        u32::try_from(n)
            .ok()
            .and_then(|n| self.bytes.clone().try_acquire_many_owned(n).ok())
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "busy",
                    "the node is reading as many request bytes as it may hold \
                     (limits.bodies_in_flight_bytes); retry",
                )
                .retry_after(1)
            })
    }
}

/// A body read whole, holding its share of the [`BodyBudget`] until dropped.
#[derive(Debug)]
pub(crate) struct HeldBody {
    /// The body.
    pub bytes: Bytes,
    /// The budget taken for it (the bytes its buffer holds).
    _held: OwnedSemaphorePermit,
}

impl HeldBody {
    /// `bytes`, holding `held` (taken from the budget for them) until dropped.
    pub(super) fn new(bytes: Bytes, held: OwnedSemaphorePermit) -> Self {
        HeldBody { bytes, _held: held }
    }
}

/// 413 `too_large`: `what` exceeds `limit` bytes.
pub(super) fn too_large(what: &str, limit: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too_large",
        format!("{what} exceeds the limit of {limit} bytes"),
    )
}

/// Size of the blocks a large body without a declared length is read into.
///
/// Why blocks rather than one growing buffer: a buffer that doubles while a body arrives
/// allocates every size from the first chunk's to the body's (… 2 MiB, 4 MiB, 8 MiB, 16 MiB),
/// holds up to twice what arrived, and the allocator keeps what was freed for a while and
/// cannot give a freed 2 MiB to a 4 MiB request: the fault suite's endless bodies overshot
/// the memory formula that way (measurements in `loadtest/REPORT.md`). Blocks are never
/// reallocated, a freed one serves the next body's, and the budget counts exactly the blocks
/// held. Below this size the first block grows by doubling as a single buffer would
/// (sizes every request uses): a body of one block is never copied again.
///
/// Why copies rather than the `Bytes` chunks hyper hands over: a chunk is a slice of the
/// connection's read buffer and keeps all of that buffer alive, a size the chunk does not
/// tell; a copy is what the budget counts, and the read buffer is reused for the next read.
const BLOCK_BYTES: usize = 64 * 1024;

/// A body as it arrives, in blocks taken from the budget before they are allocated.
/// Invariants: `held` is `first`'s size as taken plus [`BLOCK_BYTES`] per block of `rest`
/// (the last one's may be less: up to the size limit); every block but the last is full, so
/// `held - len` is the room in the last one.
#[derive(Debug)]
struct Blocks {
    /// The first block: a declared length, or grown by doubling up to [`BLOCK_BYTES`].
    first: Vec<u8>,
    /// The blocks after the first, never reallocated.
    rest: Vec<Vec<u8>>,
    /// Bytes in the blocks.
    len: usize,
    /// The budget taken for the blocks: their sizes, exactly.
    held: OwnedSemaphorePermit,
}

impl Blocks {
    /// Room for a `declared` length (0: none declared), taken from `budget` at once.
    fn new(budget: &BodyBudget, declared: usize) -> Result<Self, ApiError> {
        Ok(Blocks {
            held: budget.take(declared)?,
            first: Vec::with_capacity(declared),
            rest: Vec::new(),
            len: 0,
        })
    }

    /// Appends `chunk`, taking budget before anything is allocated.
    ///
    /// # Errors
    /// 413 `too_large` past `max` bytes; 503 `busy` when the budget has no room for a block.
    fn push(&mut self, mut chunk: &[u8], budget: &BodyBudget, max: usize) -> Result<(), ApiError> {
        if self.len + chunk.len() > max {
            return Err(too_large("the request body", max));
        }
        while !chunk.is_empty() {
            let held = self.held.num_permits();
            let mut room = held - self.len;
            if room == 0 && self.rest.is_empty() && held < BLOCK_BYTES {
                // Grow the first block (doubling, up to a block), as a single buffer would.
                let size = (self.len + chunk.len())
                    .max(held * 2)
                    .min(BLOCK_BYTES)
                    .min(max);
                self.held.merge(budget.take(size - held)?);
                self.first.reserve_exact(size - self.len);
                room = size - self.len;
            } else if room == 0 {
                let size = BLOCK_BYTES.min(max - self.len);
                self.held.merge(budget.take(size)?);
                self.rest.push(Vec::with_capacity(size));
                room = size;
            }
            let (now, rest) = chunk.split_at(room.min(chunk.len()));
            self.rest
                .last_mut()
                .unwrap_or(&mut self.first)
                .extend_from_slice(now);
            self.len += now.len();
            chunk = rest;
        }
        Ok(())
    }

    /// The body in one buffer. A body of more than one block is joined once: one allocation
    /// of its length, each block freed as soon as it is copied, and the budget taken beyond
    /// the length given back.
    fn finish(self) -> HeldBody {
        let Blocks {
            first,
            rest,
            len,
            mut held,
        } = self;
        if rest.is_empty() {
            return HeldBody {
                bytes: Bytes::from(first),
                _held: held,
            };
        }
        let mut joined = Vec::with_capacity(len);
        joined.extend_from_slice(&first);
        drop(first);
        for block in rest {
            joined.extend_from_slice(&block);
        }
        drop(held.split(held.num_permits() - len));
        HeldBody {
            bytes: Bytes::from(joined),
            _held: held,
        }
    }
}

/// Reads `body` whole. A declared `Content-Length` (in `headers`) over the size limit is
/// refused before anything is read, and its bytes are taken from `budget` at once; a body
/// without one takes the budget as it arrives, block by block ([`BLOCK_BYTES`]). Everything
/// must arrive within `limits.body_timeout` of the call.
///
/// # Errors
/// 413 `too_large`; 503 `busy` (budget exhausted, `Retry-After: 1`); 408 `body_timeout`;
/// 400 `body_error` when the connection fails.
pub(crate) async fn read_whole(
    body: Body,
    headers: &HeaderMap,
    limits: &LimitsConfig,
    budget: &BodyBudget,
) -> Result<HeldBody, ApiError> {
    let max = limits.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large("the request body", max));
    }
    // Bounded by `max` just above.
    let mut blocks = Blocks::new(budget, declared.unwrap_or(0) as usize)?;
    let read = async {
        let mut frames = body.into_data_stream();
        while let Some(chunk) = frames.next().await {
            let chunk = chunk.map_err(|e| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "body_error",
                    format!("could not read the body: {e}"),
                )
            })?;
            blocks.push(&chunk, budget, max)?;
        }
        Ok::<_, ApiError>(())
    };
    tokio::time::timeout(limits.body_timeout, read)
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                format!(
                    "the request body did not arrive whole within {} (limits.body_timeout)",
                    humantime::format_duration(limits.body_timeout)
                ),
            )
        })??;
    Ok(blocks.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn limits() -> LimitsConfig {
        LimitsConfig {
            max_body_bytes: 1000,
            body_timeout: Duration::from_secs(30),
            ..LimitsConfig::default()
        }
    }

    fn declared(n: usize) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, n.into());
        h
    }

    /// A body that sends `first` and then nothing, ever.
    fn endless(first: &'static [u8]) -> Body {
        let chunks = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(first))])
            .chain(futures::stream::pending());
        Body::from_stream(chunks)
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_never_ends_is_cut_at_the_timeout_and_gives_its_budget_back() {
        let budget = BodyBudget::new(4096);
        let started = tokio::time::Instant::now();
        let e = read_whole(endless(b"{\"a\":"), &HeaderMap::new(), &limits(), &budget)
            .await
            .unwrap_err();
        assert_eq!(e.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        assert_eq!(budget.available(), 4096);
    }

    #[tokio::test]
    async fn the_budget_is_shared_and_given_back() {
        let budget = BodyBudget::new(1500);
        let a = read_whole(
            Body::from("x".repeat(900)),
            &declared(900),
            &limits(),
            &budget,
        )
        .await
        .expect("fits");
        assert_eq!(a.bytes.len(), 900);
        assert_eq!(budget.available(), 600);
        // A second declared body does not fit while the first is held: 503 busy at once.
        let e = read_whole(
            Body::from("y".repeat(700)),
            &declared(700),
            &limits(),
            &budget,
        )
        .await
        .unwrap_err();
        assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
        // Nor does an undeclared one, once its buffer outgrows what is left.
        let e = read_whole(
            Body::from("z".repeat(700)),
            &HeaderMap::new(),
            &limits(),
            &budget,
        )
        .await
        .unwrap_err();
        assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(budget.available(), 600, "a refused body holds nothing");
        drop(a);
        assert_eq!(budget.available(), 1500);
        let b = read_whole(
            Body::from("y".repeat(700)),
            &HeaderMap::new(),
            &limits(),
            &budget,
        )
        .await
        .expect("fits now");
        assert_eq!(&b.bytes[..], "y".repeat(700).as_bytes());
    }

    /// Where the blocks after the first are, and their sizes.
    fn layout(b: &Blocks) -> Vec<(*const u8, usize)> {
        b.rest.iter().map(|x| (x.as_ptr(), x.capacity())).collect()
    }

    #[test]
    fn blocks_never_move_and_the_budget_counts_exactly_what_they_hold() {
        let budget = BodyBudget::new(64 << 20);
        let total = budget.available();
        let mut blocks = Blocks::new(&budget, 0).expect("nothing taken yet");
        let mut expected = Vec::new();
        let mut before = layout(&blocks);
        for (i, n) in [1, 100, 5000, 70_000, 200_000, 3, BLOCK_BYTES, 1_000_000, 17]
            .into_iter()
            .enumerate()
        {
            let chunk = vec![i as u8; n];
            blocks.push(&chunk, &budget, 16 << 20).expect("fits");
            expected.extend_from_slice(&chunk);
            let now = layout(&blocks);
            // No block was reallocated: those there before are where they were, as large.
            assert_eq!(now[..before.len()], before[..], "after chunk {i}");
            let held = blocks.first.capacity() + now.iter().map(|(_, size)| size).sum::<usize>();
            assert_eq!(total - budget.available(), held, "after chunk {i}");
            assert!(blocks.first.capacity() <= BLOCK_BYTES);
            assert!(now.iter().all(|(_, size)| *size == BLOCK_BYTES));
            assert!(held - blocks.len < BLOCK_BYTES, "one block's room at most");
            before = now;
        }
        assert!(before.len() >= 20, "the body is held in many blocks");
        let body = blocks.finish();
        assert_eq!(&body.bytes[..], &expected[..]);
        assert_eq!(
            total - budget.available(),
            expected.len(),
            "once joined, the body holds its length"
        );
        drop(body);
        assert_eq!(budget.available(), total);
    }

    #[test]
    fn a_small_body_is_one_buffer_counted_by_its_capacity() {
        let budget = BodyBudget::new(1 << 20);
        let total = budget.available();
        let mut blocks = Blocks::new(&budget, 0).expect("nothing taken yet");
        for chunk in [&b"[{\"type\""[..], b":\"RUN_STARTED\"", b"}]"] {
            blocks.push(chunk, &budget, 1000).expect("fits");
            assert_eq!(total - budget.available(), blocks.first.capacity());
        }
        assert!(blocks.rest.is_empty());
        let body = blocks.finish();
        assert_eq!(&body.bytes[..], br#"[{"type":"RUN_STARTED"}]"#);
    }

    #[tokio::test(start_paused = true)]
    async fn a_growing_body_holds_what_it_sent_and_one_block_at_most() {
        // 8 MiB and one byte in 64 KiB chunks, then nothing: a buffer grown by doubling
        // would hold (and count) 16 MiB here.
        let budget = BodyBudget::new(64 << 20);
        let total = budget.available();
        let limits = LimitsConfig {
            max_body_bytes: 16 << 20,
            body_timeout: Duration::from_secs(30),
            ..LimitsConfig::default()
        };
        let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Bytes, std::io::Error>>();
        let sent = (8 << 20) + 1;
        for _ in 0..128 {
            tx.unbounded_send(Ok(Bytes::from(vec![b' '; 64 << 10])))
                .expect("the receiver is alive");
        }
        tx.unbounded_send(Ok(Bytes::from_static(b"[")))
            .expect("the receiver is alive");
        let reader = tokio::spawn({
            let budget = budget.clone();
            async move { read_whole(Body::from_stream(rx), &HeaderMap::new(), &limits, &budget).await }
        });
        // The clock moves only once every task waits: the reader has taken every chunk.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let held = total - budget.available();
        assert!(
            (sent..sent + BLOCK_BYTES).contains(&held),
            "holds {held} bytes of the budget for {sent} sent"
        );
        let e = reader.await.expect("no panic").unwrap_err();
        assert_eq!(e.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(budget.available(), total);
        drop(tx);
    }

    /// `len` bytes that differ from one position to the next (a misplaced block shows).
    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    /// `bytes` as a body that arrives in chunks of the sizes `sizes` cycles through.
    fn chunked(bytes: &[u8], sizes: &[usize]) -> Body {
        let mut chunks = Vec::new();
        let mut at = 0;
        for size in sizes.iter().cycle() {
            if at == bytes.len() {
                break;
            }
            let end = (at + size).min(bytes.len());
            chunks.push(Ok::<_, std::io::Error>(Bytes::copy_from_slice(
                &bytes[at..end],
            )));
            at = end;
        }
        Body::from_stream(futures::stream::iter(chunks))
    }

    fn limit(max_body_bytes: usize) -> LimitsConfig {
        LimitsConfig {
            max_body_bytes,
            body_timeout: Duration::from_secs(30),
            ..LimitsConfig::default()
        }
    }

    #[tokio::test]
    async fn any_split_or_join_of_the_chunks_gives_the_body_and_holds_its_length() {
        let body = pattern(3 * BLOCK_BYTES + 17);
        let budget = BodyBudget::new(64 << 20);
        let total = budget.available();
        for sizes in [
            &[body.len()][..],
            &[1],
            &[7, 5000],
            &[BLOCK_BYTES - 1],
            &[BLOCK_BYTES],
            &[BLOCK_BYTES + 1],
            &[2 * BLOCK_BYTES + 3, 1],
            &[100, 70_000, 3, 65_535, 131_073],
        ] {
            let held = read_whole(
                chunked(&body, sizes),
                &HeaderMap::new(),
                &limit(16 << 20),
                &budget,
            )
            .await
            .expect("fits");
            assert!(held.bytes == body, "chunks of {sizes:?}");
            assert_eq!(
                total - budget.available(),
                body.len(),
                "chunks of {sizes:?}"
            );
            drop(held);
            assert_eq!(budget.available(), total, "chunks of {sizes:?}");
        }
    }

    #[tokio::test]
    async fn the_size_limit_is_exact_at_the_boundary() {
        let budget = BodyBudget::new(64 << 20);
        let total = budget.available();
        for max in [
            1000,
            BLOCK_BYTES,
            BLOCK_BYTES + 1,
            2 * BLOCK_BYTES,
            5 * BLOCK_BYTES - 3,
        ] {
            let body = pattern(max + 1);
            for sizes in [&[4096][..], &[max], &[max + 1]] {
                let held = read_whole(
                    chunked(&body[..max], sizes),
                    &HeaderMap::new(),
                    &limit(max),
                    &budget,
                )
                .await
                .unwrap_or_else(|e| panic!("{max} bytes under a limit of {max}: {e:?}"));
                assert!(
                    held.bytes == body[..max],
                    "limit {max}, chunks of {sizes:?}"
                );
                drop(held);
                let e = read_whole(
                    chunked(&body, sizes),
                    &HeaderMap::new(),
                    &limit(max),
                    &budget,
                )
                .await
                .unwrap_err();
                assert_eq!(
                    e.status(),
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "limit {max}, chunks of {sizes:?}"
                );
                assert_eq!(e.reason(), "too_large");
                assert_eq!(
                    budget.available(),
                    total,
                    "limit {max}, chunks of {sizes:?}"
                );
            }
            let held = read_whole(
                chunked(&body[..max], &[4096]),
                &declared(max),
                &limit(max),
                &budget,
            )
            .await
            .expect("a declared length at the limit fits");
            assert!(held.bytes == body[..max]);
            drop(held);
            let e = read_whole(endless(b"["), &declared(max + 1), &limit(max), &budget)
                .await
                .unwrap_err();
            assert_eq!(
                e.status(),
                StatusCode::PAYLOAD_TOO_LARGE,
                "refused before reading"
            );
            assert_eq!(budget.available(), total);
        }
    }

    #[tokio::test]
    async fn a_body_of_one_block_is_never_copied() {
        let budget = BodyBudget::new(64 << 20);
        // A declared length, however large: one buffer of that length, taken at once.
        let n = 3 * BLOCK_BYTES + 5;
        let mut blocks = Blocks::new(&budget, n).expect("fits");
        let at = blocks.first.as_ptr();
        for part in pattern(n).chunks(1000) {
            blocks.push(part, &budget, 16 << 20).expect("fits");
        }
        assert!(blocks.rest.is_empty());
        let body = blocks.finish();
        assert_eq!(body.bytes.as_ptr(), at, "the declared buffer is the body");
        assert_eq!(budget.available(), (64 << 20) - n);
        drop(body);
        // No declared length, one block at most: the first block is the body.
        let mut blocks = Blocks::new(&budget, 0).expect("nothing taken yet");
        let mut at = None;
        for part in pattern(BLOCK_BYTES).chunks(10_000) {
            blocks.push(part, &budget, 16 << 20).expect("fits");
            at = Some(blocks.first.as_ptr());
        }
        assert!(blocks.rest.is_empty());
        let body = blocks.finish();
        assert_eq!(Some(body.bytes.as_ptr()), at, "the first block is the body");
        assert!(body.bytes == pattern(BLOCK_BYTES));
    }

    #[tokio::test]
    async fn an_exhausted_budget_is_503_busy_with_retry_after_and_holds_nothing() {
        // Room for two blocks and a half: a third block does not fit.
        let budget = BodyBudget::new(BLOCK_BYTES * 5 / 2);
        let total = budget.available();
        let body = pattern(3 * BLOCK_BYTES);
        for (body, headers) in [
            (chunked(&body, &[4096]), HeaderMap::new()),
            (chunked(&body, &[4096]), declared(body.len())),
        ] {
            let e = read_whole(body, &headers, &limit(16 << 20), &budget)
                .await
                .unwrap_err();
            assert_eq!(e.reason(), "busy");
            let answer = axum::response::IntoResponse::into_response(e);
            assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(answer.headers()[header::RETRY_AFTER], "1");
            let json = axum::body::to_bytes(answer.into_body(), 1 << 16)
                .await
                .expect("a small answer");
            let json: serde_json::Value = serde_json::from_slice(&json).expect("JSON");
            assert_eq!(json["error"]["code"], "busy", "{json}");
            assert_eq!(budget.available(), total, "a refused body holds nothing");
        }
    }

    #[tokio::test]
    async fn sizes_over_the_limit_are_413() {
        let budget = BodyBudget::new(1 << 20);
        for (body, headers) in [
            (Body::from("x".repeat(1001)), declared(1001)),
            (Body::from("x".repeat(1001)), HeaderMap::new()),
        ] {
            let e = read_whole(body, &headers, &limits(), &budget)
                .await
                .unwrap_err();
            assert_eq!(e.status(), StatusCode::PAYLOAD_TOO_LARGE);
        }
        assert_eq!(budget.available(), 1 << 20);
    }
}
