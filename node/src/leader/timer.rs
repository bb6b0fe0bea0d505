//! A wake-up with sub-millisecond precision for the entry schedule.
//!
//! tokio's timer wheel has 1 ms slots and rounds deadlines up, so a 1 ms
//! `roundWaitMs` took 1.5–2 ms. A Linux timerfd is an hrtimer (tens of
//! microseconds late at most) whose expiry the runtime's own epoll reports, so
//! the driver's thread wakes for it directly. (It used to be a thread of its
//! own, sleeping on a futex and then notifying the driver: a thread wake-up and
//! a context switch per deadline, ~4.5 % of the leader's CPU in the contended
//! bench rows.)

use std::io;
use std::os::fd::OwnedFd;
use std::time::Duration;

use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    Timespec,
};
use tokio::io::unix::AsyncFd;
use tokio::time::Instant;

/// One deadline at a time: waiting for another replaces it.
#[derive(Debug)]
pub struct PreciseTimer {
    /// `None` where no timerfd could be made or used: tokio's timer (1 ms
    /// slots) stands in.
    fd: Option<AsyncFd<OwnedFd>>,
    /// The deadline the timerfd is set for and not yet seen to fire.
    armed: Option<Instant>,
}

impl PreciseTimer {
    /// A timer on the monotonic clock (the one `Instant` reads), registered
    /// with the current runtime.
    /// With `precise` false, tokio's timer serves (the simulator's: its paused
    /// clock is invisible to a timerfd).
    pub fn register(precise: bool) -> Self {
        if !precise {
            return Self {
                fd: None,
                armed: None,
            };
        }
        let fd = timerfd().inspect_err(|error| {
            tracing::error!(%error, "no timerfd: round deadlines fall back to tokio's 1 ms timer");
        });
        Self {
            fd: fd.ok(),
            armed: None,
        }
    }

    /// Returns once `deadline` has passed, never before. Cancel-safe: a
    /// dropped wait leaves the timerfd set, and waiting again for the same
    /// deadline does not set it again.
    pub async fn wait_until(&mut self, deadline: Instant) {
        if self.fd.is_some() {
            match self.wait_on_timerfd(deadline).await {
                Ok(()) => return,
                Err(error) => {
                    tracing::error!(%error, "the round timer failed: tokio's 1 ms timer stands in");
                    self.fd = None;
                }
            }
        }
        tokio::time::sleep_until(deadline).await;
    }

    async fn wait_on_timerfd(&mut self, deadline: Instant) -> io::Result<()> {
        let Some(fd) = &self.fd else {
            return Ok(());
        };
        if self.armed != Some(deadline) {
            // A zero value disarms a timerfd: a passed deadline fires in 1 ns.
            let after = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_nanos(1));
            let spec = Itimerspec {
                it_interval: timespec(Duration::ZERO),
                it_value: timespec(after),
            };
            timerfd_settime(fd.get_ref(), TimerfdTimerFlags::empty(), &spec)?;
            self.armed = Some(deadline);
        }
        loop {
            let mut ready = fd.readable().await?;
            let mut expirations = [0u8; 8];
            match ready.try_io(|fd| Ok(rustix::io::read(fd.get_ref(), &mut expirations)?)) {
                Ok(read) => {
                    read?;
                    self.armed = None;
                    return Ok(());
                }
                // Readiness was stale (the timer was set again meanwhile).
                Err(_would_block) => continue,
            }
        }
    }
}

/// A non-blocking timerfd registered with the current runtime.
fn timerfd() -> io::Result<AsyncFd<OwnedFd>> {
    let flags = TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC;
    let fd = timerfd_create(TimerfdClockId::Monotonic, flags)?;
    // tokio deprecates its safe constructor because a registered `T` could
    // close or swap its fd behind the reactor's back; an `OwnedFd` kept
    // private here never is (nothing takes it out or replaces it), and the
    // workspace forbids the `unsafe` of `AsyncFd::register`.
    #[allow(deprecated)]
    AsyncFd::new(fd)
}

fn timespec(duration: Duration) -> Timespec {
    Timespec {
        tv_sec: duration.as_secs() as i64,
        tv_nsec: i64::from(duration.subsec_nanos()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fires_at_each_deadline_never_early() {
        let mut timer = PreciseTimer::register(true);
        assert!(timer.fd.is_some(), "a timerfd, not the fallback");
        let mut late = Vec::new();
        for _ in 0..20 {
            let deadline = Instant::now() + Duration::from_millis(1);
            timer.wait_until(deadline).await;
            let now = Instant::now();
            assert!(now >= deadline, "never early");
            assert_eq!(timer.armed, None);
            late.push(now - deadline);
        }
        late.sort();
        // Lateness is measured by the bench, not asserted here.
        eprintln!("median lateness {:?}", late[10]);
    }

    #[tokio::test]
    async fn a_new_deadline_replaces_the_one_set_before() {
        let mut timer = PreciseTimer::register(true);
        let far = Instant::now() + Duration::from_secs(3600);
        let abandoned = tokio::time::timeout(Duration::from_millis(5), timer.wait_until(far)).await;
        assert!(abandoned.is_err(), "not due for an hour");
        assert_eq!(timer.armed, Some(far), "a dropped wait leaves it set");
        let sooner = Instant::now() + Duration::from_millis(2);
        let fired = tokio::time::timeout(Duration::from_secs(5), timer.wait_until(sooner)).await;
        assert!(fired.is_ok(), "the later setting counts");
        assert!(Instant::now() >= sooner, "not before it is due");
    }

    #[tokio::test]
    async fn a_passed_deadline_fires_at_once() {
        let mut timer = PreciseTimer::register(true);
        let passed = Instant::now() - Duration::from_millis(5);
        let fired = tokio::time::timeout(Duration::from_secs(5), timer.wait_until(passed)).await;
        assert!(fired.is_ok(), "a zero value would have disarmed it");
        assert!(timer.fd.is_some(), "no fallback was needed");
    }
}
