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
    // The leader map: every shard, each with its leader.
    let shards = cluster.permitctl(&["--json", "shards"]);
    assert!(shards.success, "{shards:?}");
    let map: serde_json::Value = serde_json::from_str(&shards.stdout).expect("JSON");
    let count = permitd_tests::cluster::shards_from_env().unwrap_or(1) as usize;
    assert_eq!(map["shards"].as_array().map(Vec::len), Some(count), "{map}");
    for (index, shard) in map["shards"].as_array().into_iter().flatten().enumerate() {
        assert_eq!(shard["shard"], index, "{map}");
        assert!(shard["leader"].as_u64().is_some(), "{map}");
    }
    let table = cluster.permitctl(&["shards"]);
    assert!(table.stdout.starts_with("SHARD"), "{table:?}");
    let exact = cluster.permitctl(&["keys", "--page-size", "3", "--limit", "7"]);
    assert!(exact.success, "{exact:?}");
    assert!(exact.stderr.is_empty(), "{exact:?}");
    for name in &names {
        assert!(exact.stdout.contains(name.as_str()), "{exact:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_created_listed_in_a_table_and_revoked() {
    let cluster = Cluster::start(Settings {
        nodes: 1,
        ..Settings::default()
    })
    .await;
    let created = cluster.permitctl(&[
        "--json",
        "token",
        "create",
        "eu-runners",
        "--role",
        "runner",
        "--key",
        "acct-*,x",
        "--client-id",
        "eu-*",
    ]);
    assert!(created.success, "{created:?}");
    let id = created.json()["id"].as_u64().expect("the new token's id");

    // The table: a header and the token's row, its columns aligned under it.
    let listed = cluster.permitctl(&["token", "list"]);
    assert!(listed.success, "{listed:?}");
    let lines: Vec<&str> = listed.stdout.lines().collect();
    assert!(lines[0].starts_with("ID "), "{listed:?}");
    let row = lines
        .iter()
        .find(|line| line.split_whitespace().next() == Some(id.to_string().as_str()))
        .unwrap_or_else(|| panic!("token {id} is listed: {listed:?}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[1..], ["eu-runners", "runner", "acct-*,x", "eu-*"]);
    assert_eq!(
        lines[0].find("KEYS"),
        row.find("acct-*"),
        "columns line up: {listed:?}"
    );
    assert!(
        !listed
            .stdout
            .contains(created.json()["token"].as_str().unwrap()),
        "no secret in the listing"
    );

    let revoked = cluster.permitctl(&["token", "revoke", &id.to_string()]);
    assert!(revoked.success, "{revoked:?}");
    let after = cluster.permitctl(&["--json", "token", "list"]);
    assert!(after.success, "{after:?}");
    let ids: Vec<u64> = after
        .json()
        .as_array()
        .expect("a JSON array of tokens")
        .iter()
        .filter_map(|token| token["id"].as_u64())
        .collect();
    assert!(!ids.contains(&id), "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_group_is_unblocked_by_deleting_its_settings() {
    let cluster = Cluster::start(Settings {
        nodes: 1,
        ..Settings::default()
    })
    .await;
    let ask = |client: &'static str| {
        let body = permitd_tests::request(client, &[("g", 1, 1)]);
        let cluster = &cluster;
        async move { cluster.post(1, "/v1/semaphores/grouped", &body).await }
    };

    let set = cluster.permitctl(&[
        "group",
        "set",
        "grouped",
        "g",
        "--unlimited",
        "--permitted",
        "false",
    ]);
    assert!(set.success, "{set:?}");
    let blocked = ask("c1").await;
    assert_eq!(blocked.status, 200, "{}", blocked.body);
    assert_eq!(permitd_tests::granted(&blocked.body), 0, "{}", blocked.body);

    // A delete is answered 204 with no body: permitctl says it is done.
    let deleted = cluster.permitctl(&["group", "delete", "grouped", "g"]);
    assert!(deleted.success, "{deleted:?}");
    assert_eq!(deleted.stdout, "grouped / g: settings removed\n");
    let granted = ask("c2").await;
    assert_eq!(granted.status, 200, "{}", granted.body);
    assert_eq!(permitd_tests::granted(&granted.body), 1, "{}", granted.body);
}

/// Waits for a request's answer and returns the permits it granted.
async fn granted_by(task: tokio::task::JoinHandle<permitd_tests::Answer>) -> u64 {
    let answer = task.await.expect("request task");
    assert_eq!(answer.status, 200, "{}", answer.body);
    permitd_tests::granted(&answer.body)
}

fn spawn_request(
    cluster: &std::sync::Arc<Cluster>,
    node: u64,
    key: &str,
    client: &str,
    count: u64,
) -> tokio::task::JoinHandle<permitd_tests::Answer> {
    let cluster = cluster.clone();
    let path = format!("/v1/semaphores/{key}");
    let body = permitd_tests::request(client, &[("g", count, 1)]);
    tokio::spawn(async move { cluster.post(node, &path, &body).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_show_grants_and_waiting_demand_and_release_frees_a_dead_client() {
    let cluster = std::sync::Arc::new(Cluster::start(Settings::default()).await);
    cluster.wait_for_leader().await;
    // The leader of the key's shard parks the demand (every shard's at S = 1).
    cluster.wait_spread().await;
    let leader = cluster.key_leader("held").await;
    let follower = cluster.follower_of(leader);
    // A long round wait, so that a parked request can be seen waiting.
    let config = json!({"limit": 10, "roundWaitMs": 1500, "roundPeriodMs": 20});
    let answer = cluster
        .put(follower, "/v1/semaphores/held/config", &config)
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let dead = spawn_request(&cluster, follower, "held", "dead", 4);
    let alive = spawn_request(&cluster, leader, "held", "alive", 3);
    assert_eq!(granted_by(dead).await, 4);
    assert_eq!(granted_by(alive).await, 3);

    let waiter = spawn_request(&cluster, follower, "held", "waiter", 5);
    // Asked through a follower: forwarded to the leader, who parks the demand.
    permitd_tests::wait_for_pending(&cluster, leader, 1).await;
    let holders = cluster.get(follower, "/v1/semaphores/held/holders").await;
    assert_eq!(holders.status, 200, "{}", holders.body);
    let clients = &holders.body["clients"];
    assert_eq!(clients["dead"]["grants"][0]["permits"], 4, "{clients}");
    assert_eq!(clients["dead"]["grants"][0]["claimed"], 0);
    assert!(clients["dead"]["grants"][0]["fence"].as_u64().unwrap() > 0);
    assert!(
        clients["dead"]["grants"][0]["claimDeadlineMs"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert_eq!(clients["alive"]["grants"][0]["permits"], 3);
    assert_eq!(
        clients["waiter"]["waiting"],
        json!([{"group": "g", "count": 5, "requests": 1}]),
        "{clients}"
    );
    assert_eq!(granted_by(waiter).await, 3, "only 3 of 10 were left");

    let shown = cluster.permitctl(&["--json", "holders", "held"]);
    assert!(shown.success, "{shown:?}");
    let shown = shown.json();
    assert_eq!(shown["clients"]["waiter"]["grants"][0]["permits"], 3);
    assert_eq!(shown["clients"]["waiter"]["waiting"], json!([]));
    let table = cluster.permitctl(&["holders", "held"]);
    assert!(
        table.stdout.contains("dead") && table.stdout.contains("grant"),
        "{table:?}"
    );

    let released = cluster.permitctl(&["--json", "release", "held", "dead"]);
    assert!(released.success, "{released:?}");
    assert_eq!(
        released.json(),
        json!({"grants": 1, "leases": 0, "permits": 4})
    );
    for node in 1..=3 {
        assert_eq!(cluster.usage(node, "held").await["granted"], 6);
    }
    let holders = cluster.get(leader, "/v1/semaphores/held/holders").await;
    assert!(
        holders.body["clients"].get("dead").is_none(),
        "{}",
        holders.body
    );

    // The runner was not dead after all: its report of the dropped grant frees
    // nothing a second time.
    let grant_id = clients["dead"]["grants"][0]["grantId"].clone();
    let sync = json!({"type": "sync", "v": 1, "clientId": "dead",
        "grants": [{"grantId": grant_id, "claimed": 4, "released": 4}]});
    let answer = cluster.post(follower, "/v1/semaphores/held", &sync).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(cluster.usage(leader, "held").await["granted"], 6);

    // Every replica applied the entry and emitted the event.
    for node in 1..=3u64 {
        let log = cluster.dir.path().join(format!("node-{node}.log"));
        let seen = permitd_tests::eventually(std::time::Duration::from_secs(10), || {
            let log = log.clone();
            async move {
                std::fs::read_to_string(&log).is_ok_and(|text| text.contains("client_released"))
            }
        })
        .await;
        assert!(seen, "node {node} logged client_released");
    }

    // Releasing a client that holds nothing drops nothing; a bad clientId is a 400.
    let nothing = cluster
        .post(
            follower,
            "/v1/semaphores/held/clients/nobody/release",
            &json!({}),
        )
        .await;
    assert_eq!(nothing.status, 200, "{}", nothing.body);
    assert_eq!(nothing.body["permits"], 0);
    let long = "x".repeat(300);
    let refused = cluster
        .post(
            leader,
            &format!("/v1/semaphores/held/clients/{long}/release"),
            &json!({}),
        )
        .await;
    assert_eq!(refused.status, 400, "{}", refused.body);
}

/// What the background runner saw.
#[derive(Debug, Default)]
struct RunnerReport {
    rounds: u64,
    /// Usage above the limit, as read right after a round: must stay 0.
    violations: Vec<String>,
}

/// A job runner that keeps taking and returning permits through `urls` until
/// `stop`, checking after each round that usage stays within `limit`.
async fn run_runner(
    urls: Vec<String>,
    limit: u64,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    progress: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> RunnerReport {
    let http = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .expect("http client");
    let mut report = RunnerReport::default();
    let mut turn = 0usize;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        turn += 1;
        let url = &urls[turn % urls.len()];
        let client = format!("runner-{}", turn % 3);
        let body = permitd_tests::request(&client, &[("g", 4, 1)]);
        let Ok(answer) = http
            .post(format!("{url}/v1/semaphores/r"))
            .bearer_auth(permitd_tests::ADMIN_TOKEN)
            .json(&body)
            .send()
            .await
        else {
            continue;
        };
        let Ok(answer) = answer.json::<Value>().await else {
            continue;
        };
        let Some(grants) = answer["grants"].as_array().filter(|g| !g.is_empty()) else {
            continue;
        };
        report.rounds += 1;
        progress.store(report.rounds, std::sync::atomic::Ordering::Relaxed);
        if let Ok(usage) = http
            .get(format!("{url}/v1/semaphores/r/usage"))
            .bearer_auth(permitd_tests::ADMIN_TOKEN)
            .send()
            .await
        {
            let usage: Value = usage.json().await.unwrap_or_default();
            let held =
                usage["granted"].as_u64().unwrap_or(0) + usage["leased"].as_u64().unwrap_or(0);
            if held > limit {
                report.violations.push(usage.to_string());
            }
        }
        // Work done: claim and return every permit of the grants.
        let reports: Vec<Value> = grants
            .iter()
            .map(|g| json!({"grantId": g["grantId"], "claimed": g["permits"], "released": g["permits"]}))
            .collect();
        let sync = json!({"type": "sync", "v": 1, "clientId": client, "grants": reports});
        let _ = http
            .post(format!("{url}/v1/semaphores/r"))
            .bearer_auth(permitd_tests::ADMIN_TOKEN)
            .json(&sync)
            .send()
            .await;
    }
    report
}

fn voters_of(members: &Value) -> Vec<u64> {
    members
        .as_array()
        .expect("members")
        .iter()
        .filter(|member| member["role"] == "voter")
        .map(|member| member["id"].as_u64().expect("id"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_replace_a_dead_node_while_a_runner_keeps_working() {
    let mut cluster = Cluster::start(Settings::default()).await;
    let leader = cluster.wait_for_leader().await;
    let dead = cluster.follower_of(leader);
    let answer = cluster
        .put(leader, "/v1/semaphores/r/config", &json!({"limit": 6}))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let survivors: Vec<String> = cluster
        .nodes
        .iter()
        .filter(|node| node.id != dead)
        .map(|node| node.url())
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let progress = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let runner = tokio::spawn(run_runner(survivors, 6, stop.clone(), progress.clone()));

    let listed = cluster.permitctl(&["--json", "members", "list"]);
    assert!(listed.success, "{listed:?}");
    assert_eq!(voters_of(&listed.json()).len(), 3);

    cluster.kill(dead);
    let removed = cluster.permitctl(&["--json", "members", "remove", &dead.to_string()]);
    assert!(removed.success, "{removed:?}");
    assert!(!voters_of(&removed.json()).contains(&dead));

    let new = cluster.spawn_extra_node();
    cluster.wait_healthy().await;
    let (api, raft) = {
        let node = cluster.node(new);
        (node.api_addr.clone(), node.raft_addr.clone())
    };
    let added = cluster.permitctl(&["--json", "members", "add", &new.to_string(), &api, &raft]);
    assert!(added.success, "{added:?}");
    let role = |members: &Value| {
        members.as_array().and_then(|all| {
            all.iter()
                .find(|member| member["id"] == new)
                .map(|member| member["role"].clone())
        })
    };
    assert_eq!(role(&added.json()), Some(json!("learner")), "{added:?}");
    let promoted = cluster.permitctl(&["--json", "members", "promote", &new.to_string()]);
    assert!(promoted.success, "{promoted:?}");
    let mut voters = voters_of(&promoted.json());
    voters.sort_unstable();
    let mut expected: Vec<u64> = (1..=3).filter(|id| *id != dead).chain([new]).collect();
    expected.sort_unstable();
    assert_eq!(voters, expected);
    let again = cluster.permitctl(&["members", "promote", &new.to_string()]);
    assert!(
        !again.success && again.stderr.contains("voter already"),
        "{again:?}"
    );

    // The new voter serves, and the runner kept going throughout: it gets
    // permits after the membership changes too.
    let rounds_before = progress.load(std::sync::atomic::Ordering::Relaxed);
    let kept_going = permitd_tests::eventually(std::time::Duration::from_secs(20), || async {
        let rounds = progress.load(std::sync::atomic::Ordering::Relaxed);
        rounds > rounds_before && rounds >= 3
    })
    .await;
    assert!(kept_going, "the runner works after the change");
    cluster
        .wait_applied_everywhere(cluster.wait_for_leader().await)
        .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let report = runner.await.expect("runner");
    assert!(report.violations.is_empty(), "{report:?}");
    assert!(report.rounds >= 3, "the runner kept working: {report:?}");
    let usage = cluster.usage(new, "r").await;
    assert!(usage["granted"].as_u64().unwrap() <= 6, "{usage}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_snapshot_restores_into_a_new_cluster_with_the_same_holdings() {
    let old = Cluster::start(Settings::default()).await;
    let config = json!({"limit": 20,
        "leases": {"provisioning": {"mode": "strict"}, "ttlMs": 60000, "permitsPerLease": 4}});
    assert_eq!(
        old.put(1, "/v1/semaphores/b1/config", &config).await.status,
        200
    );
    let group = json!({"limit": 7, "permitted": true});
    assert_eq!(
        old.put(2, "/v1/semaphores/b1/groups/g", &group)
            .await
            .status,
        200
    );
    let mut leasing = permitd_tests::request("leaser", &[("g", 3, 1)]);
    leasing["leases"] = json!([]);
    for body in [
        permitd_tests::request("plain", &[("g", 2, 1)]),
        leasing,
        permitd_tests::request("other", &[("h", 5, 1)]),
    ] {
        let answer = old.post(3, "/v1/semaphores/b1", &body).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
    }
    let answer = old
        .post(
            1,
            "/v1/semaphores/b2",
            &permitd_tests::request("plain", &[("x", 1, 1)]),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);

    let file = old.dir.path().join("backup.json");
    let saved = old.permitctl(&["--json", "snapshot", "save", &file.display().to_string()]);
    assert!(saved.success, "{saved:?}");
    assert_eq!(saved.json()["keys"], 2, "{saved:?}");

    let new = Cluster::start(Settings::default()).await;
    let restore = |new: &Cluster| {
        std::process::Command::new(permitd_tests::permitd_bin())
            .arg("restore")
            .arg("--from")
            .arg(&file)
            .arg("--config")
            .arg(new.dir.path().join("cluster.toml"))
            .output()
            .expect("permitd restore runs")
    };
    let output = restore(&new);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    for key in ["b1", "b2"] {
        let before = old.get(1, &format!("/v1/semaphores/{key}/holders")).await;
        let after = new.get(2, &format!("/v1/semaphores/{key}/holders")).await;
        assert_eq!(after.status, 200, "{}", after.body);
        assert_eq!(before.body, after.body, "the holders of {key}");
        assert_eq!(
            old.usage(1, key).await,
            new.usage(3, key).await,
            "usage of {key}"
        );
        let config = format!("/v1/semaphores/{key}/config");
        assert_eq!(
            old.get(2, &config).await.body,
            new.get(1, &config).await.body
        );
    }
    let holders = new.get(1, "/v1/semaphores/b1/holders").await.body;
    assert!(
        holders["clients"]["plain"]["grants"][0]["permits"] == 2,
        "{holders}"
    );
    assert!(
        holders["clients"]["leaser"]["leases"]
            .as_array()
            .is_some_and(|l| !l.is_empty())
            || holders["clients"]["leaser"]["grants"]
                .as_array()
                .is_some_and(|g| !g.is_empty()),
        "{holders}"
    );

    // Only into a new cluster: a second restore is refused and changes nothing.
    let again = restore(&new);
    assert!(!again.status.success());
    let refused = String::from_utf8_lossy(&again.stderr);
    assert!(refused.contains("new cluster"), "{refused}");
}
