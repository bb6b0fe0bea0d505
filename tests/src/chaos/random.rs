//! The chaos run's one source of randomness: a small deterministic generator.
//!
//! Every random choice of a run (the fault schedule, each runner's job
//! durations and groups) comes from a [`ReplayRng`] started from the run's
//! [`RandomState`], so the same number replays the same run. SplitMix64
//! (powerfs's, which picks its torn writes) is plenty for picking faults and
//! durations, and unlike a cryptographic generator it is a few lines we own.
//! It implements `rand::RngCore`, so the usual `random_range`, `random_bool`
//! and `shuffle` work on it.

use permitd_powerfs::undo::Rng as SplitMix64;
use rand::RngCore;

/// The number that fixes every random choice of a chaos run.
pub type RandomState = u64;

/// SplitMix64 from a run's [`RandomState`].
#[derive(Debug, Clone)]
pub struct ReplayRng {
    numbers: SplitMix64,
}

impl ReplayRng {
    /// The generator for `state`.
    pub fn new(state: RandomState) -> Self {
        Self {
            numbers: SplitMix64::new(state),
        }
    }

    /// An independent generator for the `stream`-th user of one run (each runner
    /// draws from its own, so adding a runner does not change the others' draws).
    pub fn for_stream(state: RandomState, stream: u64) -> Self {
        Self::new(state ^ (stream + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }
}

impl RngCore for ReplayRng {
    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    fn next_u64(&mut self) -> u64 {
        self.numbers.next_u64()
    }

    fn fill_bytes(&mut self, destination: &mut [u8]) {
        for chunk in destination.chunks_mut(8) {
            let bytes = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::Rng;

    use super::*;

    #[test]
    fn the_same_state_replays_the_same_draws() {
        let draws = |state| {
            let mut rng = ReplayRng::new(state);
            (0..8)
                .map(|_| rng.random_range(0..1_000u32))
                .collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
    }

    #[test]
    fn streams_differ() {
        let first = ReplayRng::for_stream(7, 0).next_u64();
        assert_ne!(first, ReplayRng::for_stream(7, 1).next_u64());
    }
}
