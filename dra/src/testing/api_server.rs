//! A mocked API server for the tests of kube-client adapters (this crate's
//! `resourceslice::publisher::api_tests`, a driver's own), as kube-rs's controller-rs example
//! does: `tower_test::mock::pair` behind `kube::Client::new`. A
//! test lists the exact requests the adapter must make, in order, and the answer to each; a
//! request that is not the next one expected, or one more than expected, fails the test.
//!
//! `ApiServer::new()` gives the client and the server's side; `server.run(scenario)` serves the
//! exchanges on a task; `finished(server).await`, once every client is dropped, returns the
//! requests as they came.

use std::time::Duration;

use http::header::CONTENT_TYPE;
use http::{Method, Request, Response, StatusCode};
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// In an expected body, any value; in an expected URI, any non-empty run of characters up to
/// the next `/`, `?`, `&` or `=` (a generated name).
pub const ANY: &str = "<any>";

/// One request the adapter must make next, and the answer it gets.
pub struct Exchange {
    method: Method,
    /// Path and query, exactly (but for [`ANY`]).
    uri: String,
    /// The request's `Content-Type`, checked when set (it says which kind of patch a PATCH is).
    content_type: Option<&'static str>,
    /// The JSON body, exactly (but for [`ANY`]); `None`: no body.
    body: Option<Value>,
    /// HTTP status and JSON body of the answer; `None`: never answered (the request hangs until
    /// the client gives up).
    answer: Option<(StatusCode, Value)>,
}

impl Exchange {
    /// A `method` request of `uri` without a body, answered `200 {}`.
    pub fn new(method: Method, uri: impl Into<String>) -> Self {
        Self {
            method,
            uri: uri.into(),
            content_type: None,
            body: None,
            answer: Some((StatusCode::OK, json!({}))),
        }
    }

    /// The request has this JSON body.
    pub fn body(mut self, body: Value) -> Self {
        self.body = Some(body);
        self
    }

    /// The request has this `Content-Type`.
    pub fn content_type(mut self, content_type: &'static str) -> Self {
        self.content_type = Some(content_type);
        self
    }

    /// Answered `code` with the JSON `body`.
    pub fn answer(mut self, code: u16, body: Value) -> Self {
        self.answer = Some((StatusCode::from_u16(code).unwrap(), body));
        self
    }

    /// Answered with the API server's `Status` of a failure (`code`, `reason`).
    pub fn fail(self, code: u16, reason: &str) -> Self {
        let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": format!("{reason} (test)"), "reason": reason,
            "code": code});
        self.answer(code, status)
    }

    /// Never answered.
    pub fn unanswered(mut self) -> Self {
        self.answer = None;
        self
    }
}

/// A request as it came, for checks beyond the scenario's (a generated name, a time's format).
#[derive(Debug)]
pub struct Received {
    /// Path and query.
    pub uri: String,
    /// The JSON body, if any.
    pub body: Option<Value>,
}

/// The API server's side of the mock: answers a scenario's exchanges in order.
pub struct ApiServer(tower_test::mock::Handle<Request<Body>, Response<Body>>);

impl ApiServer {
    /// A client whose every request comes to the returned [`ApiServer`].
    pub fn new() -> (Client, Self) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        (Client::new(service, "default"), Self(handle))
    }

    /// Serves `scenario` on a task of its own; the task ends once every exchange was made and
    /// every client is gone, returns the requests as they came, and fails on any request the
    /// scenario does not expect next.
    pub fn run(mut self, scenario: Vec<Exchange>) -> JoinHandle<Vec<Received>> {
        tokio::spawn(async move {
            let mut received = Vec::new();
            // Replies of unanswered requests, held so that those requests hang.
            let mut held = Vec::new();
            for (n, want) in scenario.into_iter().enumerate() {
                let (request, reply) = self.0.next_request().await.unwrap_or_else(|| {
                    panic!("request {n} ({} {}) never came", want.method, want.uri)
                });
                let uri = request.uri().to_string();
                assert!(
                    request.method() == want.method && uri_matches(&want.uri, &uri),
                    "request {n}: {} {uri}, expected {} {}",
                    request.method(),
                    want.method,
                    want.uri
                );
                if let Some(ct) = want.content_type {
                    let got = request.headers().get(CONTENT_TYPE);
                    assert_eq!(
                        got.and_then(|v| v.to_str().ok()),
                        Some(ct),
                        "content type of request {n} ({uri})"
                    );
                }
                let bytes = request.into_body().collect_bytes().await.unwrap();
                let body = (!bytes.is_empty())
                    .then(|| serde_json::from_slice::<Value>(&bytes).expect("a JSON body"));
                let same = match (&want.body, &body) {
                    (Some(w), Some(b)) => body_matches(w, b),
                    (w, b) => w == b,
                };
                assert!(
                    same,
                    "body of request {n} ({uri}):\n{:#}\nexpected\n{:#}",
                    json!(body),
                    json!(want.body)
                );
                received.push(Received { uri, body });
                match want.answer {
                    Some((status, answer)) => reply.send_response(
                        Response::builder()
                            .status(status)
                            .header("content-type", "application/json")
                            .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                            .unwrap(),
                    ),
                    None => held.push(reply),
                }
            }
            if let Some((request, _)) = self.0.next_request().await {
                panic!("unexpected request {} {}", request.method(), request.uri());
            }
            received
        })
    }
}

/// Waits for the API server's side of a scenario (every client must be dropped by then) and
/// returns the requests as they came.
pub async fn finished(server: JoinHandle<Vec<Received>>) -> Vec<Received> {
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("the scenario ended in time (every client dropped?)")
        .expect("the scenario passed")
}

/// Whether `got` is `want`, but for an [`ANY`] value anywhere in `want`.
fn body_matches(want: &Value, got: &Value) -> bool {
    match (want, got) {
        (Value::String(w), _) if w == ANY => true,
        (Value::Object(w), Value::Object(g)) => {
            w.len() == g.len()
                && w.iter()
                    .all(|(k, w)| g.get(k).is_some_and(|g| body_matches(w, g)))
        }
        (Value::Array(w), Value::Array(g)) => {
            w.len() == g.len() && w.iter().zip(g).all(|(w, g)| body_matches(w, g))
        }
        _ => want == got,
    }
}

/// Whether the URI `got` is `want`, each [`ANY`] in `want` standing for a non-empty run of
/// characters other than `/?&=`.
fn uri_matches(want: &str, got: &str) -> bool {
    let mut parts = want.split(ANY);
    let Some(mut rest) = got.strip_prefix(parts.next().unwrap_or_default()) else {
        return false;
    };
    for part in parts {
        let gap = rest.find(['/', '?', '&', '=']).unwrap_or(rest.len());
        match rest[gap..].strip_prefix(part) {
            Some(after) if gap > 0 => rest = after,
            _ => return false,
        }
    }
    rest.is_empty()
}

#[test]
fn any_stands_for_one_segment_of_a_uri_and_any_value_of_a_body() {
    assert!(uri_matches("/a/<any>?x", "/a/n.1f?x"));
    assert!(!uri_matches("/a/<any>?x", "/a/?x"));
    assert!(!uri_matches("/a/<any>?x", "/a/b/c?x"));
    assert!(!uri_matches("/a/b", "/a/b?"));
    assert!(body_matches(
        &json!({"a": ANY, "b": [1]}),
        &json!({"a": {"c": 2}, "b": [1]})
    ));
    assert!(!body_matches(&json!({"a": ANY}), &json!({"a": 1, "b": 1})));
    assert!(!body_matches(&json!({"b": [1]}), &json!({"b": [2]})));
}
