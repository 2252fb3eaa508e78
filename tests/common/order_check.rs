//! The order checker's two entry points, checked against each other on every event the order
//! tests feed it: `check_unchanged` (the publish path's check without a copy) must answer as
//! `check` does, and only for events `check` records nothing for.

use agui_fanout::event::order::{OrderChecker, OrderViolation};
use serde_json::Value;

/// `checker.check(event)`, after asserting that `check_unchanged`, where it answers, gives the
/// same rule and that `check` then left the checker as it was.
pub(crate) fn check_both_ways(
    checker: &mut OrderChecker,
    event: &Value,
) -> Result<(), OrderViolation> {
    let before = checker.clone();
    let shared = checker.check_unchanged(event);
    let checked = checker.check(event);
    if let Some(shared) = shared {
        assert_eq!(
            shared.map_err(|v| v.rule),
            checked.as_ref().map(|_| ()).map_err(|v| v.rule)
        );
        assert_eq!(
            *checker, before,
            "check_unchanged answered for an event that records"
        );
    }
    checked
}
