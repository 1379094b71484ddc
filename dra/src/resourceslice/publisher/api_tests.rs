//! The requests of [`KubePublishApi`] against a mocked API server ([`crate::testing::api_server`]):
//! one test per call, one for the errors [`Publisher`]'s logic matches on, and two publisher
//! runs over the kube client (a first publish, an unpublish racing a deletion).

use http::Method;
use kube::api::Preconditions;
use serde_json::{Value, json};

use super::*;
use crate::testing::api_server::{ApiServer, Exchange, finished};

const DRIVER: &str = "dev.example.com";
const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";
/// The URI of the listing of node `n0`'s slices of the driver.
const LIST_N0: &str = "/apis/resource.k8s.io/v1/resourceslices?&fieldSelector=spec.driver%3Ddev.example.com%2Cspec.nodeName%3Dn0";
/// The first slice of node `n0`'s pool.
const NAME: &str = "00000-dev.example.com-n0";

fn pool() -> Pool {
    Pool::new(DRIVER, "n0")
}

/// The pool's one empty slice as the plugin sends it (no UID, no resourceVersion).
fn slice() -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": NAME, "ownerReferences": [{"apiVersion": "v1", "kind": "Node",
            "name": "n0", "uid": "node-uid", "controller": true}]},
        "spec": {"driver": DRIVER, "nodeName": "n0",
            "pool": {"name": "n0", "generation": 1, "resourceSliceCount": 1}}
    })
}

/// [`slice`] as the API server stores it, at resourceVersion `rv`.
fn stored(rv: &str) -> Value {
    let mut v = slice();
    v["metadata"]["uid"] = json!("slice-uid");
    v["metadata"]["resourceVersion"] = json!(rv);
    v
}

fn typed(v: Value) -> ResourceSlice {
    serde_json::from_value(v).unwrap()
}

fn node() -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n0", "uid": "node-uid"}})
}

fn list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
        "metadata": {"resourceVersion": "9"}, "items": items})
}

/// A deletion's answer.
fn deleted() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
        "details": {"name": NAME, "group": "resource.k8s.io", "kind": "resourceslices",
            "uid": "slice-uid"}})
}

#[tokio::test]
async fn list_selects_the_slices_by_the_publishers_field_selector() {
    let (client, server) = ApiServer::new();
    let server = server.run(vec![
        Exchange::new(Method::GET, LIST_N0).answer(200, list(vec![stored("7")])),
    ]);
    let selector = Publisher::new(client.clone(), pool()).field_selector();
    let api = KubePublishApi::new(client);
    let items = api.list(&selector).await.unwrap();
    assert_eq!(items, vec![typed(stored("7"))]);
    drop(api);
    finished(server).await;
}

#[tokio::test]
async fn node_gets_the_node_by_name() {
    let (client, server) = ApiServer::new();
    let server = server.run(vec![
        Exchange::new(Method::GET, "/api/v1/nodes/n0").answer(200, node()),
    ]);
    let api = KubePublishApi::new(client);
    let node = api.node("n0").await.unwrap();
    assert_eq!(node.metadata.uid.as_deref(), Some("node-uid"));
    drop(api);
    finished(server).await;
}

#[tokio::test]
async fn create_posts_the_slice_and_returns_what_was_stored() {
    let (client, server) = ApiServer::new();
    let server = server.run(vec![
        Exchange::new(Method::POST, format!("{SLICES}?"))
            .body(slice())
            .answer(201, stored("1")),
    ]);
    let api = KubePublishApi::new(client);
    let got = api.create(&typed(slice()), false).await.unwrap();
    assert_eq!(got, typed(stored("1")));
    drop(api);
    finished(server).await;
}

#[tokio::test]
async fn a_dry_run_create_says_so_in_the_query() {
    let (client, server) = ApiServer::new();
    let mut probe = slice();
    probe["metadata"] = json!({"generateName": "dev.example.com-counter-probe-"});
    let mut answer = probe.clone();
    answer["metadata"]["name"] = json!("dev.example.com-counter-probe-x7k2p");
    let server = server.run(vec![
        Exchange::new(Method::POST, format!("{SLICES}?&dryRun=All"))
            .body(probe.clone())
            .answer(201, answer.clone()),
    ]);
    let api = KubePublishApi::new(client);
    let got = api.create(&typed(probe), true).await.unwrap();
    assert_eq!(got, typed(answer));
    drop(api);
    finished(server).await;
}

