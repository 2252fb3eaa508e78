//! What the hub synthesises from a thread's fold, encoded once per position and shared by
//! every connection that needs it (PROTOCOL §5): the prelude a new subscriber gets at the
//! cursor, and the snapshots every reset bridge to the cursor carries. A thousand clients
//! joining or resuming at one position then hold one copy of the fold's restatement, not a
//! thousand.

use super::ThreadState;
use crate::event::order::OrderChecker;
use crate::fold::prelude;
use crate::log::{Epoch, EventId, StreamPos};
use crate::queue::{Frame, SharedEvents};
use std::sync::Arc;
use std::time::Instant;

/// The encodings of one fold state, under the thread's lock ([`ThreadState::encoded`]).
#[derive(Default)]
pub(super) struct Encoded {
    /// The fold state they stand for: the hub's epoch, cursor and view when they were made.
    /// Holding the view keeps its allocation alive, so a new view (any new fold: the fan-out
    /// replaces the view whenever the order state changes, and a rebuilt fold comes with its
    /// own) can never have the same address.
    at: Option<(Epoch, StreamPos, Arc<OrderChecker>)>,
    /// The prelude at `at` (`Some(None)`: the thread had no run, no prelude).
    prelude: Option<Option<Frame>>,
    /// [`prelude::bridge_snapshots`] at `at`.
    bridge_snapshots: Option<SharedEvents>,
}

impl ThreadState {
    /// The prelude of the fold at the cursor, encoded once for every subscriber that starts
    /// there (its `bytes` are one allocation, shared). `None` when the fold is unknown or the
    /// thread never had a run.
    pub(super) fn encoded_prelude(&mut self) -> Option<Frame> {
        self.encoded_fresh()?;
        if let Some(p) = &self.encoded.prelude {
            return p.clone();
        }
        let (fold, head) = (self.fold.as_ref()?, self.head?);
        let events = prelude::prelude(fold);
        let frame = (!events.is_empty()).then(|| {
            let id = EventId {
                epoch: head.epoch,
                pos: self.cursor,
            };
            Frame::synthesised(id, &events, Instant::now(), self.view.clone())
        });
        self.encoded.prelude = Some(frame.clone());
        frame
    }

    /// The snapshots every reset bridge to the fold at the cursor carries, encoded once.
    /// `None` when the fold is unknown.
    pub(super) fn encoded_bridge_snapshots(&mut self) -> Option<SharedEvents> {
        self.encoded_fresh()?;
        if let Some(s) = &self.encoded.bridge_snapshots {
            return Some(s.clone());
        }
        let shared = SharedEvents::encode(&prelude::bridge_snapshots(self.fold.as_ref()?));
        self.encoded.bridge_snapshots = Some(shared.clone());
        Some(shared)
    }

    /// Drops encodings of another fold state than the current one. `None` when the fold is
    /// unknown (nothing can be encoded).
    fn encoded_fresh(&mut self) -> Option<()> {
        let (head, view) = (self.head?, self.view.clone()?);
        self.fold.as_ref()?;
        let current = match &self.encoded.at {
            Some((epoch, pos, v)) => {
                *epoch == head.epoch && *pos == self.cursor && Arc::ptr_eq(v, &view)
            }
            None => false,
        };
        if !current {
            self.encoded = Encoded {
                at: Some((head.epoch, self.cursor, view)),
                ..Encoded::default()
            };
        }
        Some(())
    }
}
