//! The bench's quick profile completes against real processes and prints its
//! table. No performance assertions: CI machines vary.

use permitd_tests::bench::{self, Profile};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_bench_completes_and_prints_its_table() {
    let started = std::time::Instant::now();
    // The idle row at 8 shards, not the binary's 64: a debug build beside
    // the rest of the suite starts 64 groups slowly, and the row's point here
    // is that it runs.
    let profile = Profile {
        idle_shard_counts: vec![8],
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
    eprintln!("quick bench took {:?}", started.elapsed());
}
