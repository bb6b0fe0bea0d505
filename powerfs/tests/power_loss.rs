//! powerfs's semantics through a real mount: what survives power_loss and what not.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;

use common::{durable_file, list, mount, read, sync_dir};

#[test]
fn unsynced_write_is_lost_synced_write_is_kept() {
    let Some(m) = mount() else { return };
    durable_file(&m.p("synced"), b"").unwrap();
    durable_file(&m.p("unsynced"), b"").unwrap();
    let mut f = OpenOptions::new().write(true).open(m.p("synced")).unwrap();
    f.write_all(b"kept").unwrap();
    f.sync_all().unwrap();
    drop(f);
    fs::write(m.p("unsynced"), b"lost").unwrap();
    // reads through the mount see the current view (and fill the page cache)
    assert_eq!(read(&m.p("unsynced")).unwrap(), b"lost");
    let r = m.fs.power_loss(None).unwrap();
    eprintln!("{r}");
    // fs::write: O_TRUNC (a setattr size 0) and the write
    assert_eq!(r.writes_dropped, 2);
    assert_eq!(r.namespace_ops_dropped, 0);
    // after power loss, reads through the mountpoint see the reverted data
    assert_eq!(read(&m.p("synced")).unwrap(), b"kept");
    assert_eq!(read(&m.p("unsynced")).unwrap(), b"");
    assert_eq!(read(&m.backing.join("unsynced")).unwrap(), b"");
}

#[test]
fn overwrite_in_the_middle_reverts_to_the_old_bytes() {
    let Some(m) = mount() else { return };
    durable_file(&m.p("f"), b"0123456789").unwrap();
    let f = OpenOptions::new().write(true).open(m.p("f")).unwrap();
    f.write_all_at(b"abc", 3).unwrap();
    f.write_all_at(b"Z", 4).unwrap();
    drop(f);
    assert_eq!(read(&m.p("f")).unwrap(), b"012aZc6789");
    let r = m.fs.power_loss(None).unwrap();
    assert_eq!(r.writes_dropped, 2);
    assert_eq!(read(&m.p("f")).unwrap(), b"0123456789");
}

#[test]
fn append_without_sync_reverts_the_size() {
    let Some(m) = mount() else { return };
    durable_file(&m.p("log"), b"head").unwrap();
    let mut f = OpenOptions::new().append(true).open(m.p("log")).unwrap();
    f.write_all(b"-tail1").unwrap();
    f.write_all(b"-tail2").unwrap();
    drop(f);
    assert_eq!(read(&m.p("log")).unwrap(), b"head-tail1-tail2");
    m.fs.power_loss(None).unwrap();
    assert_eq!(fs::metadata(m.p("log")).unwrap().len(), 4);
    assert_eq!(read(&m.p("log")).unwrap(), b"head");
}

#[test]
fn truncate_shrink_and_grow_revert() {
    let Some(m) = mount() else { return };
    durable_file(&m.p("shrink"), b"0123456789").unwrap();
    durable_file(&m.p("grow"), b"abc").unwrap();
    OpenOptions::new()
        .write(true)
        .open(m.p("shrink"))
        .unwrap()
        .set_len(2)
        .unwrap();
    OpenOptions::new()
        .write(true)
        .open(m.p("grow"))
        .unwrap()
        .set_len(100)
        .unwrap();
    // O_TRUNC reaches powerfs as a setattr(size 0)
    durable_file(&m.p("otrunc"), b"before").unwrap();
    File::create(m.p("otrunc")).unwrap();
    assert_eq!(read(&m.p("otrunc")).unwrap(), b"");
    assert_eq!(read(&m.p("shrink")).unwrap(), b"01");
    assert_eq!(fs::metadata(m.p("grow")).unwrap().len(), 100);
    m.fs.power_loss(None).unwrap();
    assert_eq!(read(&m.p("shrink")).unwrap(), b"0123456789");
    assert_eq!(read(&m.p("grow")).unwrap(), b"abc");
    assert_eq!(read(&m.p("otrunc")).unwrap(), b"before");
}

