//! Ordered maps and sets sized for what a key usually holds: a few entries.
//!
//! A `BTreeMap` allocates a whole leaf (eleven slots) for its first entry: a
//! key holding one grant paid over a kilobyte for its grant map alone, and as
//! much again for each index beside it. [`SmallMap`] keeps up to [`MAX_FEW`]
//! entries in one sorted boxed slice sized exactly to its length and switches
//! to a (boxed) `BTreeMap` beyond that, so a busy key keeps logarithmic updates.
//!
//! A map is two words (16 bytes): a key state holds eight of them, most of
//! them empty, so each word counts at 100,000 keys (a `Vec` and an unboxed
//! `BTreeMap` made it 32 bytes).
//!
//! The representation is invisible: iteration is in key order either way,
//! equality compares entries, and serialisation writes the same map a
//! `BTreeMap` writes, so encodings stay deterministic and unchanged.

use std::borrow::Borrow;
use std::collections::{btree_map, BTreeMap};
use std::fmt;
use std::ops::{Bound, Index, RangeBounds};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Most entries kept in the sorted vector; one more moves them to a B-tree.
pub const MAX_FEW: usize = 16;
/// A B-tree shrunk to this many entries moves back to a vector (below
/// `MAX_FEW`, so a map at the boundary does not flip on every change).
const BACK_TO_FEW: usize = MAX_FEW / 2;

/// An ordered map: a sorted vector while small, a B-tree while large.
#[derive(Clone)]
pub struct SmallMap<K, V> {
    repr: Repr<K, V>,
}

#[derive(Clone)]
// The box keeps `Many` one word, so the enum fits in the slice's two words.
#[allow(clippy::box_collection)]
enum Repr<K, V> {
    /// Sorted by key; the slice's length is its capacity.
    Few(Box<[(K, V)]>),
    Many(Box<BTreeMap<K, V>>),
}

impl<K, V> Default for SmallMap<K, V> {
    fn default() -> Self {
        Self {
            repr: Repr::Few(Box::default()),
        }
    }
}

impl<K: Ord, V> SmallMap<K, V> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::Few(entries) => entries.len(),
            Repr::Many(tree) => tree.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where `key` is (`Ok`) or would go (`Err`) in the sorted vector.
    fn position<Q>(entries: &[(K, V)], key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        entries.binary_search_by(|(held, _)| held.borrow().cmp(key))
    }

    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        match &self.repr {
            Repr::Few(entries) => Self::position(entries, key)
                .ok()
                .map(|index| &entries[index].1),
            Repr::Many(tree) => tree.get(key),
        }
    }

    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        match &mut self.repr {
            Repr::Few(entries) => Self::position(entries, key)
                .ok()
                .map(|index| &mut entries[index].1),
            Repr::Many(tree) => tree.get_mut(key),
        }
    }

    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.get(key).is_some()
    }

    /// Inserts `value` under `key`, returning the value it replaced.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let mut value = Some(value);
        let slot = self.get_or_insert_with(key, || value.take().expect("taken once"));
        value.map(|value| std::mem::replace(slot, value))
    }

    /// The value under `key`, inserting `make()` first if there is none.
    pub fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        if let Repr::Few(entries) = &mut self.repr {
            if entries.len() == MAX_FEW && Self::position(entries, &key).is_err() {
                let tree = Vec::from(std::mem::take(entries)).into_iter().collect();
                self.repr = Repr::Many(Box::new(tree));
            }
        }
        match &mut self.repr {
            Repr::Many(tree) => tree.entry(key).or_insert_with(make),
            Repr::Few(entries) => {
                let index = match Self::position(entries, &key) {
                    Ok(index) => index,
                    Err(index) => {
                        // Exactly one more slot: a vector's default growth
                        // would reserve four for the first entry.
                        let mut grown = Vec::from(std::mem::take(entries));
                        grown.reserve_exact(1);
                        grown.insert(index, (key, make()));
                        *entries = grown.into_boxed_slice();
                        index
                    }
                };
                &mut entries[index].1
            }
        }
    }

    /// Removes `key`, returning its value.
    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        match &mut self.repr {
            Repr::Few(entries) => {
                let index = Self::position(entries, key).ok()?;
                let mut shrunk = Vec::from(std::mem::take(entries));
                let (_, value) = shrunk.remove(index);
                *entries = shrunk.into_boxed_slice();
                Some(value)
            }
            Repr::Many(tree) => {
                let value = tree.remove(key)?;
                if tree.len() <= BACK_TO_FEW {
                    let entries = std::mem::take(&mut **tree).into_iter().collect();
                    self.repr = Repr::Few(entries);
                }
                Some(value)
            }
        }
    }

    /// The entry with the smallest key.
    pub fn first_key_value(&self) -> Option<(&K, &V)> {
        self.iter().next()
    }

    pub fn iter(&self) -> Iter<'_, K, V> {
        match &self.repr {
            Repr::Few(entries) => Iter::Few(entries.iter()),
            Repr::Many(tree) => Iter::Many(tree.iter()),
        }
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &K> + '_ {
        self.iter().map(|(key, _)| key)
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &V> + '_ {
        self.iter().map(|(_, value)| value)
    }

    /// The entries whose keys fall in `range`, in key order.
    pub fn range<R: RangeBounds<K>>(&self, range: R) -> Iter<'_, K, V> {
        match &self.repr {
            Repr::Few(entries) => {
                let start = match range.start_bound() {
                    Bound::Included(low) => entries.partition_point(|(key, _)| key < low),
                    Bound::Excluded(low) => entries.partition_point(|(key, _)| key <= low),
                    Bound::Unbounded => 0,
                };
                let end = match range.end_bound() {
                    Bound::Included(high) => entries.partition_point(|(key, _)| key <= high),
                    Bound::Excluded(high) => entries.partition_point(|(key, _)| key < high),
                    Bound::Unbounded => entries.len(),
                };
                Iter::Few(entries[start..end.max(start)].iter())
            }
            Repr::Many(tree) => Iter::ManyRange(tree.range(range)),
        }
    }
}

