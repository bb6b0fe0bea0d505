//! Secrets in memory and on disk: a redacting wrapper, the OS random source,
//! files only their owner can read.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

/// A secret string (peer secret, admin token). `Debug` and `Display` never show it;
/// [`Secret::expose`] is the one way to the text, so every use is greppable.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(Arc<str>);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<&str> for Secret {
    fn from(text: &str) -> Self {
        Self(text.into())
    }
}

impl From<String> for Secret {
    fn from(text: String) -> Self {
        Self(text.into())
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// `bytes` random bytes from the operating system, as lowercase hex.
pub fn random_hex(bytes: usize) -> Result<String, getrandom::Error> {
    let mut buffer = vec![0u8; bytes];
    getrandom::fill(&mut buffer)?;
    Ok(to_hex(&buffer))
}

/// Lowercase hex, as the registry stores hashes.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Writes `contents` to a new file at `path` that only its owner may read or
/// write (mode 0600 from its creation: there is no moment it is readable),
/// durably: the file, then the folder that names it, so a power cut cannot
/// leave a cluster whose admin token was printed but never stored.
pub fn write_private_file(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()?;
    permitd_storage::fsync::fsync_parent(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_and_random() {
        let secret = Secret::from("hunter2-hunter2-hunter2");
        assert_eq!(format!("{secret:?}"), "Secret(<redacted>)");
        let a = random_hex(32).unwrap();
        assert_eq!(a.len(), 64);
        assert_ne!(a, random_hex(32).unwrap());
    }

    #[test]
    fn private_files_are_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        write_private_file(&path, "x").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(write_private_file(&path, "y").is_err(), "never overwrites");
    }
}
