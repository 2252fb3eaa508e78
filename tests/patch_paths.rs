//! `STATE_DELTA` pointers that JSON Patch clients disagree on are refused at publish (PROTOCOL
//! §2 "Portable patch paths"): 422 `state_delta_ambiguous_path` naming the event (`index`), the
//! operation (`operation`, `field: delta[<i>].path` or `.from`) and the pointer (`pointer`),
//! nothing of the batch appended; the same names and tokens where every client agrees pass.
//! Checked against the state each operation applies to (the operations before it in the patch
//! included), on the memory backend.

mod common;

use common::{broker, sse_client};
use serde_json::{Value, json};

/// The state every case starts from.
fn start_state() -> Value {
    json!({"arr": [10, 11, 12], "obj": {"01": "a", "x": 1}, "n": 5})
}

async fn publish(base: &str, thread: &str, events: &[Value]) -> (u16, Value) {
    let resp = sse_client::publish(base, thread, events).await;
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("a JSON answer"))
}

async fn state(base: &str, thread: &str) -> Value {
    reqwest::get(format!("{base}/v1/threads/{thread}/snapshot"))
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()["state"]
        .clone()
}

fn delta(ops: Value) -> Value {
    json!({"type": "STATE_DELTA", "delta": ops})
}

/// A thread with a run and [`start_state`].
async fn thread_with_state(base: &str, tag: &str) -> String {
    let thread = broker::thread_id(tag);
    sse_client::publish_ok(
        base,
        &thread,
        &[
            json!({"type": "RUN_STARTED", "threadId": thread, "runId": "r1"}),
            json!({"type": "STATE_SNAPSHOT", "snapshot": start_state()}),
        ],
    )
    .await;
    thread
}

