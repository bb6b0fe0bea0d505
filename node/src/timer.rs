//! A wake-up with sub-millisecond precision for the entry schedule.
//!
//! tokio's timer wheel has 1 ms slots and rounds deadlines up, so a 1 ms
//! `roundWaitMs` took 1.5–2 ms. A dedicated thread blocking on
//! `recv_timeout` sleeps on a futex with a nanosecond timeout (an hrtimer,
//! tens of microseconds late at most) and then notifies the async side: no
//! spinning, one thread per node whatever the number of keys.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::Notify;

/// The sending side; dropping it ends the thread.
#[derive(Debug)]
pub struct PreciseTimer {
    deadlines: mpsc::Sender<Instant>,
}

impl PreciseTimer {
    /// Starts the thread; it calls `wake.notify_one()` at each deadline.
    pub fn start(wake: Arc<Notify>) -> Self {
        let (deadlines, receiver) = mpsc::channel();
        std::thread::Builder::new()
            .name("permitd-timer".into())
            .spawn(move || run(&receiver, &wake))
            .expect("the timer thread starts");
        Self { deadlines }
    }

    /// Wakes the notified side at `deadline` (at once if it has passed). Of
    /// several deadlines set, the earliest fires first; later ones fire after.
    pub fn wake_at(&self, deadline: Instant) {
        // Fails only once the thread is gone, i.e. never while we hold the sender.
        let _ = self.deadlines.send(deadline);
    }
}

fn run(receiver: &mpsc::Receiver<Instant>, wake: &Notify) {
    let mut next: Option<Instant> = None;
    loop {
        let received = match next {
            Some(at) => receiver.recv_timeout(at.saturating_duration_since(Instant::now())),
            None => receiver.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match received {
            Ok(at) => next = Some(next.map_or(at, |known| known.min(at))),
            Err(RecvTimeoutError::Timeout) => {
                next = None;
                wake.notify_one();
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn wakes_at_each_deadline_never_early() {
        let wake = Arc::new(Notify::new());
        let timer = PreciseTimer::start(wake.clone());
        let mut late = Vec::new();
        for _ in 0..20 {
            let deadline = Instant::now() + Duration::from_millis(1);
            timer.wake_at(deadline);
            wake.notified().await;
            let now = Instant::now();
            assert!(now >= deadline, "never early");
            late.push(now - deadline);
        }
        late.sort();
        // Lateness is measured by the bench, not asserted here.
        eprintln!("median lateness {:?}", late[10]);
    }
}
