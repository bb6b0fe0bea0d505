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
use std::time::{Duration, Instant};

use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    Timespec,
};
use tokio::io::unix::AsyncFd;

/// One deadline at a time: setting another replaces it.
#[derive(Debug)]
pub struct PreciseTimer {
    fd: AsyncFd<OwnedFd>,
    /// The deadline set and not yet seen to fire.
    armed: Option<Instant>,
}

impl PreciseTimer {
    /// A disarmed timer on the monotonic clock (the one `Instant` reads),
    /// registered with the current runtime.
    pub fn new() -> io::Result<Self> {
        let flags = TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC;
        let fd = timerfd_create(TimerfdClockId::Monotonic, flags)?;
        // tokio deprecates its safe constructor because a registered `T` could
        // close or swap its fd behind the reactor's back; an `OwnedFd` kept
        // private here never is (nothing takes it out or replaces it), and the
        // workspace forbids the `unsafe` of `AsyncFd::register`.
        #[allow(deprecated)]
        let fd = AsyncFd::new(fd)?;
        Ok(Self { fd, armed: None })
    }

    /// The deadline set and not yet seen to fire.
    pub fn armed(&self) -> Option<Instant> {
        self.armed
    }

    /// Fires at `deadline`, at once if it has passed, in place of any deadline
    /// set before.
    pub fn set(&mut self, deadline: Instant) -> io::Result<()> {
        // A zero value disarms a timerfd: a passed deadline fires in 1 ns.
        let after = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_nanos(1));
        let spec = Itimerspec {
            it_interval: timespec(Duration::ZERO),
            it_value: timespec(after),
        };
        timerfd_settime(self.fd.get_ref(), TimerfdTimerFlags::empty(), &spec)?;
        self.armed = Some(deadline);
        Ok(())
    }

    /// Waits until the deadline set passes; never returns while disarmed.
    pub async fn fired(&mut self) -> io::Result<()> {
        loop {
            let mut ready = self.fd.readable().await?;
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
        let mut timer = PreciseTimer::new().unwrap();
        let mut late = Vec::new();
        for _ in 0..20 {
            let deadline = Instant::now() + Duration::from_millis(1);
            timer.set(deadline).unwrap();
            timer.fired().await.unwrap();
            let now = Instant::now();
            assert!(now >= deadline, "never early");
            assert_eq!(timer.armed(), None);
            late.push(now - deadline);
        }
        late.sort();
        // Lateness is measured by the bench, not asserted here.
        eprintln!("median lateness {:?}", late[10]);
    }

    #[tokio::test]
    async fn a_new_deadline_replaces_the_one_set_before() {
        let mut timer = PreciseTimer::new().unwrap();
        timer
            .set(Instant::now() + Duration::from_secs(3600))
            .unwrap();
        let sooner = Instant::now() + Duration::from_millis(2);
        timer.set(sooner).unwrap();
        let fired = tokio::time::timeout(Duration::from_secs(5), timer.fired()).await;
        assert!(fired.is_ok(), "the later setting counts");
        assert!(Instant::now() >= sooner, "not before it is due");
    }

    #[tokio::test]
    async fn a_passed_deadline_fires_at_once() {
        let mut timer = PreciseTimer::new().unwrap();
        timer
            .set(Instant::now() - Duration::from_millis(5))
            .unwrap();
        let fired = tokio::time::timeout(Duration::from_secs(5), timer.fired()).await;
        assert!(fired.is_ok(), "a zero value would have disarmed it");
    }
}
