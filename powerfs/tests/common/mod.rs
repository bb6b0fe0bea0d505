//! Shared by the powerfs tests: a mount in a temp dir, skipped (with a message) where
//! /dev/fuse cannot be opened.

#![allow(dead_code)]

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use permitd_powerfs::PowerFs;

/// A mounted powerfs over a temp backing dir. Field order: the mount goes first.
pub struct Mounted {
    pub fs: PowerFs,
    pub backing: PathBuf,
    pub mnt: PathBuf,
    _dir: tempfile::TempDir,
}

impl Mounted {
    /// Path of `rel` in the mount.
    pub fn p(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }
}

/// Mount, or None (after saying why) where FUSE is not available.
pub fn mount() -> Option<Mounted> {
    if let Err(e) = File::options().read(true).write(true).open("/dev/fuse") {
        eprintln!("SKIPPED: cannot open /dev/fuse ({e}): powerfs tests need FUSE");
        return None;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let backing = dir.path().join("backing");
    let mnt = dir.path().join("mnt");
    fs::create_dir(&backing).expect("mkdir backing");
    fs::create_dir(&mnt).expect("mkdir mnt");
    let fs = PowerFs::mount(&backing, &mnt).expect("mount powerfs");
    Some(Mounted {
        fs,
        backing,
        mnt,
        _dir: dir,
    })
}

/// fsync a directory (FUSE_FSYNCDIR).
pub fn sync_dir(p: &Path) -> io::Result<()> {
    File::open(p)?.sync_all()
}

/// Create `p` with `data`, fsync it and its directory: durable.
pub fn durable_file(p: &Path, data: &[u8]) -> io::Result<()> {
    let mut f = File::create(p)?;
    f.write_all(data)?;
    f.sync_all()?;
    sync_dir(p.parent().expect("parent"))
}

/// Read `p`, None if it does not exist.
pub fn read(p: &Path) -> Option<Vec<u8>> {
    match fs::read(p) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => panic!("read {}: {e}", p.display()),
    }
}

/// Names in dir `p`, sorted.
pub fn list(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(p)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}
