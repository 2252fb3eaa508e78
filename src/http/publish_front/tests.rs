//! Unit tests of what the publish front counts as a plain publish head and what it leaves in the buffer after serving one.
use super::*;

const RULES: PlainRules = PlainRules {
    max_body: 1000,
    cors: true,
};

fn check(head: &str, rules: PlainRules) -> Option<Plain> {
    let mut headers = [httparse::EMPTY_HEADER; head::MAX_HEADERS];
    match head::parse(head.as_bytes(), &mut headers) {
        Ok(Parsed::Complete { req, len }) => plain(&req, head.as_bytes(), len, rules),
        _ => None,
    }
}

const JSON: &str = "Content-Type: application/json\r\n";

#[test]
fn a_plain_publish_is_taken_with_its_parts() {
    let head = format!(
        "POST /v1/threads/t%2D1/events?access_token=abc HTTP/1.1\r\nHost: x\r\n{JSON}Authorization: Bearer k\r\nCookie: a=1\r\nCookie: b=2\r\nX-Producer-Id: w\r\nX-Producer-Seq: 3\r\nConnection: keep-alive, close\r\nContent-Length: 12\r\n\r\n"
    );
    let p = check(&head, RULES).expect("taken");
    let part = |r: &Range<usize>| &head[r.clone()];
    assert_eq!(p.head_len, head.len());
    assert_eq!(p.body_len, 12);
    assert_eq!(part(&p.segment), "t%2D1");
    assert_eq!(p.query.as_ref().map(part), Some("access_token=abc"));
    assert_eq!(p.authorization.as_ref().map(part), Some("Bearer k"));
    let cookies: Vec<&str> = p.cookies.iter().map(part).collect();
    assert_eq!(cookies, ["a=1", "b=2"]);
    assert_eq!(part(&p.content_type), "application/json");
    assert_eq!(p.producer_id.as_ref().map(part), Some("w"));
    assert_eq!(p.producer_seq.as_ref().map(part), Some("3"));
    assert!(p.close);
    // NDJSON too; an `Origin` is ignored when CORS is off.
    let ndjson = "POST /v1/threads/t/events HTTP/1.1\r\nContent-Type: application/x-ndjson\r\nOrigin: https://a\r\nContent-Length: 0\r\n\r\n";
    let p = check(
        ndjson,
        PlainRules {
            cors: false,
            ..RULES
        },
    )
    .expect("taken");
    assert!(!p.close);
    assert_eq!(p.body_len, 0);
}

#[test]
fn anything_unusual_goes_to_hyper() {
    let publish = |extra: &str| {
        format!("POST /v1/threads/t/events HTTP/1.1\r\n{JSON}{extra}Content-Length: 2\r\n\r\n")
    };
    for head in [
        // other methods, versions and paths
        format!("PUT /v1/threads/t/events HTTP/1.1\r\n{JSON}Content-Length: 2\r\n\r\n"),
        format!("POST /v1/threads/t/events HTTP/1.0\r\n{JSON}Content-Length: 2\r\n\r\n"),
        format!("POST /v1/threads/t/snapshot HTTP/1.1\r\n{JSON}Content-Length: 2\r\n\r\n"),
        format!("POST /v1/threads//events HTTP/1.1\r\n{JSON}Content-Length: 2\r\n\r\n"),
        format!("POST /v1/threads/a/b/events HTTP/1.1\r\n{JSON}Content-Length: 2\r\n\r\n"),
        format!("POST /v1/threads/%FF/events HTTP/1.1\r\n{JSON}Content-Length: 2\r\n\r\n"),
        format!("POST /v1/agents/x HTTP/1.1\r\n{JSON}Content-Length: 2\r\n\r\n"),
        // a fragment (`http::Uri` strips it)
        format!("POST /v1/threads/t/events?a=1#x HTTP/1.1\r\n{JSON}Content-Length: 2\r\n\r\n"),
        // no length, a body too large, framing and upgrades
        format!("POST /v1/threads/t/events HTTP/1.1\r\n{JSON}\r\n"),
        format!("POST /v1/threads/t/events HTTP/1.1\r\n{JSON}Content-Length: 1001\r\n\r\n"),
        publish("Content-Length: 2\r\n"),
        publish("Transfer-Encoding: chunked\r\n"),
        publish("Expect: 100-continue\r\n"),
        publish("Upgrade: h2c\r\n"),
        publish("Connection: upgrade\r\n"),
        // a browser's request while CORS is on
        publish("Origin: https://a\r\n"),
        // a repeated header a publish reads, an SSE or unknown body
        publish("Authorization: Bearer a\r\nAuthorization: Bearer b\r\n"),
        publish("X-Producer-Id: a\r\nX-Producer-Id: b\r\n"),
        publish(JSON),
        "POST /v1/threads/t/events HTTP/1.1\r\nContent-Type: text/event-stream\r\nContent-Length: 2\r\n\r\n".into(),
        "POST /v1/threads/t/events HTTP/1.1\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\n".into(),
        "POST /v1/threads/t/events HTTP/1.1\r\nContent-Length: 2\r\n\r\n".into(),
    ] {
        assert_eq!(check(&head, RULES), None, "{head:?}");
    }
}

#[test]
fn served_requests_leave_what_follows() {
    let mut buf = b"headbodyNEXT".to_vec();
    consume(&mut buf, 8);
    assert_eq!(buf, b"NEXT");
    consume(&mut buf, 4);
    assert!(buf.is_empty());
    // A buffer a large head grew is given back once it holds little.
    let mut buf = vec![b'x'; 64 << 10];
    consume(&mut buf, (64 << 10) - 10);
    assert_eq!(buf.len(), 10);
    assert!(buf.capacity() <= SHRINK_ABOVE, "{}", buf.capacity());
}