/// Iterator over a [`SmallMap`]'s entries in key order.
#[derive(Debug)]
pub enum Iter<'a, K, V> {
    Few(std::slice::Iter<'a, (K, V)>),
    Many(btree_map::Iter<'a, K, V>),
    ManyRange(btree_map::Range<'a, K, V>),
}

impl<'a, K, V> Iterator for Iter<'a, K, V> {
    type Item = (&'a K, &'a V);

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Iter::Few(entries) => entries.next().map(|(key, value)| (key, value)),
            Iter::Many(entries) => entries.next(),
            Iter::ManyRange(entries) => entries.next(),
        }
    }
}

impl<K, V> DoubleEndedIterator for Iter<'_, K, V> {
    fn next_back(&mut self) -> Option<Self::Item> {
        match self {
            Iter::Few(entries) => entries.next_back().map(|(key, value)| (key, value)),
            Iter::Many(entries) => entries.next_back(),
            Iter::ManyRange(entries) => entries.next_back(),
        }
    }
}

impl<'a, K: Ord, V> IntoIterator for &'a SmallMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = Iter<'a, K, V>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for SmallMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(entries: I) -> Self {
        let mut map = Self::new();
        for (key, value) in entries {
            map.insert(key, value);
        }
        map
    }
}

impl<K, Q, V> Index<&Q> for SmallMap<K, V>
where
    K: Ord + Borrow<Q>,
    Q: Ord + ?Sized,
{
    type Output = V;

    fn index(&self, key: &Q) -> &V {
        self.get(key).expect("no entry for the key")
    }
}

impl<K: Ord + PartialEq, V: PartialEq> PartialEq for SmallMap<K, V> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<K: Ord + Eq, V: Eq> Eq for SmallMap<K, V> {}

impl<K: Ord + fmt::Debug, V: fmt::Debug> fmt::Debug for SmallMap<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: Ord + Serialize, V: Serialize> Serialize for SmallMap<K, V> {
    /// Exactly what a `BTreeMap` of the same entries writes.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de, K: Ord + Deserialize<'de>, V: Deserialize<'de>> Deserialize<'de> for SmallMap<K, V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let tree = BTreeMap::<K, V>::deserialize(deserializer)?;
        Ok(if tree.len() <= MAX_FEW {
            Self {
                repr: Repr::Few(tree.into_iter().collect()),
            }
        } else {
            Self {
                repr: Repr::Many(Box::new(tree)),
            }
        })
    }
}

