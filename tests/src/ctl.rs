//! Running the real `permitctl` binary against a test [`Cluster`].

use std::process::{Command, Output};

use crate::{permitctl_bin, Cluster, SECRET};

/// What one `permitctl` run printed.
#[derive(Debug)]
pub struct CtlRun {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl CtlRun {
    /// The JSON `--json` printed; panics with the output when it is not JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|error| panic!("permitctl printed no JSON ({error}): {self:?}"))
    }
}

impl From<Output> for CtlRun {
    fn from(output: Output) -> Self {
        Self {
            success: output.status.success(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl Cluster {
    /// Runs `permitctl ARGS` against every node of the cluster, with its secret.
    /// Blocking: call it from `spawn_blocking` or accept the short stall.
    pub fn permitctl(&self, args: &[&str]) -> CtlRun {
        let endpoints: Vec<String> = self
            .nodes
            .iter()
            .filter(|node| node.is_running())
            .map(|node| node.url())
            .collect();
        let output = Command::new(permitctl_bin())
            .arg("--endpoints")
            .arg(endpoints.join(","))
            .args(["--secret", SECRET])
            .args(args)
            .output()
            .expect("permitctl runs");
        CtlRun::from(output)
    }
}
