//! The `permitd` node binary.
//!
//! Not built yet: the issue "node: a three-node permitd cluster serving the v1 API"
//! fills this crate in. Until then the binary says so and exits with an error.

fn main() -> std::process::ExitCode {
    eprintln!(
        "permitd {}: the node is not built yet",
        env!("CARGO_PKG_VERSION")
    );
    std::process::ExitCode::FAILURE
}