#[test]
fn fdatasync_counts_as_sync() {
    let Some(m) = mount() else { return };
    durable_file(&m.p("f"), b"").unwrap();
    let mut f = OpenOptions::new().write(true).open(m.p("f")).unwrap();
    f.write_all(b"data").unwrap();
    f.sync_data().unwrap();
    f.write_all(b"+more").unwrap();
    drop(f);
    let r = m.fs.power_loss(None).unwrap();
    assert_eq!(r.writes_dropped, 1);
    assert_eq!(read(&m.p("f")).unwrap(), b"data");
}

#[test]
fn create_without_dir_fsync_vanishes_even_if_the_file_was_fsynced() {
    let Some(m) = mount() else { return };
    fs::create_dir(m.p("a")).unwrap();
    fs::create_dir(m.p("b")).unwrap();
    sync_dir(&m.mnt).unwrap();
    let mut f = File::create(m.p("a/nodirsync")).unwrap();
    f.write_all(b"x").unwrap();
    f.sync_all().unwrap();
    drop(f);
    durable_file(&m.p("b/dirsync"), b"y").unwrap();
    let r = m.fs.power_loss(None).unwrap();
    eprintln!("{r}");
    assert_eq!(r.namespace_ops_dropped, 1);
    assert!(list(&m.p("a")).is_empty());
    assert_eq!(read(&m.p("b/dirsync")).unwrap(), b"y");
}

#[test]
fn create_without_dir_fsync_vanishes() {
    let Some(m) = mount() else { return };
    fs::create_dir(m.p("d")).unwrap();
    sync_dir(&m.mnt).unwrap();
    let mut f = File::create(m.p("d/f")).unwrap();
    f.write_all(b"x").unwrap();
    f.sync_all().unwrap();
    drop(f);
    // an fsync of another dir does not help
    sync_dir(&m.mnt).unwrap();
    let r = m.fs.power_loss(None).unwrap();
    assert_eq!(r.namespace_ops_dropped, 1);
    assert!(list(&m.p("d")).is_empty());
    // with the dir fsync it stays
    durable_file(&m.p("d/g"), b"g").unwrap();
    m.fs.power_loss(None).unwrap();
    assert_eq!(read(&m.p("d/g")).unwrap(), b"g");
}

#[test]
fn rename_without_dir_fsync_reverts_and_the_target_comes_back() {
    let Some(m) = mount() else { return };
    durable_file(&m.p("new"), b"new content").unwrap();
    durable_file(&m.p("target"), b"old target").unwrap();
    fs::rename(m.p("new"), m.p("target")).unwrap();
    assert_eq!(list(&m.mnt), vec!["target"]);
    assert_eq!(read(&m.p("target")).unwrap(), b"new content");
    let r = m.fs.power_loss(None).unwrap();
    assert_eq!(r.namespace_ops_dropped, 1);
    assert_eq!(list(&m.mnt), vec!["new", "target"]);
    assert_eq!(read(&m.p("new")).unwrap(), b"new content");
    assert_eq!(read(&m.p("target")).unwrap(), b"old target");
    // with the dir fsync the rename stays (the write-temp-then-rename pattern)
    fs::rename(m.p("new"), m.p("target")).unwrap();
    sync_dir(&m.mnt).unwrap();
    m.fs.power_loss(None).unwrap();
    assert_eq!(list(&m.mnt), vec!["target"]);
    assert_eq!(read(&m.p("target")).unwrap(), b"new content");
    // the trash is hidden and emptied
    assert_eq!(
        list(&m.backing.join(".powerfs-trash")),
        Vec::<String>::new()
    );
}

