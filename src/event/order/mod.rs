//! AG-UI event-order rules: the client pipeline's `transformChunks` → `verifyEvents` on one
//! stream, as `@ag-ui/client` 1.0.0 runs them (PROTOCOL §2 "Order validation", AGUI.md §5).
//!
//! - [`rule`]: the stable rule codes and [`OrderViolation`] (a leaf the others import).
//! - `open`: what is still open ([`OpenConstructs`]) and the run's lifecycle
//!   ([`RunLifecycle`]): the input of a prelude (PROTOCOL §5).
//! - `verify`: [`OrderVerifier`], the mirror of `verifyEvents`.
//! - `chunks`: [`ChunkExpander`], the mirror of `transformChunks`.
//! - here: [`OrderChecker`], both stages on one stream, transactional per event: what the
//!   broker runs on every published event.

mod chunks;
mod open;
pub mod rule;
mod verify;

pub use chunks::{ChunkExpander, Expanded, LaneKind, LaneStream, OpenLane};
pub use open::{OpenConstructs, OpenItem, OpenItems, OpenKind, RunLifecycle};
pub use rule::OrderViolation;
pub use verify::OrderVerifier;

use crate::event::ContentRef;
use serde_json::Value;

/// The client pipeline's order stages on one stream: [`ChunkExpander`] (`transformChunks`)
/// then [`OrderVerifier`] (`verifyEvents`), as `@ag-ui/client` 1.0.0 runs them on each HTTP
/// response. The broker keeps one per thread, fed with the thread's log from its first event.
///
/// Every method that takes an event is transactional: on error nothing changes. To check a
/// batch all-or-nothing, use [`Self::check_batch`] (or check on a clone and commit).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OrderChecker {
    expander: ChunkExpander,
    verifier: OrderVerifier,
}

impl OrderChecker {
    /// A checker at the start of a stream (a thread with no events).
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks one event as published and, when the client would accept it, records it.
    ///
    /// # Errors
    /// [`OrderViolation`] from chunk expansion or verification; the state is then unchanged.
    pub fn check(&mut self, event: &Value) -> Result<(), OrderViolation> {
        self.check_expanded(event).map(drop)
    }

    /// [`Self::check`], returning the expanded events the client's reducer would apply for
    /// this event (borrowed when it is the event itself, owned when synthesised): what a fold
    /// mirroring the client consumes.
    ///
    /// # Errors
    /// As [`Self::check`].
    pub fn check_expanded<'a>(&mut self, event: &'a Value) -> Result<Expanded<'a>, OrderViolation> {
        // The expander holds at most one lane per subagent: cloning it is cheap.
        let mut expander = self.expander.clone();
        let expanded = expander.expand(event)?;
        match expanded.as_slice() {
            [] => {}
            // `verify` is atomic on its own.
            [one] => self.verifier.verify(one)?,
            many => {
                let mut verifier = self.verifier.clone();
                for each in many {
                    verifier.verify(each)?;
                }
                self.verifier = verifier;
            }
        }
        self.expander = expander;
        Ok(expanded)
    }

    /// [`Self::check`] on a shared checker, for an event that changes nothing whether it
    /// passes or not ([`OrderVerifier::verify_unchanged`], with no chunk lane open: any event
    /// may close one). `None` when the event may change the checker: check it on a copy.
    pub fn check_unchanged(&self, event: &Value) -> Option<Result<(), OrderViolation>> {
        if !self.expander.open_lanes().is_empty() {
            return None;
        }
        self.verifier.verify_unchanged(event)
    }

    /// [`Self::check_unchanged`] for a content delta given by its fields
    /// ([`OrderVerifier::verify_content_unchanged`]).
    pub fn check_content(&self, content: ContentRef<'_>) -> Option<Result<(), OrderViolation>> {
        if !self.expander.open_lanes().is_empty() {
            return None;
        }
        self.verifier.verify_content_unchanged(content)
    }

    /// Checks a batch all-or-nothing: either every event passes and all are recorded, or
    /// nothing changes.
    ///
    /// # Errors
    /// The position within the batch of the first refused event, and why.
    pub fn check_batch<'a, I>(&mut self, events: I) -> Result<(), (usize, OrderViolation)>
    where
        I: IntoIterator<Item = &'a Value>,
    {
        let mut scratch = self.clone();
        for (index, event) in events.into_iter().enumerate() {
            scratch
                .check(event)
                .map_err(|violation| (index, violation))?;
        }
        *self = scratch;
        Ok(())
    }

    /// The open constructs and run status (`verifyEvents`' view).
    pub fn open(&self) -> &OpenConstructs {
        self.verifier.open()
    }

    /// The chunk lanes still assembling a stream (`transformChunks`' view). A lane's item is
    /// normally also an open text message / tool call / reasoning message in [`Self::open`]
    /// (same id); a prelude re-opens such an item with [`OpenLane::reopening_chunk`] rather
    /// than its plain START, so later id-less chunks continue it.
    ///
    /// Edge case, as in the client: an explicit END attributed to another lane (e.g. an
    /// untagged `TEXT_MESSAGE_END` for a message a subagent's chunks opened) closes the item
    /// in the verifier but not the lane; the lane is then dead (the run terminal synthesises
    /// an END the verifier refuses).
    pub fn open_lanes(&self) -> &[OpenLane] {
        self.expander.open_lanes()
    }

    /// The chunk expander.
    pub fn expander(&self) -> &ChunkExpander {
        &self.expander
    }

    /// The verifier.
    pub fn verifier(&self) -> &OrderVerifier {
        &self.verifier
    }
}
