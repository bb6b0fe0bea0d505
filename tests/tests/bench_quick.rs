//! The bench's quick profile completes against real processes and prints its
//! table. No performance assertions: CI machines vary. One correctness check:
//! in the shard failover row the other shards answered every call.

use std::time::Duration;

use permitd_tests::bench::{self, Profile};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_bench_completes_and_prints_its_table() {
    let started = std::time::Instant::now();
    // The idle row at 8 shards, not the binary's 64: a debug build beside
    // the rest of the suite starts 64 groups slowly, and the row's point here
    // is that it runs.
    // Two shard failover rounds, not five: enough to run the row. Shorter
    // windows than the binary's quick profile, and one failover kill: this
    // test checks that every row runs and prints, not what it measures, and
    // its time comes out of CI's 30 minutes.
    let profile = Profile {
        idle_shard_counts: vec![8],
        shard_failover_rounds: 2,
        warmup: Duration::from_millis(100),
        measure: Duration::from_millis(500),
        lease_measure: Duration::from_millis(600),
        scale_probe: Duration::from_millis(500),
        shard_failover_steady: Duration::from_millis(500),
        failover_kills: 1,
        ..Profile::quick()
    };
    let report = bench::run(&profile).await;
    let table = report.markdown();
    println!("{table}");
    for section in [
        "6 floor",
        "1 grant",
        "3 messages",
        "2 lease",
        "4 failover",
        "5 scale",
        "7 shards",
        "4 shard failover",
    ] {
        assert!(table.contains(section), "no {section} row in:\n{table}");
    }
    assert!(table.lines().filter(|line| line.starts_with("| ")).count() > 8);
    for column in [
        "leader changes (outside failover): ",
        "CPU µs/cycle",
        "µs/entry",
    ] {
        assert!(table.contains(column), "no {column:?} in:\n{table}");
    }
    other_shards_answer_every_call(&report.to_json());
    eprintln!("quick bench took {:?}", started.elapsed());
}

/// Failure isolation (issue: "the other shards answer every call"): while a
/// node that leads a shard is dead, no call to a shard it did not lead fails.
/// A correctness property, not a timing: a failed call is an error answer, a
/// connection error, or no answer within ten seconds. The kill-to-serve
/// times are only reported.
fn other_shards_answer_every_call(json: &serde_json::Value) {
    let rows = json["rows"].as_array().expect("rows");
    let row = rows
        .iter()
        .find(|row| row["section"] == "shard-failover")
        .expect("a shard failover row");
    assert!(
        row["rounds"].as_u64() >= Some(1),
        "no failover round: {row}"
    );
    assert!(
        row["otherCalls"].as_u64() > Some(0),
        "no calls measured: {row}"
    );
    assert_eq!(
        row["otherFailedCalls"], 0,
        "the other shards failed calls: {row}"
    );
}
