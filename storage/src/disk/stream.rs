//! Sequential reads and writes over a [`DiskFile`]'s positioned ones, for the
//! two places that stream a file: recovery's scan of a segment (through a
//! `BufReader`) and a snapshot encoded straight into its file (through a
//! `BufWriter`). Each keeps its own offset, as a file cursor would.

use std::io::{self, Read, Write};

use super::DiskFile;

/// Reads a file from offset 0 on.
#[derive(Debug)]
pub(crate) struct FileReader<'a> {
    file: &'a dyn DiskFile,
    offset: u64,
}

impl<'a> FileReader<'a> {
    pub(crate) fn new(file: &'a dyn DiskFile) -> Self {
        Self { file, offset: 0 }
    }
}

impl Read for FileReader<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let read = self.file.read_at(buffer, self.offset)?;
        self.offset += read as u64;
        Ok(read)
    }
}

/// Writes a file from offset 0 on, and hands it back for its sync.
#[derive(Debug)]
pub(crate) struct FileWriter {
    file: Box<dyn DiskFile>,
    offset: u64,
}

impl FileWriter {
    pub(crate) fn new(file: Box<dyn DiskFile>) -> Self {
        Self { file, offset: 0 }
    }

    pub(crate) fn into_file(self) -> Box<dyn DiskFile> {
        self.file
    }
}

impl Write for FileWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.file.write_all_at(bytes, self.offset)?;
        self.offset += bytes.len() as u64;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufReader, BufWriter};

    use super::*;
    use crate::disk::{Disk, OpenMode, OsDisk};

    #[test]
    fn what_a_writer_streams_a_reader_streams_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let bytes: Vec<u8> = (0..100_000u32).map(|n| n as u8).collect();
        let file = OsDisk.open(&path, OpenMode::CreateOrTruncate).unwrap();
        let mut writer = BufWriter::with_capacity(1000, FileWriter::new(file));
        for chunk in bytes.chunks(777) {
            writer.write_all(chunk).unwrap();
        }
        let file = writer.into_inner().unwrap().into_file();
        assert_eq!(file.len().unwrap(), bytes.len() as u64);
        let file = OsDisk.open(&path, OpenMode::Existing).unwrap();
        let mut back = Vec::new();
        BufReader::with_capacity(333, FileReader::new(&*file))
            .read_to_end(&mut back)
            .unwrap();
        assert_eq!(back, bytes);
    }
}
