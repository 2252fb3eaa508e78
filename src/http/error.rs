//! JSON errors with the PROTOCOL §2 status codes.

use crate::fold::Rejection;
use crate::ingest::IngestError;
use crate::log::LogError;
use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

/// An error answer: HTTP status + `{"error":{"code","message","index"?,"field"?,…}}`.
///
/// Boxed so that `Result<_, ApiError>` stays one pointer wide on the happy path.
#[derive(Debug, Clone)]
pub struct ApiError(Box<ErrorBody>);

/// The content of an [`ApiError`].
#[derive(Debug, Clone)]
pub(super) struct ErrorBody {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code, e.g. `invalid_event`, `too_large`, `unsupported_media_type`.
    pub code: &'static str,
    /// Human-readable reason.
    pub message: String,
    /// Index of the offending event in a batch or ingest stream.
    pub index: Option<usize>,
    /// The offending field.
    pub field: Option<String>,
    /// Extra members of the error object (e.g. `appended` for an SSE ingest).
    pub extra: Map<String, Value>,
    /// Seconds for a `Retry-After` header (503).
    pub retry_after: Option<u64>,
    /// A `WWW-Authenticate` challenge (401, RFC 6750 §3).
    pub challenge: Option<&'static str>,
    /// Metric label when finer than `code` (the order rule broken).
    pub reason: Option<&'static str>,
}

/// A path the router matched but whose `{threadId}` segment cannot be read (e.g. `%FF`: not
/// UTF-8 once percent-decoded): 400 `invalid_thread_id` naming `threadId`, in JSON like every
/// other error (axum's own rejection is plain text).
impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_thread_id",
            rejection.body_text(),
        )
        .field(Some("threadId".into()))
    }
}

/// A query string that does not parse (a duplicated key, a malformed escape): 400
/// `invalid_query` naming the duplicated parameter, else `query`, in JSON (axum's own
/// rejection is plain text).
impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        let text = rejection.body_text();
        let field = query_field(&text).to_string();
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", text).field(Some(field))
    }
}

/// The field an `invalid_query` names for a query that does not parse, from the parser's
/// message: a repeated parameter (serde's "duplicate field `from`") by its name, anything else
/// as `query`.
pub(super) fn query_field(message: &str) -> &str {
    message
        .split_once("duplicate field `")
        .and_then(|(_, rest)| rest.split_once('`'))
        .map_or("query", |(name, _)| name)
}

impl ApiError {
    /// An error with no index or field.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError(Box::new(ErrorBody {
            status,
            code,
            message: message.into(),
            index: None,
            field: None,
            extra: Map::new(),
            retry_after: None,
            challenge: None,
            reason: None,
        }))
    }

    /// Names the field at fault.
    pub fn field(mut self, field: Option<String>) -> Self {
        self.0.field = field;
        self
    }

    /// Sets a `Retry-After` header, in seconds.
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.0.retry_after = Some(secs);
        self
    }

    /// Sets a `WWW-Authenticate` header (a 401's challenge).
    pub fn challenge(mut self, challenge: &'static str) -> Self {
        self.0.challenge = Some(challenge);
        self
    }

    /// 400 `invalid_event`.
    pub fn invalid_event(message: impl Into<String>, field: Option<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_event", message).field(field)
    }

    /// Sets the batch index.
    pub fn at(mut self, index: usize) -> Self {
        self.0.index = Some(index);
        self
    }

    /// Sets the metric label (see [`ApiError::reason`]).
    pub fn with_reason(mut self, reason: &'static str) -> Self {
        self.0.reason = Some(reason);
        self
    }

    /// Shifts the batch index by `n` (an SSE ingest's batches are numbered from its start).
    pub fn offset_index(mut self, n: usize) -> Self {
        if let Some(i) = self.0.index.as_mut() {
            *i += n;
        }
        self
    }

    /// Adds a member to the error object.
    pub fn with(mut self, key: &str, value: Value) -> Self {
        self.0.extra.insert(key.to_string(), value);
        self
    }

    /// 503 `backend_unavailable` with `Retry-After: 1`.
    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "backend_unavailable",
            message,
        )
        .retry_after(1)
    }

    /// 503 `append_outcome_unknown` (PROTOCOL §2 "Unknown outcomes"): the append was sent, its
    /// reply lost, and the log backend did not say in time whether it ran. No `Retry-After`:
    /// unlike `backend_unavailable`, this is no invitation to retry; only a retry carrying
    /// `X-Producer-Id`/`X-Producer-Seq` is safe (it is deduplicated).
    pub fn outcome_unknown(detail: impl std::fmt::Display) -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "append_outcome_unknown",
            format!(
                "the log backend did not answer in time and it is unknown whether the events \
                 were appended ({detail}); only a retry with X-Producer-Id and X-Producer-Seq \
                 is safe (it is deduplicated), a retry without them may append the events twice"
            ),
        )
    }

    /// Metric label for `agui_events_rejected_total{reason}`: the error code, or for an
    /// order violation the rule broken (a bounded set).
    pub fn reason(&self) -> &'static str {
        self.0.reason.unwrap_or(self.0.code)
    }

    /// The request field the error names (`field` of the JSON body), if any.
    pub fn field_name(&self) -> Option<&str> {
        self.0.field.as_deref()
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.0.status
    }
}

