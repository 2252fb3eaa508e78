//! The writes a JSON Patch operation makes at a normalised pointer, each recorded with what it
//! overwrote, so a patch that fails part-way is taken back in O(operations applied) rather
//! than applied to a copy of the whole document (RFC 6902 §5: all or nothing).
//!
//! The walk (`walk.rs`) has already checked every operation the way `fast-json-patch` does and
//! normalised its pointer (canonical array indices, insertion points within the array), so a
//! write here only fails on a bug. The writes are done here rather than by the `json-patch`
//! crate because the crate drops the value an operation replaces or removes, and taking a
//! patch back needs it.

use super::Fail;
use json_patch::jsonptr::PointerBuf;
use serde_json::Value;

/// Where a write landed: the parent container's pointer and the member's decoded name (an
/// object key, or an array index in decimal).
#[derive(Debug)]
struct Location {
    parent: PointerBuf,
    member: String,
}

/// How to take one write back.
#[derive(Debug)]
enum Undo {
    /// A member that did not exist was inserted (a new object key, last; an array element):
    /// remove it.
    Inserted(Location),
    /// A member's value was overwritten in place (an object key keeps its position): put the
    /// old value back.
    Overwritten(Location, Value),
    /// A member was removed from `index` among its parent's members: insert it back there.
    /// `None`: the value went on to the write recorded right after this one (a `move`), and
    /// taking that write back hands it over.
    Removed(Location, usize, Option<Value>),
    /// The whole document was replaced (an operation at the root).
    Document(Value),
}

/// A member removed by [`Journal::take`], not yet recorded: the `move` it belongs to either
/// completes ([`Journal::moved`]) or puts it back ([`Removal::put_back`]).
pub(super) struct Removal {
    at: Location,
    index: usize,
}

/// The writes of one patch so far, newest last; recording is off where the caller throws the
/// document away on failure.
#[derive(Debug)]
pub(super) struct Journal {
    undo: Vec<Undo>,
    recording: bool,
}

fn broken<T>(pointer: &str) -> Result<T, Fail> {
    // Not expected: the walk only lets through writes that land.
    Err(Fail {
        code: "OPERATION_PATH_UNRESOLVABLE",
        message: format!("cannot write at {pointer:?}"),
    })
}

impl Location {
    /// The parent and member of a non-root pointer (`None` for the root).
    fn of(pointer: &PointerBuf) -> Option<Location> {
        let (parent, last) = pointer.split_back()?;
        Some(Location {
            parent: parent.to_buf(),
            member: last.decoded().into_owned(),
        })
    }

    fn container<'d>(&self, doc: &'d mut Value) -> Option<&'d mut Value> {
        doc.pointer_mut(self.parent.as_str())
    }

    fn index(&self) -> Option<usize> {
        self.member.parse().ok()
    }

    /// Removes the member; returns it.
    fn remove(&self, doc: &mut Value) -> Option<Value> {
        match self.container(doc)? {
            Value::Object(map) => map.shift_remove(self.member.as_str()),
            Value::Array(arr) => {
                let k = self.index()?;
                (k < arr.len()).then(|| arr.remove(k))
            }
            _ => None,
        }
    }

    /// Overwrites the member's value in place; returns the value it had.
    fn overwrite(&self, doc: &mut Value, value: Value) -> Option<Value> {
        let slot = match self.container(doc)? {
            Value::Object(map) => map.get_mut(self.member.as_str())?,
            Value::Array(arr) => arr.get_mut(self.index()?)?,
            _ => return None,
        };
        Some(std::mem::replace(slot, value))
    }

    /// Inserts the member at `index` among its parent's members.
    fn insert_at(&self, doc: &mut Value, index: usize, value: Value) {
        match self.container(doc) {
            Some(Value::Object(map)) => {
                let index = index.min(map.len());
                map.shift_insert(index, self.member.clone(), value);
            }
            Some(Value::Array(arr)) if index <= arr.len() => arr.insert(index, value),
            _ => debug_assert!(false, "undo: {self:?} no longer resolves"),
        }
    }
}

impl Removal {
    /// Puts the removed member back where it was (a `move` whose destination failed).
    pub(super) fn put_back(self, doc: &mut Value, value: Value) {
        self.at.insert_at(doc, self.index, value);
    }
}

impl Journal {
    /// A journal that records every write, for [`Journal::undo`].
    pub(super) fn recording() -> Self {
        Journal {
            undo: Vec::new(),
            recording: true,
        }
    }

    /// A journal that records nothing: the caller discards the document on failure.
    pub(super) fn off() -> Self {
        Journal {
            undo: Vec::new(),
            recording: false,
        }
    }

    /// Turns recording on or off for the writes that follow (off for a patch's last
    /// operation: an operation that fails writes nothing, so the last one is never taken
    /// back).
    pub(super) fn set_recording(&mut self, on: bool) {
        self.recording = on;
    }

    fn record(&mut self, undo: impl FnOnce() -> Option<Undo>) {
        if self.recording
            && let Some(undo) = undo()
        {
            self.undo.push(undo);
        }
    }