#[test]
fn cross_dir_rename_is_durable_when_either_dir_is_fsynced() {
    let Some(m) = mount() else { return };
    fs::create_dir(m.p("a")).unwrap();
    fs::create_dir(m.p("b")).unwrap();
    sync_dir(&m.mnt).unwrap();
    durable_file(&m.p("a/f"), b"f").unwrap();
    fs::rename(m.p("a/f"), m.p("b/f")).unwrap();
    sync_dir(&m.p("b")).unwrap();
    let r = m.fs.power_loss(None).unwrap();
    assert_eq!(r.namespace_ops_dropped, 0);
    assert_eq!(read(&m.p("b/f")).unwrap(), b"f");
    assert!(list(&m.p("a")).is_empty());
}

#[test]
fn unlink_without_dir_fsync_comes_back_with_its_durable_content() {
    let Some(m) = mount() else { return };
    durable_file(&m.p("f"), b"durable").unwrap();
    // an unsynced write, then the unlink: the file comes back as it was durable
    fs::write(m.p("f"), b"scribble").unwrap();
    fs::remove_file(m.p("f")).unwrap();
    assert!(read(&m.p("f")).is_none());
    let r = m.fs.power_loss(None).unwrap();
    assert_eq!(r.namespace_ops_dropped, 1);
    assert_eq!(read(&m.p("f")).unwrap(), b"durable");
    // with the dir fsync it is gone
    fs::remove_file(m.p("f")).unwrap();
    sync_dir(&m.mnt).unwrap();
    m.fs.power_loss(None).unwrap();
    assert!(read(&m.p("f")).is_none());
    assert!(list(&m.mnt).is_empty());
}

#[test]
fn mkdir_and_rmdir_need_the_parent_fsynced() {
    let Some(m) = mount() else { return };
    fs::create_dir(m.p("gone")).unwrap();
    fs::create_dir(m.p("kept")).unwrap();
    fs::create_dir(m.p("kept/sub")).unwrap();
    sync_dir(&m.p("kept")).unwrap(); // makes "sub" durable in "kept", not "kept" itself
    let r = m.fs.power_loss(None).unwrap();
    eprintln!("{r}");
    assert!(
        list(&m.mnt).is_empty(),
        "creates in the root were not durable"
    );

    fs::create_dir_all(m.p("kept/sub")).unwrap();
    sync_dir(&m.p("kept")).unwrap();
    sync_dir(&m.mnt).unwrap();
    m.fs.power_loss(None).unwrap();
    assert_eq!(list(&m.mnt), vec!["kept"]);
    assert_eq!(list(&m.p("kept")), vec!["sub"]);

    fs::remove_dir(m.p("kept/sub")).unwrap();
    m.fs.power_loss(None).unwrap();
    assert_eq!(
        list(&m.p("kept")),
        vec!["sub"],
        "rmdir without fsync reverts"
    );
    fs::remove_dir(m.p("kept/sub")).unwrap();
    sync_dir(&m.p("kept")).unwrap();
    m.fs.power_loss(None).unwrap();
    assert!(list(&m.p("kept")).is_empty());
}

#[test]
fn torn_write_keeps_exactly_a_prefix_of_the_last_write() {
    let Some(m) = mount() else { return };
    let new: Vec<u8> = (0..200u8).collect();
    for seed in 0..8u64 {
        durable_file(&m.p("f"), b"durable-").unwrap();
        let mut f = OpenOptions::new().write(true).open(m.p("f")).unwrap();
        f.seek(SeekFrom::End(0)).unwrap();
        f.write_all(b"earlier unsynced").unwrap();
        f.write_all_at(&new, 8).unwrap();
        drop(f);
        let r = m.fs.power_loss(Some(seed)).unwrap();
        let t = r.torn.clone().expect("a torn write");
        eprintln!("seed {seed}: {r}");
        assert_eq!((t.offset, t.len), (8, 200));
        assert!(t.kept > 0 && t.kept < 200, "{t:?}");
        let got = read(&m.p("f")).unwrap();
        let mut want = b"durable-".to_vec();
        want.extend_from_slice(&new[..t.kept as usize]);
        assert_eq!(got, want);
    }
}

