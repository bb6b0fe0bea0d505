//! State a client cannot grow by asking for nothing: removing settings that do not
//! exist creates no key (the finding "50 `DELETE .../groups/g` on keys that never
//! existed leave 50 keys listed forever, past the key limit").

use permitd_tests::{Cluster, Settings};
use reqwest::Method;
use serde_json::json;

/// The calls the finding made, one per key that never existed.
const DELETES_OF_UNKNOWN_KEYS: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_group_of_a_key_that_never_existed_creates_no_key() {
    let cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let follower = cluster.follower_of(leader);
    for index in 0..DELETES_OF_UNKNOWN_KEYS {
        let path = format!("/v1/semaphores/never-{index}/groups/g");
        let answer = cluster.call(follower, Method::DELETE, &path, None).await;
        assert_eq!(answer.status, 204, "{path}: {}", answer.body);
    }
    let list = cluster.get(leader, "/v1/semaphores").await;
    assert_eq!(list.status, 200, "{}", list.body);
    assert_eq!(list.body["keys"], json!([]), "no key was created");
}