    /// `add` at a canonical pointer: an object member is set (an existing one keeps its
    /// position), an array element inserted at its index (≤ the length).
    pub(super) fn add(
        &mut self,
        doc: &mut Value,
        pointer: &PointerBuf,
        value: Value,
    ) -> Result<(), Fail> {
        let Some((parent, last)) = pointer.split_back() else {
            let old = std::mem::replace(doc, value);
            self.record(|| Some(Undo::Document(old)));
            return Ok(());
        };
        let old = match doc.pointer_mut(parent.as_str()) {
            Some(Value::Object(map)) => map.insert(last.decoded().into_owned(), value),
            Some(Value::Array(arr)) => match last.decoded().parse::<usize>() {
                Ok(k) if k <= arr.len() => {
                    arr.insert(k, value);
                    None
                }
                _ => return broken(pointer.as_str()),
            },
            _ => return broken(pointer.as_str()),
        };
        self.record(|| {
            let at = Location::of(pointer)?;
            Some(match old {
                Some(old) => Undo::Overwritten(at, old),
                None => Undo::Inserted(at),
            })
        });
        Ok(())
    }

    /// `replace` of an existing member (or of the whole document).
    pub(super) fn replace(
        &mut self,
        doc: &mut Value,
        pointer: &PointerBuf,
        value: Value,
    ) -> Result<(), Fail> {
        let Some(at) = Location::of(pointer) else {
            let old = std::mem::replace(doc, value);
            self.record(|| Some(Undo::Document(old)));
            return Ok(());
        };
        let Some(old) = at.overwrite(doc, value) else {
            return broken(pointer.as_str());
        };
        self.record(|| Some(Undo::Overwritten(at, old)));
        Ok(())
    }

    /// Replaces the whole document (an operation at the root).
    pub(super) fn set_document(&mut self, doc: &mut Value, value: Value) {
        let old = std::mem::replace(doc, value);
        self.record(|| Some(Undo::Document(old)));
    }

    /// `remove` of an existing member, keeping the order of the others (JavaScript `delete`
    /// and `splice`). An object key that is not there is a no-op (an inherited name).
    pub(super) fn remove(&mut self, doc: &mut Value, pointer: &PointerBuf) -> Result<(), Fail> {
        if let Some((value, removal)) = detach(doc, pointer)? {
            self.record(|| Some(Undo::Removed(removal.at, removal.index, Some(value))));
        }
        Ok(())
    }

    /// Removes the member at a canonical pointer (a `move`'s resolved `from`) and returns it,
    /// unrecorded: the `move` then records it with [`Journal::moved`] or puts it back.
    pub(super) fn take(
        &mut self,
        doc: &mut Value,
        from: &PointerBuf,
    ) -> Result<(Value, Removal), Fail> {
        detach(doc, from)?.ok_or_else(|| Fail {
            code: "OPERATION_FROM_UNRESOLVABLE",
            message: format!("cannot remove {:?}", from.as_str()),
        })
    }

    /// Records a `move`'s removal; the value goes on to the [`Journal::add`] that follows.
    pub(super) fn moved(&mut self, removal: Removal) {
        self.record(|| Some(Undo::Removed(removal.at, removal.index, None)));
    }

    /// Takes back every recorded write, newest first: `doc` is again what it was before the
    /// first one.
    pub(super) fn undo(self, doc: &mut Value) {
        // The value the write just taken back held, for a `move`'s removal before it.
        let mut carried: Option<Value> = None;
        for undo in self.undo.into_iter().rev() {
            match undo {
                Undo::Document(old) => carried = Some(std::mem::replace(doc, old)),
                Undo::Inserted(at) => carried = at.remove(doc),
                Undo::Overwritten(at, old) => carried = at.overwrite(doc, old),
                Undo::Removed(at, index, value) => match value.or_else(|| carried.take()) {
                    Some(value) => at.insert_at(doc, index, value),
                    None => debug_assert!(false, "undo: a move's value was not handed back"),
                },
            }
        }
    }
}

/// Removes the member at a non-root pointer and returns it with where it was; `Ok(None)` for an
/// object key that is not there.
fn detach(doc: &mut Value, pointer: &PointerBuf) -> Result<Option<(Value, Removal)>, Fail> {
    let Some(at) = Location::of(pointer) else {
        return broken(pointer.as_str());
    };
    let removed = match at.container(doc) {
        Some(Value::Object(map)) => map
            .keys()
            .position(|k| *k == at.member)
            .and_then(|index| Some((index, map.shift_remove(at.member.as_str())?))),
        Some(Value::Array(arr)) => match at.index() {
            Some(k) if k < arr.len() => Some((k, arr.remove(k))),
            _ => return broken(pointer.as_str()),
        },
        _ => return broken(pointer.as_str()),
    };
    Ok(removed.map(|(index, value)| (value, Removal { at, index })))
}

#[cfg(test)]
mod tests;
