//! `permitctl snapshot save FILE`: a consistent backup of the cluster's state,
//! taken by the leader after confirming its leadership. Restore it into a new
//! cluster with `permitd restore --from FILE`.

use std::path::{Path, PathBuf};

use clap::Subcommand;
use permitd_client::SemaphoreClient;

use super::{print, CliResult};

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Saves the leader's applied state to FILE (needs the admin `--token`).
    Save { file: PathBuf },
}

pub async fn run(client: &SemaphoreClient, json: bool, command: SnapshotCommand) -> CliResult {
    let SnapshotCommand::Save { file } = command;
    let backup = client.save_backup().await?;
    let bytes = serde_json::to_vec(&backup)?;
    write_atomically(&file, &bytes)?;
    let summary = serde_json::json!({
        "file": file.display().to_string(),
        "keys": backup.state.keys.len(),
        "appliedIndex": backup.applied_index,
        "bytes": bytes.len(),
    });
    print(json, &summary, || {
        format!(
            "saved {} keys (log index {}) to {}, {} bytes\n",
            backup.state.keys.len(),
            backup.applied_index,
            file.display(),
            bytes.len()
        )
    })
}

/// Writes beside the target and renames, so a crash never leaves half a backup
/// under the final name; then fsyncs the folder that names it, so a backup
/// reported saved is still there after a power cut (a relative name's folder
/// is the working directory).
fn write_atomically(file: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use permitd_client::queue::journal::{fsync_dir, parent_dir};
    let mut partial = file.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    std::fs::write(&partial, bytes)?;
    std::fs::File::open(&partial)?.sync_all()?;
    std::fs::rename(&partial, file)?;
    fsync_dir(parent_dir(file))
}
