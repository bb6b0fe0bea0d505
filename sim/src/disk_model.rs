//! One simulated node's disk: files and directories in memory, with what a
//! power cut keeps and what it loses.
//!
//! The rules are those of `powerfs` (powerfs/src/lib.rs), which the process
//! tests use on a real mount:
//! - **Data.** A write or truncate is not durable until its file is synced
//!   (`sync_data` or `sync_all`). A power cut undoes every unsynced change,
//!   except that with a torn cut one file's newest unsynced write keeps a
//!   prefix of random length.
//! - **Names.** A create, rename or unlink is durable only once its directory
//!   is synced. A cut restores every directory to what its last sync saw; a
//!   file or directory no durable name reaches is gone, data and all.
//!
//! Faults the simulator switches on: a full disk (`ENOSPC` on writes that
//! grow a file), failing syncs (`EIO`, which a node must treat as fatal).
//!
//! The model is deterministic: maps are ordered, and the only randomness (the
//! torn prefix) comes from the caller's seeded draw.

use std::collections::BTreeMap;
use std::io;
use std::path::{Component, Path, PathBuf};

/// A file's identity: names in directories point at it.
pub type Inode = u64;

/// What a name in a directory points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    File(Inode),
    Dir,
}

#[derive(Debug, Default, Clone)]
struct FileState {
    /// What reads see.
    current: Vec<u8>,
    /// What a power cut leaves, as of the last sync.
    durable: Vec<u8>,
    /// Unsynced writes since the last sync, oldest first (offset, length).
    unsynced_writes: Vec<(u64, usize)>,
    /// The span of `current` changed since the last sync (writes, and bytes
    /// a size change added): a sync copies only it, not the whole file. The
    /// log appends, so this is the tail written since the last group commit.
    dirty: Option<(usize, usize)>,
}

impl FileState {
    /// `start..end` of `current` now differs from `durable`.
    fn mark_dirty(&mut self, start: usize, end: usize) {
        let (lo, hi) = self.dirty.unwrap_or((start, end));
        self.dirty = Some((lo.min(start), hi.max(end)));
    }
}

#[derive(Debug, Default, Clone)]
struct DirState {
    current: BTreeMap<String, Entry>,
    durable: BTreeMap<String, Entry>,
}

/// Faults the simulator may switch on.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DiskFaults {
    /// Writes that grow a file fail with `ENOSPC`.
    pub full: bool,
    /// Syncs (file and directory) fail with `EIO`.
    pub failing_sync: bool,
    /// Extra time each sync of the log takes (a slow or busy disk).
    pub slow_sync: std::time::Duration,
}

/// What a power cut did, for the trace.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CutReport {
    pub files_rolled_back: usize,
    pub names_rolled_back: usize,
    pub torn: Option<(PathBuf, usize)>,
}

/// One node's disk.
#[derive(Debug, Default, Clone)]
pub struct DiskModel {
    files: BTreeMap<Inode, FileState>,
    /// Directories by absolute path; `/` always exists.
    dirs: BTreeMap<PathBuf, DirState>,
    next_inode: Inode,
    pub faults: DiskFaults,
    /// Counts for the trace and the report.
    pub syncs: u64,
}

fn error(kind: io::ErrorKind, what: &str, path: &Path) -> io::Error {
    io::Error::new(kind, format!("{what}: {}", path.display()))
}