impl From<LogError> for ApiError {
    fn from(e: LogError) -> Self {
        match e {
            LogError::Unavailable(m) => {
                ApiError::unavailable(format!("log backend unavailable: {m}"))
            }
            LogError::OutcomeUnknown(m) => ApiError::outcome_unknown(m),
            LogError::Gap(g) => ApiError::new(StatusCode::CONFLICT, "gap", g.to_string()),
            LogError::Conflict(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "contended",
                "the thread's log kept moving under concurrent appends; retry",
            )
            .retry_after(1),
        }
    }
}

impl From<IngestError> for ApiError {
    fn from(e: IngestError) -> Self {
        match e {
            IngestError::Log(e) => e.into(),
            e @ (IngestError::BatchTooLarge(_)
            | IngestError::BatchFramesTooLarge(_)
            | IngestError::BatchBytesTooLarge(_)) => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", e.to_string())
            }
            // Only the broker's own guarded appends (a cancel) meet it, and they answer with
            // their own error; a publish never does.
            e @ IngestError::Guarded => {
                ApiError::new(StatusCode::CONFLICT, "state_changed", e.to_string())
            }
            IngestError::Rejected(Rejection::Order { index, violation }) => ApiError::new(
                StatusCode::CONFLICT,
                "order_violation",
                violation.message.clone(),
            )
            .at(index)
            .with("rule", json!(violation.rule))
            .with_reason(violation.rule),
            IngestError::Rejected(Rejection::Patch { index, error }) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "state_delta_not_applicable",
                format!(
                    "operation {} of the patch does not apply to the thread's state: {}",
                    error.op_index, error.message
                ),
            )
            .at(index)
            .field(Some(format!("delta[{}]", error.op_index)))
            .with("operation", json!(error.op_index)),
            IngestError::Rejected(Rejection::Ambiguous {
                index,
                patch,
                error,
            }) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "state_delta_ambiguous_path",
                format!(
                    "operation {} of the patch: `{}` {:?} {}; clients would disagree on it",
                    error.op_index, error.member, error.pointer, error.reason
                ),
            )
            .at(index)
            .field(Some(format!(
                "{patch}[{}].{}",
                error.op_index, error.member
            )))
            .with("operation", json!(error.op_index))
            .with("pointer", json!(error.pointer)),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = *self.0;
        let mut err = Map::new();
        err.insert("code".into(), json!(body.code));
        err.insert("message".into(), json!(body.message));
        if let Some(i) = body.index {
            err.insert("index".into(), json!(i));
        }
        if let Some(f) = body.field {
            err.insert("field".into(), json!(f));
        }
        err.extend(body.extra);
        let mut resp = (body.status, Json(json!({ "error": err }))).into_response();
        if let Some(secs) = body.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if let Some(challenge) = body.challenge {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
        }
        resp
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.0.status.as_u16(),
            self.0.code,
            self.0.message
        )
    }
}

impl std::error::Error for ApiError {}
