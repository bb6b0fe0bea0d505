//! Graceful shutdown: wait for Ctrl+C or SIGTERM, then stop in an order that
//! loses nothing acknowledged: stop accepting, fail the waiting requests (their
//! clients retry elsewhere), let in-flight answers drain, shut Raft down (which
//! stops the storage tasks). Nothing is left to flush: every acknowledged entry
//! is in the fsynced log.

use tokio::sync::watch;

/// Resolves on the first Ctrl+C or SIGTERM.
pub async fn signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for Ctrl+C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut stream) => {
                stream.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("Ctrl+C received"),
        () = terminate => tracing::info!("SIGTERM received"),
    }
}

/// A one-shot stop flag that many listeners wait on.
#[derive(Debug, Clone)]
pub struct Shutdown {
    sender: watch::Sender<bool>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self {
            sender: watch::channel(false).0,
        }
    }
}

impl Shutdown {
    pub fn trigger(&self) {
        self.sender.send_replace(true);
    }

    /// Resolves once [`Shutdown::trigger`] was called.
    pub async fn wait(&self) {
        let mut receiver = self.sender.subscribe();
        // Fails only if the sender is gone, and we hold it.
        let _ = receiver.wait_for(|stopped| *stopped).await;
    }
}
