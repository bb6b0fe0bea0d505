//! Property test: random ops on a mount and on a model of the durable image; after
//! each power loss the mount must show exactly the model's durable image.

mod common;

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;

use common::{list, mount, read, sync_dir};
use proptest::prelude::*;

const NAMES: [&str; 3] = ["a", "b", "c"];

#[derive(Debug, Clone)]
enum Op {
    Create(usize),
    Write(usize, u64, Vec<u8>),
    Truncate(usize, u64),
    Fsync(usize),
    Unlink(usize),
    Rename(usize, usize),
    SyncDir,
    PowerLoss(Option<u64>),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..3usize).prop_map(Op::Create),
        4 => (0..3usize, 0..64u64, prop::collection::vec(any::<u8>(), 1..32))
            .prop_map(|(n, o, d)| Op::Write(n, o, d)),
        1 => (0..3usize, 0..80u64).prop_map(|(n, l)| Op::Truncate(n, l)),
        2 => (0..3usize).prop_map(Op::Fsync),
        1 => (0..3usize).prop_map(Op::Unlink),
        1 => (0..3usize, 0..3usize).prop_map(|(a, b)| Op::Rename(a, b)),
        2 => Just(Op::SyncDir),
        1 => Just(Op::PowerLoss(None)),
    ]
}

/// The files' current and durable contents (by file id) and the two namespaces.
#[derive(Default)]
struct Model {
    cur: Vec<Vec<u8>>,
    dur: Vec<Vec<u8>>,
    ns: BTreeMap<&'static str, usize>,
    dur_ns: BTreeMap<&'static str, usize>,
}

impl Model {
    fn power_loss(&mut self) {
        self.cur = self.dur.clone();
        self.ns = self.dur_ns.clone();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mount_matches_the_durable_model(ops in prop::collection::vec(op(), 1..40)) {
        let Some(m) = mount() else { return Ok(()) };
        let mut md = Model::default();
        for op in ops.into_iter().chain([Op::PowerLoss(None)]) {
            match op {
                Op::Create(n) => {
                    let name = NAMES[n];
                    if !md.ns.contains_key(name) {
                        File::create_new(m.p(name)).unwrap();
                        md.cur.push(Vec::new());
                        md.dur.push(Vec::new());
                        md.ns.insert(name, md.cur.len() - 1);
                    }
                }
                Op::Write(n, off, data) => {
                    if let Some(&id) = md.ns.get(NAMES[n]) {
                        OpenOptions::new().write(true).open(m.p(NAMES[n])).unwrap()
                            .write_all_at(&data, off).unwrap();
                        let c = &mut md.cur[id];
                        let end = off as usize + data.len();
                        if c.len() < end { c.resize(end, 0); }
                        c[off as usize..end].copy_from_slice(&data);
                    }
                }
                Op::Truncate(n, len) => {
                    if let Some(&id) = md.ns.get(NAMES[n]) {
                        OpenOptions::new().write(true).open(m.p(NAMES[n])).unwrap()
                            .set_len(len).unwrap();
                        md.cur[id].resize(len as usize, 0);
                    }
                }
                Op::Fsync(n) => {
                    if let Some(&id) = md.ns.get(NAMES[n]) {
                        File::open(m.p(NAMES[n])).unwrap().sync_all().unwrap();
                        md.dur[id] = md.cur[id].clone();
                    }
                }
                Op::Unlink(n) => {
                    if md.ns.remove(NAMES[n]).is_some() {
                        fs::remove_file(m.p(NAMES[n])).unwrap();
                    }
                }
                Op::Rename(a, b) => {
                    if a != b {
                        if let Some(id) = md.ns.remove(NAMES[a]) {
                            fs::rename(m.p(NAMES[a]), m.p(NAMES[b])).unwrap();
                            md.ns.insert(NAMES[b], id);
                        }
                    }
                }
                Op::SyncDir => {
                    sync_dir(&m.mnt).unwrap_or_else(|error| {
                        panic!("fsync of the mount: {error}; session: {:?}", m.fs.check_session())
                    });
                    md.dur_ns = md.ns.clone();
                }
                Op::PowerLoss(torn) => {
                    m.fs.power_loss(torn).unwrap();
                    md.power_loss();
                    let want: Vec<String> = md.ns.keys().map(|s| s.to_string()).collect();
                    prop_assert_eq!(list(&m.mnt), want);
                    for (name, id) in &md.ns {
                        prop_assert_eq!(read(&m.p(name)).unwrap(), md.cur[*id].clone(), "file {}", name);
                    }
                }
            }
        }
    }
}