/// An ordered set on a [`SmallMap`].
#[derive(Clone, PartialEq, Eq)]
pub struct SmallSet<K: Ord> {
    map: SmallMap<K, ()>,
}

impl<K: Ord> Default for SmallSet<K> {
    fn default() -> Self {
        Self {
            map: SmallMap::default(),
        }
    }
}

impl<K: Ord> SmallSet<K> {
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Adds `key`; whether it was new.
    pub fn insert(&mut self, key: K) -> bool {
        self.map.insert(key, ()).is_none()
    }

    /// Removes `key`; whether it was there.
    pub fn remove<Q>(&mut self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.map.remove(key).is_some()
    }

    pub fn contains<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.map.contains_key(key)
    }

    /// The smallest element.
    pub fn first(&self) -> Option<&K> {
        self.map.first_key_value().map(|(key, _)| key)
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &K> + '_ {
        self.map.keys()
    }

    /// The elements in `range`, in order.
    pub fn range<R: RangeBounds<K>>(&self, range: R) -> impl DoubleEndedIterator<Item = &K> + '_ {
        self.map.range(range).map(|(key, _)| key)
    }
}

impl<K: Ord + fmt::Debug> fmt::Debug for SmallSet<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Applies the same inserts and removes to a `SmallMap` and a `BTreeMap`,
    /// crossing the vector/tree boundary both ways, and compares them throughout.
    #[test]
    fn behaves_like_a_btree_map_across_both_representations() {
        let mut small: SmallMap<u32, u32> = SmallMap::new();
        let mut tree: BTreeMap<u32, u32> = BTreeMap::new();
        // A fixed, scattered order of keys: multiplication by a unit mod 97.
        let keys: Vec<u32> = (0..60).map(|index| (index * 37) % 97).collect();
        for (step, &key) in keys.iter().enumerate() {
            assert_eq!(
                small.insert(key, step as u32),
                tree.insert(key, step as u32)
            );
            assert!(small.iter().eq(tree.iter()));
        }
        assert_eq!(small.insert(keys[3], 7), tree.insert(keys[3], 7));
        for &key in keys.iter().rev().step_by(2).chain(keys.iter()) {
            assert_eq!(small.remove(&key), tree.remove(&key));
            assert!(small.iter().eq(tree.iter()));
            assert_eq!(small.len(), tree.len());
            assert_eq!(small.first_key_value(), tree.first_key_value());
            for probe in [0, 10, 50, 96, 100] {
                assert_eq!(small.get(&probe), tree.get(&probe));
                assert!(small.range(..=probe).eq(tree.range(..=probe)));
                assert!(small.range(probe..).eq(tree.range(probe..)));
            }
        }
        assert!(small.is_empty());
    }

    #[test]
    fn serialises_like_a_btree_map() {
        for size in [0, 1, MAX_FEW, MAX_FEW + 1, 40] {
            let tree: BTreeMap<String, u64> = (0..size)
                .map(|index| (format!("k{index}"), index as u64))
                .collect();
            let small: SmallMap<String, u64> = tree.clone().into_iter().collect();
            let written = serde_json::to_string(&small).unwrap();
            assert_eq!(written, serde_json::to_string(&tree).unwrap());
            let read: SmallMap<String, u64> = serde_json::from_str(&written).unwrap();
            assert_eq!(read, small);
        }
    }

    #[test]
    fn one_entry_takes_one_slot() {
        let mut small: SmallMap<u64, [u8; 100]> = SmallMap::new();
        small.insert(1, [0; 100]);
        let Repr::Few(entries) = &small.repr else {
            panic!("one entry is kept in the vector");
        };
        assert_eq!(entries.len(), 1);
    }

    #[test]
    fn a_map_is_two_words() {
        assert_eq!(std::mem::size_of::<SmallMap<u64, u64>>(), 16);
        assert_eq!(std::mem::size_of::<SmallSet<(u64, String)>>(), 16);
        assert_eq!(std::mem::size_of::<SmallMap<String, [u8; 100]>>(), 16);
    }
}