#[tokio::test]
async fn replace_puts_the_slice_by_name_with_the_resource_version_it_read() {
    let (client, server) = ApiServer::new();
    let server = server.run(vec![
        Exchange::new(Method::PUT, format!("{SLICES}/{NAME}?"))
            .body(stored("7"))
            .answer(200, stored("8")),
    ]);
    let api = KubePublishApi::new(client);
    let got = api.replace(&typed(stored("7"))).await.unwrap();
    assert_eq!(got.metadata.resource_version.as_deref(), Some("8"));
    drop(api);
    finished(server).await;
}

#[tokio::test]
async fn delete_sends_the_uid_and_resource_version_preconditions() {
    let (client, server) = ApiServer::new();
    let server = server.run(vec![
        Exchange::new(Method::DELETE, format!("{SLICES}/{NAME}?"))
            .body(json!({"preconditions": {"uid": "slice-uid", "resourceVersion": "7"}}))
            .answer(200, deleted()),
    ]);
    let api = KubePublishApi::new(client);
    let preconditions = Preconditions {
        uid: Some("slice-uid".into()),
        resource_version: Some("7".into()),
    };
    api.delete(NAME, preconditions).await.unwrap();
    drop(api);
    finished(server).await;
}

#[tokio::test]
async fn conflicts_and_absences_come_back_as_the_api_errors_the_publisher_matches() {
    let (client, server) = ApiServer::new();
    let server = server.run(vec![
        Exchange::new(Method::PUT, format!("{SLICES}/{NAME}?"))
            .body(stored("7"))
            .fail(409, "Conflict"),
        Exchange::new(Method::POST, format!("{SLICES}?"))
            .body(slice())
            .fail(409, "AlreadyExists"),
        Exchange::new(Method::DELETE, format!("{SLICES}/{NAME}?"))
            .body(json!({"preconditions": {"uid": "slice-uid"}}))
            .fail(404, "NotFound"),
        Exchange::new(Method::GET, "/api/v1/nodes/n0").fail(404, "NotFound"),
    ]);
    let api = KubePublishApi::new(client);
    let status = |e: kube::Error| match e {
        kube::Error::Api(s) => s,
        other => panic!("not an API error: {other:?}"),
    };
    let s = status(api.replace(&typed(stored("7"))).await.unwrap_err());
    assert!(s.is_conflict() && s.code == 409, "{s:?}");
    let s = status(api.create(&typed(slice()), false).await.unwrap_err());
    assert!(s.is_already_exists() && s.code == 409, "{s:?}");
    let uid_only = Preconditions {
        uid: Some("slice-uid".into()),
        resource_version: None,
    };
    let s = status(api.delete(NAME, uid_only).await.unwrap_err());
    assert!(s.is_not_found() && s.code == 404, "{s:?}");
    let s = status(api.node("n0").await.unwrap_err());
    assert!(s.is_not_found(), "{s:?}");
    drop(api);
    finished(server).await;
}

#[tokio::test]
async fn a_first_publish_lists_reads_the_node_uid_and_creates_the_pool() {
    let (client, server) = ApiServer::new();
    let server = server.run(vec![
        Exchange::new(Method::GET, LIST_N0).answer(200, list(vec![])),
        Exchange::new(Method::GET, "/api/v1/nodes/n0").answer(200, node()),
        Exchange::new(Method::POST, format!("{SLICES}?"))
            .body(slice())
            .answer(201, stored("1")),
    ]);
    let mut publisher = Publisher::new(client, pool());
    let stats = publisher.publish(vec![]).await.unwrap();
    assert_eq!((stats.created, stats.writes()), (1, 1));
    drop(publisher);
    finished(server).await;
}

#[tokio::test]
async fn unpublish_takes_a_slice_deleted_meanwhile_for_deleted() {
    let (client, server) = ApiServer::new();
    let server = server.run(vec![
        Exchange::new(Method::GET, LIST_N0).answer(200, list(vec![stored("7")])),
        Exchange::new(Method::DELETE, format!("{SLICES}/{NAME}?"))
            .body(json!({"preconditions": {"uid": "slice-uid", "resourceVersion": "7"}}))
            .fail(404, "NotFound"),
    ]);
    let mut publisher = Publisher::new(client, pool());
    assert_eq!(publisher.unpublish().await.unwrap(), 1);
    drop(publisher);
    finished(server).await;
}
