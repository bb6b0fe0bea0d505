//! Capped exponential backoff with jitter, as a pure value.
//!
//! The delay before retry `n` (counting from 0) is drawn from
//! `[ceiling / 2, ceiling]` where `ceiling = min(max_ms, initial_ms * 2^n)`
//! ("equal jitter"): retries of many clients spread out, yet no retry comes
//! sooner than half the nominal delay. A server's `Retry-After` is a floor.
//! The random draw is passed in, so the schedule is testable without a clock
//! or a random source.

/// Delay of the first retry, in ms.
pub const DEFAULT_INITIAL_DELAY_MS: u64 = 50;
/// Largest delay between two attempts, in ms.
pub const DEFAULT_MAX_DELAY_MS: u64 = 2_000;

/// The retry schedule of one call.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial_delay_ms: u64,
    max_delay_ms: u64,
    /// Retries handed out so far.
    retries: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(DEFAULT_INITIAL_DELAY_MS, DEFAULT_MAX_DELAY_MS)
    }
}

impl Backoff {
    /// A schedule starting at `initial_delay_ms` and capped at `max_delay_ms`.
    pub fn new(initial_delay_ms: u64, max_delay_ms: u64) -> Self {
        let initial_delay_ms = initial_delay_ms.max(1);
        Self {
            initial_delay_ms,
            max_delay_ms: max_delay_ms.max(initial_delay_ms),
            retries: 0,
        }
    }

    /// Retries handed out so far.
    pub fn retries(&self) -> u32 {
        self.retries
    }

    /// The nominal (un-jittered) delay of the next retry.
    pub fn ceiling_ms(&self) -> u64 {
        // 2^20 times any sane initial delay is past any sane cap: stop doubling there.
        let factor = 1u64 << self.retries.min(20);
        self.initial_delay_ms
            .saturating_mul(factor)
            .min(self.max_delay_ms)
    }

    /// The delay before the next retry. `unit` is a random draw in `[0, 1)`;
    /// `retry_after_ms` is the server's `Retry-After`, if it sent one.
    pub fn next_delay_ms(&mut self, unit: f64, retry_after_ms: Option<u64>) -> u64 {
        let ceiling = self.ceiling_ms();
        self.retries = self.retries.saturating_add(1);
        let unit = if unit.is_finite() {
            unit.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let half = ceiling / 2;
        let jittered = half
            .saturating_add(((ceiling - half) as f64 * unit) as u64)
            .min(ceiling);
        jittered.max(retry_after_ms.unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap() {
        let mut backoff = Backoff::new(100, 1_000);
        let ceilings: Vec<u64> = (0..6)
            .map(|_| {
                let ceiling = backoff.ceiling_ms();
                backoff.next_delay_ms(1.0, None);
                ceiling
            })
            .collect();
        assert_eq!(ceilings, [100, 200, 400, 800, 1_000, 1_000]);
        assert_eq!(backoff.retries(), 6);
    }

    #[test]
    fn jitter_stays_within_half_and_full_ceiling() {
        let mut low = Backoff::new(100, 1_000);
        let mut high = Backoff::new(100, 1_000);
        for _ in 0..8 {
            let ceiling = low.ceiling_ms();
            let a = low.next_delay_ms(0.0, None);
            let b = high.next_delay_ms(0.999_999, None);
            assert_eq!(a, ceiling / 2);
            assert!(b <= ceiling && b >= ceiling - 1, "{b} vs {ceiling}");
        }
    }

    #[test]
    fn retry_after_is_a_floor_and_bad_draws_are_clamped() {
        let mut backoff = Backoff::new(10, 100);
        assert_eq!(backoff.next_delay_ms(0.5, Some(1_000)), 1_000);
        assert_eq!(backoff.next_delay_ms(f64::NAN, None), 10);
        assert_eq!(backoff.next_delay_ms(7.0, None), 40);
    }

    #[test]
    fn many_retries_never_overflow() {
        let mut backoff = Backoff::new(u64::MAX / 2, u64::MAX);
        for _ in 0..100 {
            backoff.next_delay_ms(1.0, None);
        }
        assert_eq!(backoff.ceiling_ms(), u64::MAX);
    }
}
