//! A run request's body: the `RunAgentInput` (AGUI.md §2) checked field by field, and the
//! `input` echo the broker adds to a `RUN_STARTED` that has none (PROTOCOL §11 "The run's
//! input in the thread").

use crate::event::validate::{ParseError, parse_received};
use crate::event::{ThreadId, validate_run_input};
use serde_json::{Map, Value};
use std::collections::HashSet;

/// Why a request body is not a run request; `field` names the member at fault relative to the
/// body (`messages[0].role`), when there is one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InputError {
    /// `invalid_json`, `invalid_run_input` or `invalid_thread_id`.
    pub code: &'static str,
    /// For people.
    pub message: String,
    /// The member at fault.
    pub field: Option<String>,
}

/// A checked `RunAgentInput`.
#[derive(Clone, Debug)]
pub struct RunInput {
    /// The body as sent (members the broker does not know included), forwarded upstream.
    pub value: Value,
    /// `threadId`: the thread the run's events are appended to.
    pub thread: ThreadId,
    /// `runId`, also the producer id of the run's appends (PROTOCOL §2 idempotent retries).
    pub run_id: String,
}

impl RunInput {
    /// Parses and checks a run request's body: JSON, the `RunAgentInput` schema, `threadId` a
    /// valid thread id and `runId` a valid producer id (both 1–128 characters of
    /// `[A-Za-z0-9._:-]`, PROTOCOL §1). `state: null` is taken as absent, as the AG-UI client
    /// does (AGUI.md §2).
    ///
    /// # Errors
    /// [`InputError`] naming the member at fault.
    pub fn parse(body: &[u8]) -> Result<RunInput, InputError> {
        let mut value = parse_received(body).map_err(|e| InputError {
            code: match e {
                ParseError::Malformed(_) => "invalid_json",
                ParseError::Reserved(_) => "invalid_run_input",
            },
            message: e.to_string(),
            field: None,
        })?;
        if let Some(obj) = value.as_object_mut()
            && obj.get("state").is_some_and(Value::is_null)
        {
            obj.remove("state");
        }
        validate_run_input(&value).map_err(|e| InputError {
            code: "invalid_run_input",
            message: e.message,
            field: e.field,
        })?;
        // Both are strings: the schema requires them.
        let thread =
            ThreadId::parse(value["threadId"].as_str().unwrap_or_default()).map_err(|e| {
                InputError {
                    code: "invalid_thread_id",
                    message: e.to_string(),
                    field: Some("threadId".into()),
                }
            })?;
        let run_id = value["runId"].as_str().unwrap_or_default().to_string();
        ThreadId::parse(&run_id).map_err(|e| InputError {
            code: "invalid_run_input",
            message: e.to_string().replace("threadId", "runId"),
            field: Some("runId".into()),
        })?;
        Ok(RunInput {
            value,
            thread,
            run_id,
        })
    }

    /// The input's messages (the schema made it an array).
    pub fn messages(&self) -> &[Value] {
        self.value["messages"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// The ids of the input's messages that `held` (the ids of the messages the thread holds)
    /// lacks, in input order.
    pub fn missing_ids(&self, held: &HashSet<&str>) -> Vec<String> {
        self.messages()
            .iter()
            .filter_map(|m| m["id"].as_str())
            .filter(|id| !held.contains(id))
            .map(str::to_string)
            .collect()
    }

    /// The `input` echo the broker puts on a `RUN_STARTED` that has none: `threadId`, `runId`,
    /// the messages named in `missing` (those the thread does not hold yet: typically the
    /// user's new message), and `resume` and `parentRunId` when the input has them. The rest
    /// (`state`, `tools`, `context`, `forwardedProps`) is left out: the client's reducer takes
    /// only the messages from an echo (AGUI.md §6), and repeating the whole history in every
    /// run would grow the log with the square of its length.
    pub fn echo(&self, missing: &[String]) -> Value {
        let wanted: HashSet<&str> = missing.iter().map(String::as_str).collect();
        let messages: Vec<Value> = self
            .messages()
            .iter()
            .filter(|m| m["id"].as_str().is_some_and(|id| wanted.contains(id)))
            .cloned()
            .collect();
        let mut echo = Map::new();
        echo.insert("threadId".into(), self.thread.as_str().into());
        echo.insert("runId".into(), self.run_id.clone().into());
        if let Some(parent) = self.value.get("parentRunId") {
            echo.insert("parentRunId".into(), parent.clone());
        }
        echo.insert("messages".into(), Value::Array(messages));
        if let Some(resume) = self.value.get("resume") {
            echo.insert("resume".into(), resume.clone());
        }
        Value::Object(echo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> Vec<u8> {
        serde_json::to_vec(&v).unwrap()
    }

    #[test]
    fn errors_name_the_member() {
        let cases = [
            (json!([]), "invalid_run_input", None),
            (
                json!({"runId":"r","messages":[]}),
                "invalid_run_input",
                Some("threadId"),
            ),
            (
                json!({"threadId":"t","runId":"r"}),
                "invalid_run_input",
                Some("messages"),
            ),
            (
                json!({"threadId":"t","runId":"r","messages":[{"id":"m","role":"robot","content":"x"}]}),
                "invalid_run_input",
                Some("messages[0].role"),
            ),
            (
                json!({"threadId":"t","runId":"r","messages":[],"tools":[{"name":"x"}]}),
                "invalid_run_input",
                Some("tools[0].description"),
            ),
            (
                json!({"threadId":"t","runId":"r","messages":[],"resume":[{"interruptId":"i","status":"maybe"}]}),
                "invalid_run_input",
                Some("resume[0].status"),
            ),
            (
                json!({"threadId":"a b","runId":"r","messages":[]}),
                "invalid_thread_id",
                Some("threadId"),
            ),
            (
                json!({"threadId":"t","runId":"","messages":[]}),
                "invalid_run_input",
                Some("runId"),
            ),
        ];
        for (v, code, field) in cases {
            let e = RunInput::parse(&body(v.clone())).unwrap_err();
            assert_eq!((e.code, e.field.as_deref()), (code, field), "{v}: {e}");
        }
        assert_eq!(RunInput::parse(b"{").unwrap_err().code, "invalid_json");
    }

    #[test]
    fn echo_holds_only_what_the_thread_lacks() {
        let input = RunInput::parse(&body(json!({
            "threadId":"t","runId":"r2","state":null,"tools":[],"context":[],"forwardedProps":{},
            "messages":[
                {"id":"u1","role":"user","content":"hi"},
                {"id":"a1","role":"assistant","content":"hello"},
                {"id":"u2","role":"user","content":"and?"}],
            "resume":[{"interruptId":"i1","status":"resolved","payload":{"ok":true}}]
        })))
        .unwrap();
        assert!(input.value.get("state").is_none(), "state: null is absent");
        let held: HashSet<&str> = ["u1", "a1"].into_iter().collect();
        let missing = input.missing_ids(&held);
        assert_eq!(missing, ["u2"]);
        assert_eq!(
            input.echo(&missing),
            json!({"threadId":"t","runId":"r2",
                   "messages":[{"id":"u2","role":"user","content":"and?"}],
                   "resume":[{"interruptId":"i1","status":"resolved","payload":{"ok":true}}]})
        );
    }
}
