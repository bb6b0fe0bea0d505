//! A wake-up with sub-millisecond precision for the entry schedule.
//!
//! tokio's timer wheel has 1 ms slots and rounds deadlines up, so a 1 ms
//! `roundWaitMs` took 1.5–2 ms. A dedicated thread blocking on
//! `recv_timeout` sleeps on a futex with a nanosecond timeout (an hrtimer,
//! tens of microseconds late at most) and then notifies the async side: no
//! spinning, one thread per node whatever the number of keys.

use std::collections::BTreeSet;
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

/// Most deadlines kept at once: the driver sets a handful (next entry, stall,
/// idle key); beyond this the latest is dropped, the earliest always kept.
const MAX_DEADLINES: usize = 1_024;

fn run(receiver: &mpsc::Receiver<Instant>, wake: &Notify) {
    // Every deadline set and not yet passed: a later one must still fire after
    // an earlier one did.
    let mut deadlines: BTreeSet<Instant> = BTreeSet::new();
    loop {
        let received = match deadlines.first() {
            Some(at) => receiver.recv_timeout(at.saturating_duration_since(Instant::now())),
            None => receiver.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match received {
            Ok(at) => {
                deadlines.insert(at);
                if deadlines.len() > MAX_DEADLINES {
                    deadlines.pop_last();
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                let now = Instant::now();
                while deadlines.first().is_some_and(|at| *at <= now) {
                    deadlines.pop_first();
                }
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

    #[tokio::test]
    async fn a_later_deadline_still_fires_after_an_earlier_one() {
        let wake = Arc::new(Notify::new());
        let timer = PreciseTimer::start(wake.clone());
        let later = Instant::now() + Duration::from_millis(20);
        timer.wake_at(later);
        timer.wake_at(Instant::now() + Duration::from_millis(2));
        wake.notified().await;
        let again = tokio::time::timeout(Duration::from_secs(5), wake.notified()).await;
        assert!(again.is_ok(), "the later deadline fires too");
        assert!(Instant::now() >= later, "not before it is due");
    }
}
