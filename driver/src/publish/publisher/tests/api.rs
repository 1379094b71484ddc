//! DAS's publisher over a kube client, against a mocked API server ([`crate::mock_api_server`]):
//! the pool of `mig.das.com` on the node, under DAS's slice names (the generic client's own
//! requests are tested in dra-plugin's `resourceslice/publisher/api_tests.rs`).

use http::Method;
use serde_json::{Value, json};

use super::*;
use crate::mock_api_server::{ApiServer, Exchange, finished};

const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";
/// The URI of the listing of node `n0`'s slices of our driver.
const LIST_N0: &str = "/apis/resource.k8s.io/v1/resourceslices?&fieldSelector=spec.driver%3Dmig.das.com%2Cspec.nodeName%3Dn0";

/// The pool's one empty slice as the plugin sends it.
fn slice() -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "00000-mig.das.com-n0", "ownerReferences": [{"apiVersion": "v1",
            "kind": "Node", "name": "n0", "uid": "node-uid", "controller": true}]},
        "spec": {"driver": "mig.das.com", "nodeName": "n0",
            "pool": {"name": "n0", "generation": 1, "resourceSliceCount": 1}}
    })
}

#[tokio::test]
async fn a_first_publish_lists_reads_the_node_uid_and_creates_the_pool() {
    let (client, server) = ApiServer::new();
    let mut stored = slice();
    stored["metadata"]["uid"] = json!("slice-uid");
    stored["metadata"]["resourceVersion"] = json!("1");
    let node = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "n0", "uid": "node-uid"}});
    let list = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
        "metadata": {"resourceVersion": "9"}, "items": []});
    let server = server.run(vec![
        Exchange::new(Method::GET, LIST_N0).answer(200, list),
        Exchange::new(Method::GET, "/api/v1/nodes/n0").answer(200, node),
        Exchange::new(Method::POST, format!("{SLICES}?"))
            .body(slice())
            .answer(201, stored),
    ]);
    let mut publisher = Publisher::new(client, "n0", None);
    assert_eq!(
        publisher.field_selector(),
        "spec.driver=mig.das.com,spec.nodeName=n0"
    );
    let stats = publisher.publish(vec![]).await.unwrap();
    assert_eq!((stats.created, stats.writes()), (1, 1));
    drop(publisher);
    finished(server).await;
}