/// `path` made absolute and free of `.` and `..` (relative paths are taken
/// from `/`: a simulated node's working directory is the root).
pub fn normalize(path: &Path) -> PathBuf {
    let mut parts: Vec<String> = Vec::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
            Component::ParentDir => {
                parts.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    let mut normal = PathBuf::from("/");
    normal.extend(parts);
    normal
}

fn split(path: &Path) -> io::Result<(PathBuf, String)> {
    let path = normalize(path);
    let name = path
        .file_name()
        .ok_or_else(|| error(io::ErrorKind::InvalidInput, "no file name", &path))?
        .to_string_lossy()
        .into_owned();
    let parent = path
        .parent()
        .map_or_else(|| PathBuf::from("/"), Path::to_owned);
    Ok((parent, name))
}

impl DiskModel {
    pub fn new() -> Self {
        let mut model = Self::default();
        model.dirs.insert(PathBuf::from("/"), DirState::default());
        model
    }

    fn dir(&self, path: &Path) -> io::Result<&DirState> {
        self.dirs
            .get(path)
            .ok_or_else(|| error(io::ErrorKind::NotFound, "no such directory", path))
    }

    fn dir_mut(&mut self, path: &Path) -> io::Result<&mut DirState> {
        self.dirs
            .get_mut(path)
            .ok_or_else(|| error(io::ErrorKind::NotFound, "no such directory", path))
    }

    /// What `path` names now.
    pub fn lookup(&self, path: &Path) -> Option<Entry> {
        let path = normalize(path);
        if path == Path::new("/") {
            return Some(Entry::Dir);
        }
        let (parent, name) = split(&path).ok()?;
        self.dirs.get(&parent)?.current.get(&name).copied()
    }

    /// Opens `path`, creating it when asked; `exclusive`: it must not exist.
    pub fn open(&mut self, path: &Path, create: bool, exclusive: bool) -> io::Result<Inode> {
        let (parent, name) = split(path)?;
        match self.dir(&parent)?.current.get(&name) {
            Some(Entry::File(inode)) if !exclusive => Ok(*inode),
            Some(_) if exclusive => Err(error(io::ErrorKind::AlreadyExists, "exists", path)),
            Some(Entry::Dir) => Err(error(io::ErrorKind::IsADirectory, "a directory", path)),
            Some(Entry::File(_)) => unreachable!("handled above"),
            None if !create => Err(error(io::ErrorKind::NotFound, "no such file", path)),
            None => {
                self.next_inode += 1;
                let inode = self.next_inode;
                self.files.insert(inode, FileState::default());
                self.dir_mut(&parent)?
                    .current
                    .insert(name, Entry::File(inode));
                Ok(inode)
            }
        }
    }

    fn file(&self, inode: Inode) -> io::Result<&FileState> {
        self.files
            .get(&inode)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "stale file handle"))
    }

    fn file_mut(&mut self, inode: Inode) -> io::Result<&mut FileState> {
        self.files
            .get_mut(&inode)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "stale file handle"))
    }

    pub fn len(&self, inode: Inode) -> io::Result<u64> {
        Ok(self.file(inode)?.current.len() as u64)
    }

    /// Reads at `offset`; short at the end of the file.
    pub fn read_at(&self, inode: Inode, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let data = &self.file(inode)?.current;
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(data.len());
        let n = buf.len().min(data.len() - start);
        buf[..n].copy_from_slice(&data[start..start + n]);
        Ok(n)
    }

    pub fn write_at(&mut self, inode: Inode, bytes: &[u8], offset: u64) -> io::Result<()> {
        let full = self.faults.full;
        let file = self.file_mut(inode)?;
        let offset = usize::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset"))?;
        let end = offset + bytes.len();
        let old_len = file.current.len();
        if end > old_len {
            if full {
                return Err(io::Error::from_raw_os_error(28)); // ENOSPC
            }
            file.current.resize(end, 0);
        }
        file.current[offset..end].copy_from_slice(bytes);
        file.mark_dirty(offset.min(old_len), end);
        file.unsynced_writes.push((offset as u64, bytes.len()));
        Ok(())
    }

    pub fn set_len(&mut self, inode: Inode, len: u64) -> io::Result<()> {
        let full = self.faults.full;
        let file = self.file_mut(inode)?;
        let len = usize::try_from(len).map_err(|_| io::Error::from_raw_os_error(27))?;
        if len > file.current.len() && full {
            return Err(io::Error::from_raw_os_error(28));
        }
        if len > file.current.len() {
            let old_len = file.current.len();
            file.mark_dirty(old_len, len);
        }
        file.current.resize(len, 0);
        // A size change is not a write a cut could tear.
        file.unsynced_writes.clear();
        file.unsynced_writes.push((len as u64, 0));
        Ok(())
    }

    /// `fdatasync`/`fsync` of one file: its data is durable.
    pub fn sync_file(&mut self, inode: Inode) -> io::Result<()> {
        if self.faults.failing_sync {
            return Err(io::Error::from_raw_os_error(5)); // EIO
        }
        self.syncs += 1;
        let file = self.file_mut(inode)?;
        // Bytes past the durable length were all added since the last sync,
        // so they lie in the dirty span too.
        file.durable.resize(file.current.len(), 0);
        if let Some((start, end)) = file.dirty.take() {
            let end = end.min(file.current.len());
            if start < end {
                file.durable[start..end].copy_from_slice(&file.current[start..end]);
            }
        }
        file.unsynced_writes.clear();
        Ok(())
    }

    /// `fsync` of a directory: its names are durable.
    pub fn sync_dir(&mut self, path: &Path) -> io::Result<()> {
        if self.faults.failing_sync {
            return Err(io::Error::from_raw_os_error(5));
        }
        self.syncs += 1;
        let dir = self.dir_mut(&normalize(path))?;
        dir.durable.clone_from(&dir.current);
        Ok(())
    }

    pub fn create_dir(&mut self, path: &Path) -> io::Result<()> {
        let (parent, name) = split(path)?;
        if self.dir(&parent)?.current.contains_key(&name) {
            return Err(error(io::ErrorKind::AlreadyExists, "exists", path));
        }
        self.dir_mut(&parent)?.current.insert(name, Entry::Dir);
        self.dirs.insert(normalize(path), DirState::default());
        Ok(())
    }

    /// The names in a directory, sorted.
    pub fn list(&self, path: &Path) -> io::Result<Vec<(String, Entry)>> {
        let dir = self.dir(&normalize(path))?;
        Ok(dir
            .current
            .iter()
            .map(|(name, entry)| (name.clone(), *entry))
            .collect())
    }

    pub fn rename(&mut self, from: &Path, to: &Path) -> io::Result<()> {
        let (from_parent, from_name) = split(from)?;
        let (to_parent, to_name) = split(to)?;
        let entry = self
            .dir_mut(&from_parent)?
            .current
            .remove(&from_name)
            .ok_or_else(|| error(io::ErrorKind::NotFound, "no such file", from))?;
        if let Entry::Dir = entry {
            // Moving a directory moves its subtree of paths.
            let (old, new) = (normalize(from), normalize(to));
            let moved: Vec<PathBuf> = self
                .dirs
                .keys()
                .filter(|dir| dir.starts_with(&old))
                .cloned()
                .collect();
            for dir in moved {
                let state = self.dirs.remove(&dir).expect("listed");
                let suffix = dir.strip_prefix(&old).expect("under it").to_owned();
                self.dirs.insert(new.join(suffix), state);
            }
        }
        self.dir_mut(&to_parent)?.current.insert(to_name, entry);
        Ok(())
    }

    pub fn remove_file(&mut self, path: &Path) -> io::Result<()> {
        let (parent, name) = split(path)?;
        match self.dir_mut(&parent)?.current.remove(&name) {
            Some(Entry::File(_)) => Ok(()),
            Some(entry) => {
                self.dir_mut(&parent)?.current.insert(name, entry);
                Err(error(io::ErrorKind::IsADirectory, "a directory", path))
            }
            None => Err(error(io::ErrorKind::NotFound, "no such file", path)),
        }
    }

    /// A power cut: every unsynced change is undone. `torn` (a draw in
    /// `0..u64::MAX`) lets one file keep a prefix of its newest unsynced write.
    pub fn power_cut(&mut self, torn: Option<u64>) -> CutReport {
        let mut report = CutReport::default();
        let torn_file = torn.and_then(|draw| self.pick_torn(draw));
        for (inode, file) in &mut self.files {
            if file.current != file.durable {
                report.files_rolled_back += 1;
            }
            let mut kept = file.durable.clone();
            if let Some((torn_inode, keep)) = torn_file {
                if torn_inode == *inode {
                    let (offset, _) = *file.unsynced_writes.last().expect("picked one");
                    let offset = offset as usize;
                    let end = offset + keep;
                    if kept.len() < end {
                        kept.resize(end, 0);
                    }
                    kept[offset..end].copy_from_slice(&file.current[offset..end]);
                }
            }
            file.current.clone_from(&kept);
            file.durable = kept;
            file.unsynced_writes.clear();
            file.dirty = None;
        }
        for dir in self.dirs.values_mut() {
            if dir.current != dir.durable {
                report.names_rolled_back += 1;
            }
            dir.current.clone_from(&dir.durable);
        }
        self.collect_unreachable();
        report.torn = torn_file.map(|(inode, keep)| (self.path_of(inode), keep));
        report
    }

    /// The file whose newest unsynced write a torn cut keeps part of, and how
    /// many of its bytes: among files whose newest change is a write of 2+ bytes.
    fn pick_torn(&self, draw: u64) -> Option<(Inode, usize)> {
        let candidates: Vec<(Inode, usize)> = self
            .files
            .iter()
            .filter_map(|(inode, file)| {
                let (_, len) = *file.unsynced_writes.last()?;
                (len >= 2).then_some((*inode, len))
            })
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let (inode, len) = candidates[(draw % candidates.len() as u64) as usize];
        let keep = 1 + ((draw >> 16) % (len as u64 - 1)) as usize;
        Some((inode, keep))
    }

    /// Drops directories and files no durable name reaches from `/`.
    fn collect_unreachable(&mut self) {
        let mut reachable_dirs = vec![PathBuf::from("/")];
        let mut reachable_files = std::collections::BTreeSet::new();
        let mut index = 0;
        while index < reachable_dirs.len() {
            let path = reachable_dirs[index].clone();
            if let Some(dir) = self.dirs.get(&path) {
                for (name, entry) in &dir.current {
                    match entry {
                        Entry::Dir => reachable_dirs.push(path.join(name)),
                        Entry::File(inode) => {
                            reachable_files.insert(*inode);
                        }
                    }
                }
            }
            index += 1;
        }
        self.dirs.retain(|path, _| reachable_dirs.contains(path));
        self.files
            .retain(|inode, _| reachable_files.contains(inode));
    }

    /// A name of `inode`, for reports.
    fn path_of(&self, inode: Inode) -> PathBuf {
        for (dir, state) in &self.dirs {
            for (name, entry) in &state.current {
                if *entry == Entry::File(inode) {
                    return dir.join(name);
                }
            }
        }
        PathBuf::from("<unnamed>")
    }

    /// Bytes held (current view), for the trace.
    pub fn bytes(&self) -> u64 {
        self.files
            .values()
            .map(|file| file.current.len() as u64)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(path: &str) -> PathBuf {
        PathBuf::from(path)
    }

    #[test]
    fn an_unsynced_write_is_lost_and_a_synced_one_kept() {
        let mut disk = DiskModel::new();
        let file = disk.open(&p("/a"), true, true).unwrap();
        disk.sync_dir(&p("/")).unwrap();
        disk.write_at(file, b"kept", 0).unwrap();
        disk.sync_file(file).unwrap();
        disk.write_at(file, b"lost", 4).unwrap();
        disk.power_cut(None);
        let mut buf = [0; 16];
        let n = disk.read_at(file, &mut buf, 0).unwrap();
        assert_eq!(&buf[..n], b"kept");
    }

    #[test]
    fn a_create_whose_directory_was_not_synced_is_gone_with_its_data() {
        let mut disk = DiskModel::new();
        disk.create_dir(&p("/data")).unwrap();
        let file = disk.open(&p("/data/x"), true, true).unwrap();
        disk.write_at(file, b"synced data", 0).unwrap();
        disk.sync_file(file).unwrap();
        disk.power_cut(None);
        assert_eq!(
            disk.lookup(&p("/data")),
            None,
            "the dir's own name was never synced"
        );
        assert!(disk.read_at(file, &mut [0; 4], 0).is_err());
    }

    /// A sync copies only the span changed since the last one: against a
    /// reference that keeps a whole copy at each sync, through random
    /// writes, size changes, syncs and cuts, a cut always leaves exactly the
    /// last synced bytes.
    #[test]
    fn a_sync_of_the_changed_span_keeps_what_a_whole_copy_would() {
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};
        let mut rng = StdRng::seed_from_u64(34);
        let mut disk = DiskModel::new();
        let file = disk.open(&p("/wal"), true, true).unwrap();
        disk.sync_dir(&p("/")).unwrap();
        let mut synced: Vec<u8> = Vec::new();
        for _ in 0..5_000 {
            let len = disk.len(file).unwrap() as usize;
            match rng.random_range(0..10) {
                0..=4 => {
                    let offset = rng.random_range(0..=len + 8);
                    let bytes: Vec<u8> =
                        (0..rng.random_range(1..32)).map(|_| rng.random()).collect();
                    disk.write_at(file, &bytes, offset as u64).unwrap();
                }
                5 => disk
                    .set_len(file, rng.random_range(0..=len + 16) as u64)
                    .unwrap(),
                6..=8 => {
                    disk.sync_file(file).unwrap();
                    synced = read_all(&disk, file);
                }
                _ => {
                    disk.power_cut(None);
                    assert_eq!(read_all(&disk, file), synced);
                }
            }
        }
    }

    fn read_all(disk: &DiskModel, file: Inode) -> Vec<u8> {
        let mut buf = vec![0; disk.len(file).unwrap() as usize];
        let n = disk.read_at(file, &mut buf, 0).unwrap();
        assert_eq!(n, buf.len());
        buf
    }

    #[test]
    fn a_rename_is_durable_once_its_directory_is_synced() {
        let mut disk = DiskModel::new();
        let file = disk.open(&p("/tmp.snap"), true, true).unwrap();
        disk.write_at(file, b"snap", 0).unwrap();
        disk.sync_file(file).unwrap();
        disk.sync_dir(&p("/")).unwrap();
        disk.rename(&p("/tmp.snap"), &p("/1.snap")).unwrap();
        disk.power_cut(None);
        assert_eq!(disk.lookup(&p("/tmp.snap")), Some(Entry::File(file)));
        disk.rename(&p("/tmp.snap"), &p("/1.snap")).unwrap();
        disk.sync_dir(&p("/")).unwrap();
        disk.power_cut(None);
        assert_eq!(disk.lookup(&p("/1.snap")), Some(Entry::File(file)));
        assert_eq!(disk.lookup(&p("/tmp.snap")), None);
    }

    #[test]
    fn a_torn_cut_keeps_a_strict_prefix_of_the_newest_write() {
        for draw in 0..50u64 {
            let mut disk = DiskModel::new();
            let file = disk.open(&p("/wal"), true, true).unwrap();
            disk.sync_dir(&p("/")).unwrap();
            disk.write_at(file, b"old", 0).unwrap();
            disk.sync_file(file).unwrap();
            disk.write_at(file, b"abcdefgh", 3).unwrap();
            let report = disk.power_cut(Some(draw.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
            let (_, keep) = report.torn.expect("torn");
            assert!((1..8).contains(&keep));
            let mut buf = [0; 32];
            let n = disk.read_at(file, &mut buf, 0).unwrap();
            assert_eq!(&buf[..n], &b"oldabcdefgh"[..3 + keep]);
        }
    }

    #[test]
    fn a_full_disk_refuses_growth_and_a_failing_sync_says_eio() {
        let mut disk = DiskModel::new();
        let file = disk.open(&p("/f"), true, true).unwrap();
        disk.write_at(file, b"1234", 0).unwrap();
        disk.faults.full = true;
        assert_eq!(
            disk.write_at(file, b"5", 4).unwrap_err().raw_os_error(),
            Some(28)
        );
        disk.write_at(file, b"x", 0)
            .expect("an overwrite needs no space");
        disk.faults.failing_sync = true;
        assert_eq!(disk.sync_file(file).unwrap_err().raw_os_error(), Some(5));
    }
}
