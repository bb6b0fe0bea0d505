//! Per-key due times in due order: the one timer structure of the leader.
//!
//! The rounds schedule (`schedule.rs`) keeps round due times, idle keys' period
//! ends and held requests' ends in it; the reclaim timers (`reclaim.rs`) keep
//! claim deadlines in it. Each key has at most one due time; setting it again
//! moves it, and popping takes the earliest due one.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;

/// Per-key due times, earliest first.
///
/// Invariant: `at[key] == due` exactly when `(due, key)` is in `order`.
#[derive(Debug, Clone)]
pub struct Deadlines<T: Ord + Clone, K: Ord + Hash + Clone> {
    order: BTreeSet<(T, K)>,
    at: HashMap<K, T>,
}

impl<T: Ord + Clone, K: Ord + Hash + Clone> Default for Deadlines<T, K> {
    fn default() -> Self {
        Self {
            order: BTreeSet::new(),
            at: HashMap::new(),
        }
    }
}

impl<T: Ord + Clone, K: Ord + Hash + Clone> Deadlines<T, K> {
    /// Sets `key`'s due time, or clears it with `None`.
    pub fn set(&mut self, key: K, due: Option<T>) {
        if let Some(old) = self.at.remove(&key) {
            self.order.remove(&(old, key.clone()));
        }
        if let Some(due) = due {
            self.order.insert((due.clone(), key.clone()));
            self.at.insert(key, due);
        }
        debug_assert_eq!(self.order.len(), self.at.len(), "deadline indexes agree");
    }

    pub fn get(&self, key: &K) -> Option<&T> {
        self.at.get(key)
    }

    /// The earliest due time.
    pub fn first(&self) -> Option<&T> {
        self.order.first().map(|(due, _)| due)
    }

    /// Takes the earliest key if it is due at `now`.
    pub fn pop_due(&mut self, now: &T) -> Option<(T, K)> {
        if self.order.first().is_some_and(|(due, _)| due <= now) {
            let (due, key) = self.order.pop_first().expect("checked above");
            self.at.remove(&key);
            return Some((due, key));
        }
        None
    }

    pub fn len(&self) -> usize {
        self.at.len()
    }

    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }

    pub fn clear(&mut self) {
        self.order.clear();
        self.at.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_keep_one_due_time_per_key_in_order() {
        let mut deadlines: Deadlines<u64, &str> = Deadlines::default();
        deadlines.set("a", Some(30));
        deadlines.set("b", Some(10));
        deadlines.set("a", Some(5));
        assert_eq!((deadlines.first(), deadlines.len()), (Some(&5), 2));
        assert_eq!(deadlines.pop_due(&4), None);
        assert_eq!(deadlines.pop_due(&10), Some((5, "a")));
        assert_eq!(deadlines.pop_due(&10), Some((10, "b")));
        deadlines.set("c", Some(1));
        deadlines.set("c", None);
        assert!(deadlines.is_empty() && deadlines.get(&"c").is_none());
    }
}
