//! `permitctl` against a real cluster: the operator commands end to end.

use permitd_tests::{Cluster, Settings};
use serde_json::{json, Value};

fn keys_of(listing: &Value) -> Vec<String> {
    listing
        .as_array()
        .expect("a JSON array of keys")
        .iter()
        .map(|entry| entry["key"].as_str().expect("key").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_follows_pages_and_stops_at_limit() {
    let cluster = Cluster::start(Settings {
        nodes: 1,
        ..Settings::default()
    })
    .await;
    let names: Vec<String> = (0..7).map(|index| format!("paged-{index}")).collect();
    for name in &names {
        let answer = cluster
            .put(
                1,
                &format!("/v1/semaphores/{name}/config"),
                &json!({"limit": 5}),
            )
            .await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }

    // Pages of 2: four calls, every key once, in order.
    let all = cluster.permitctl(&["--json", "keys", "--page-size", "2"]);
    assert!(all.success, "{all:?}");
    assert_eq!(keys_of(&all.json()), names);
    assert!(all.stderr.is_empty(), "nothing was cut: {all:?}");

    // A limit that falls inside a page, and one that ends on a page boundary.
    for limit in [3usize, 4] {
        let some = cluster.permitctl(&[
            "--json",
            "keys",
            "--page-size",
            "2",
            "--limit",
            &limit.to_string(),
        ]);
        assert!(some.success, "{some:?}");
        assert_eq!(keys_of(&some.json()), names[..limit]);
        assert!(
            some.stderr.contains("more follow"),
            "the cut is reported: {some:?}"
        );
    }

    // A limit at or past the end reports no cut; the table names every key.
    let exact = cluster.permitctl(&["keys", "--page-size", "3", "--limit", "7"]);
    assert!(exact.success, "{exact:?}");
    assert!(exact.stderr.is_empty(), "{exact:?}");
    for name in &names {
        assert!(exact.stdout.contains(name.as_str()), "{exact:?}");
    }
}