#[test]
fn torn_write_is_deterministic_per_seed() {
    let Some(m) = mount() else { return };
    let mut kept = Vec::new();
    for _ in 0..2 {
        durable_file(&m.p("f"), b"").unwrap();
        fs::write(m.p("f"), vec![7u8; 4096]).unwrap();
        kept.push(m.fs.power_loss(Some(99)).unwrap().torn.unwrap().kept);
    }
    assert_eq!(kept[0], kept[1]);
}

#[test]
fn several_power_losses_in_a_row() {
    let Some(m) = mount() else { return };
    durable_file(&m.p("f"), b"v0").unwrap();
    for i in 1..=5u32 {
        let mut f = OpenOptions::new().write(true).open(m.p("f")).unwrap();
        f.write_all(format!("v{i}").as_bytes()).unwrap();
        if i % 2 == 0 {
            f.sync_all().unwrap();
        }
        drop(f);
        fs::write(m.p(&format!("tmp{i}")), b"t").unwrap();
        m.fs.power_loss(None).unwrap();
        let want = if i % 2 == 0 { i } else { i - 1 };
        assert_eq!(read(&m.p("f")).unwrap(), format!("v{want}").as_bytes());
        assert_eq!(list(&m.mnt), vec!["f"]);
    }
    // nothing pending: a power loss drops nothing
    let r = m.fs.power_loss(None).unwrap();
    assert_eq!((r.writes_dropped, r.namespace_ops_dropped), (0, 0));
}

#[test]
fn power_loss_refuses_while_a_file_is_open() {
    let Some(m) = mount() else { return };
    durable_file(&m.p("f"), b"x").unwrap();
    let f = File::open(m.p("f")).unwrap();
    assert!(m.fs.power_loss(None).is_err());
    drop(f);
    // the mount still works and a later power loss does
    fs::write(m.p("f"), b"y").unwrap();
    m.fs.power_loss(None).unwrap();
    assert_eq!(read(&m.p("f")).unwrap(), b"x");
}

#[test]
fn undo_cap_refuses_writes_with_enospc() {
    if File::options()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .is_err()
    {
        eprintln!("SKIPPED: cannot open /dev/fuse");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (b, mnt) = (dir.path().join("b"), dir.path().join("m"));
    fs::create_dir(&b).unwrap();
    fs::create_dir(&mnt).unwrap();
    fs::write(b.join("f"), vec![1u8; 8192]).unwrap();
    let pfs = permitd_powerfs::PowerFs::mount_with(
        &b,
        &mnt,
        permitd_powerfs::Options {
            undo_cap_bytes: 4096,
        },
    )
    .unwrap();
    let f = OpenOptions::new().write(true).open(mnt.join("f")).unwrap();
    f.write_all_at(&[2u8; 4096], 0).unwrap();
    let e = f.write_all_at(&[3u8; 4096], 4096).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(28), "ENOSPC: {e}");
    f.sync_all().unwrap(); // frees the undo log
    f.write_all_at(&[3u8; 4096], 4096).unwrap();
    drop(f);
    pfs.unmount().unwrap();
}

#[test]
fn fallocate_passes_through_and_reverts() {
    use std::os::fd::AsRawFd;
    let Some(m) = mount() else { return };
    durable_file(&m.p("f"), b"abc").unwrap();
    let f = OpenOptions::new().write(true).open(m.p("f")).unwrap();
    nix::fcntl::fallocate(f.as_raw_fd(), nix::fcntl::FallocateFlags::empty(), 0, 4096).unwrap();
    drop(f);
    assert_eq!(fs::metadata(m.p("f")).unwrap().len(), 4096);
    m.fs.power_loss(None).unwrap();
    assert_eq!(read(&m.p("f")).unwrap(), b"abc");
}