#[tokio::test]
async fn ambiguous_pointers_are_refused_naming_the_operation() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let thread = thread_with_state(&base, "patch-ambiguous").await;
    // (operations, the refused operation, its member, the pointer).
    let cases: Vec<(Value, usize, &str, &str)> = vec![
        // Array index tokens other clients refuse and `fast-json-patch` reads with `~~key`
        // (here: element 0, and an insertion at 0), or refuses too (`replace`).
        (
            json!([{"op": "test", "path": "/arr/00", "value": 10}]),
            0,
            "path",
            "/arr/00",
        ),
        (
            json!([{"op": "replace", "path": "/arr/01", "value": 0}]),
            0,
            "path",
            "/arr/01",
        ),
        (
            json!([{"op": "add", "path": "/arr/", "value": 0}]),
            0,
            "path",
            "/arr/",
        ),
        (
            json!([{"op": "remove", "path": "/arr/4294967296"}]),
            0,
            "path",
            "/arr/4294967296",
        ),
        (
            json!([{"op": "copy", "from": "/arr/02", "path": "/y"}]),
            0,
            "from",
            "/arr/02",
        ),
        // Names JavaScript treats specially, anywhere in the path or `from`.
        (
            json!([{"op": "add", "path": "/__proto__/polluted", "value": 1}]),
            0,
            "path",
            "/__proto__/polluted",
        ),
        (
            json!([{"op": "add", "path": "/obj/__proto__", "value": {}}]),
            0,
            "path",
            "/obj/__proto__",
        ),
        (
            json!([{"op": "add", "path": "/obj/constructor/prototype", "value": 1}]),
            0,
            "path",
            "/obj/constructor/prototype",
        ),
        (
            json!([{"op": "move", "from": "/__proto__", "path": "/y"}]),
            0,
            "from",
            "/__proto__",
        ),
        // Object.prototype names the object does not hold: found only by JavaScript.
        (
            json!([{"op": "remove", "path": "/toString"}]),
            0,
            "path",
            "/toString",
        ),
        (
            json!([{"op": "replace", "path": "/obj/constructor", "value": 1}]),
            0,
            "path",
            "/obj/constructor",
        ),
        (
            json!([{"op": "copy", "from": "/valueOf", "path": "/y"}]),
            0,
            "from",
            "/valueOf",
        ),
        // Later operations are checked against what the earlier ones made.
        (
            json!([{"op": "add", "path": "/arr/-", "value": 13}, {"op": "replace", "path": "/arr/03", "value": 0}]),
            1,
            "path",
            "/arr/03",
        ),
        (
            json!([{"op": "add", "path": "/list", "value": []}, {"op": "add", "path": "/list/00", "value": 1}]),
            1,
            "path",
            "/list/00",
        ),
    ];
    for (ops, op_index, member, pointer) in cases {
        // Second in a batch after a valid event: the whole batch is refused.
        let ok = delta(json!([{"op": "replace", "path": "/n", "value": 6}]));
        let (status, body) = publish(&base, &thread, &[ok, delta(ops.clone())]).await;
        let err = &body["error"];
        assert_eq!(status, 422, "{ops}: {body}");
        assert_eq!(err["code"], "state_delta_ambiguous_path", "{ops}: {body}");
        assert_eq!(err["index"], 1, "{ops}: {body}");
        assert_eq!(err["operation"], op_index, "{ops}: {body}");
        assert_eq!(
            err["field"],
            format!("delta[{op_index}].{member}"),
            "{ops}: {body}"
        );
        assert_eq!(err["pointer"], pointer, "{ops}: {body}");
        assert_eq!(
            state(&base, &thread).await,
            start_state(),
            "{ops}: nothing of the batch appended"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn the_same_names_where_clients_agree_pass() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let thread = thread_with_state(&base, "patch-portable").await;
    let ops = json!([
        // "01" is a member name of an object, not an array index.
        {"op": "replace", "path": "/obj/01", "value": "b"},
        {"op": "replace", "path": "/arr/0", "value": 0},
        {"op": "add", "path": "/arr/-", "value": 13},
        {"op": "test", "path": "/arr/3", "value": 13},
        // Own members named like Object.prototype ones, and `prototype` not after
        // `constructor`.
        {"op": "add", "path": "/obj/constructor", "value": {"prototype": 1}},
        {"op": "add", "path": "/prototype", "value": true},
        {"op": "copy", "from": "/obj/constructor", "path": "/toString"},
        {"op": "remove", "path": "/toString"}
    ]);
    let (status, body) = publish(&base, &thread, &[delta(ops)]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        state(&base, &thread).await,
        json!({
            "arr": [0, 11, 12, 13],
            "obj": {"01": "b", "x": 1, "constructor": {"prototype": 1}},
            "n": 5,
            "prototype": true
        })
    );
    server.stop().await;
}

/// An `ACTIVITY_DELTA`'s `patch` is checked as a `STATE_DELTA`'s `delta`, against its
/// activity's content as the batch leaves it (an `ACTIVITY_SNAPSHOT` earlier in the batch
/// included): 422 `state_delta_ambiguous_path` naming `patch[<i>].path` or `.from`, nothing of
/// the batch appended; the same tokens where clients agree pass.
#[tokio::test]
async fn activity_delta_pointers_are_checked_too() {
    let server = broker::start_memory().await;
    let base = broker::base(server.addr);
    let thread = thread_with_state(&base, "patch-activity").await;
    let activity = |content: Value| json!({"type": "ACTIVITY_SNAPSHOT", "messageId": "act", "activityType": "search", "content": content});
    let activity_delta = |ops: Value| json!({"type": "ACTIVITY_DELTA", "messageId": "act", "activityType": "search", "patch": ops});
    sse_client::publish_ok(&base, &thread, &[activity(json!({"hits": [1, 2]}))]).await;
    let messages = || async {
        reqwest::get(format!("{base}/v1/threads/{thread}/snapshot"))
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()["messages"]
            .clone()
    };
    let before = messages().await;
    // (the batch, the refused event, the operation, its member, the pointer).
    let cases: Vec<(Vec<Value>, usize, usize, &str, &str)> = vec![
        (
            vec![activity_delta(
                json!([{"op": "replace", "path": "/hits/01", "value": 0}]),
            )],
            0,
            0,
            "path",
            "/hits/01",
        ),
        (
            vec![activity_delta(json!([
                {"op": "add", "path": "/ok", "value": 1},
                {"op": "add", "path": "/__proto__/x", "value": 1}
            ]))],
            0,
            1,
            "path",
            "/__proto__/x",
        ),
        (
            vec![activity_delta(
                json!([{"op": "copy", "from": "/toString", "path": "/y"}]),
            )],
            0,
            0,
            "from",
            "/toString",
        ),
        // Against the content an earlier event of the batch set: `/list` is an array there.
        (
            vec![
                activity(json!({"list": [1]})),
                activity_delta(json!([{"op": "add", "path": "/list/00", "value": 0}])),
            ],
            1,
            0,
            "path",
            "/list/00",
        ),
    ];
    for (batch, index, op_index, member, pointer) in cases {
        let (status, body) = publish(&base, &thread, &batch).await;
        let err = &body["error"];
        assert_eq!(status, 422, "{batch:?}: {body}");
        assert_eq!(err["code"], "state_delta_ambiguous_path", "{body}");
        assert_eq!(err["index"], index, "{body}");
        assert_eq!(err["operation"], op_index, "{body}");
        assert_eq!(
            err["field"],
            format!("patch[{op_index}].{member}"),
            "{body}"
        );
        assert_eq!(err["pointer"], pointer, "{body}");
        assert_eq!(messages().await, before, "{batch:?}: nothing appended");
    }
    // Where every client agrees: a member named "01" of an object, a canonical index.
    let ok = activity_delta(json!([
        {"op": "add", "path": "/obj", "value": {"01": "a"}},
        {"op": "replace", "path": "/obj/01", "value": "b"},
        {"op": "replace", "path": "/hits/1", "value": 3}
    ]));
    let (status, body) = publish(&base, &thread, &[ok]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        messages().await[0]["content"],
        json!({"hits": [1, 3], "obj": {"01": "b"}})
    );
    server.stop().await;
}
