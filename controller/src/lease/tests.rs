use std::sync::Arc;

use super::*;

fn spec(holder: &str, renewed_secs_ago: i64) -> LeaseSpec {
    let now = Timestamp::now();
    LeaseSpec {
        holder_identity: Some(holder.into()).filter(|h: &String| !h.is_empty()),
        lease_duration_seconds: Some(15),
        renew_time: Some(MicroTime(now - SignedDuration::from_secs(renewed_secs_ago))),
        ..LeaseSpec::default()
    }
}

/// A leader whose API server stops answering steps down within the renew deadline, well
/// before its lease (as others see it) expires.
#[tokio::test]
async fn a_stalled_leader_steps_down_before_its_lease_expires() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let _silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            held.push(sock);
        }
    });
    let client =
        kube::Client::try_from(kube::Config::new(format!("http://{addr}").parse().unwrap()))
            .unwrap();
    let cfg = LeaseConfig {
        renew_every: Duration::from_millis(100),
        renew_deadline: Duration::from_millis(400),
        ..LeaseConfig::for_duration("l", "me", Duration::from_secs(5))
    };
    let counted = Arc::new(std::sync::Mutex::new(Vec::new()));
    let elector = Elector::new(Api::namespaced(client, "ns"), cfg).counting_errors({
        let counted = counted.clone();
        move |cause| counted.lock().unwrap().push(cause)
    });
    let t0 = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(3), elector.keep())
        .await
        .expect("keep() returned");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    // Every stalled renewal is counted by its cause, as das_controller_errors_total counts it.
    let counted = counted.lock().unwrap();
    assert!(!counted.is_empty());
    assert!(counted.iter().all(|c| *c == "lease_timeout"), "{counted:?}");
}

#[test]
fn client_go_proportions() {
    let c = LeaseConfig::for_duration("l", "me", Duration::from_secs(15));
    assert_eq!(c.renew_every, Duration::from_secs(5));
    assert_eq!(c.renew_deadline, Duration::from_secs(10));
}

#[test]
fn decisions() {
    let now = Timestamp::now();
    assert_eq!(decide(None, "a", now), Decision::TakeOver);
    assert_eq!(decide(Some(&spec("a", 1)), "a", now), Decision::Renew);
    assert_eq!(decide(Some(&spec("a", 100)), "a", now), Decision::Renew);
    assert_eq!(decide(Some(&spec("b", 1)), "a", now), Decision::HeldByOther);
    assert_eq!(decide(Some(&spec("b", 16)), "a", now), Decision::TakeOver);
    assert_eq!(decide(Some(&spec("", 1)), "a", now), Decision::TakeOver);
}

/// The one way to lead: [`Elector::acquire`] creates the missing lease with our identity and
/// returns the [`Leadership`], whose release then clears the holder for a standby.
#[tokio::test]
async fn acquire_gives_the_leadership_that_releases_the_lease() {
    use http::{Method, Request, Response, StatusCode};
    use kube::client::Body;

    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    const URL: &str = "/apis/coordination.k8s.io/v1/namespaces/ns/leases";
    let server = tokio::spawn(async move {
        let mut answer = async |method: Method, uri: String, status: StatusCode, reply_with| {
            let (request, reply) = handle.next_request().await.expect("a request");
            assert_eq!(
                (request.method(), request.uri().path()),
                (&method, uri.as_str())
            );
            let body = request.into_body().collect_bytes().await.unwrap();
            let sent: Option<Lease> = serde_json::from_slice(&body).ok();
            let out: serde_json::Value = match reply_with {
                Some(v) => v,
                None => serde_json::to_value(sent.as_ref().expect("a lease sent")).unwrap(),
            };
            reply.send_response(
                Response::builder()
                    .status(status)
                    .body(Body::from(serde_json::to_vec(&out).unwrap()))
                    .unwrap(),
            );
            sent
        };
        let not_found = serde_json::json!({"kind": "Status", "apiVersion": "v1",
            "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"});
        answer(
            Method::GET,
            format!("{URL}/l"),
            StatusCode::NOT_FOUND,
            Some(not_found),
        )
        .await;
        let created = answer(Method::POST, URL.into(), StatusCode::CREATED, None)
            .await
            .expect("the lease created");
        let spec = created.spec.clone().unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("me"));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        let stored = serde_json::to_value(&created).unwrap();
        answer(
            Method::GET,
            format!("{URL}/l"),
            StatusCode::OK,
            Some(stored),
        )
        .await;
        let released = answer(Method::PUT, format!("{URL}/l"), StatusCode::OK, None)
            .await
            .expect("the lease replaced");
        let spec = released.spec.unwrap();
        assert_eq!(spec.holder_identity, None, "released: {spec:?}");
        assert_eq!(spec.renew_time, None);
    });
    let cfg = LeaseConfig::for_duration("l", "me", Duration::from_secs(15));
    let elector = Elector::new(Api::namespaced(client, "ns"), cfg);
    let leadership = tokio::time::timeout(Duration::from_secs(5), elector.acquire())
        .await
        .expect("acquired");
    assert_eq!(leadership.config().identity, "me");
    Role::Leading(leadership).release().await;
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("every request made")
        .expect("the API server saw what it expected");
}
