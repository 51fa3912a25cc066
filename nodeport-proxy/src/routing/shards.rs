//! An immutable hash map split into shards, so a new version that changes a
//! few keys copies only their shards: at 20,000 Services a one-Service
//! change copies a few hundred entries instead of every route. Readers see
//! one version whole, as with a plain map behind `ArcSwap`.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::Arc;

/// Shards per map: with 40,000 routes, about 160 entries each.
const SHARDS: usize = 256;

pub struct Shards<K, V> {
    shards: Arc<[Arc<HashMap<K, V>>]>,
    hasher: RandomState,
    len: usize,
}

impl<K, V> Clone for Shards<K, V> {
    fn clone(&self) -> Self {
        Shards {
            shards: self.shards.clone(),
            hasher: self.hasher.clone(),
            len: self.len,
        }
    }
}

impl<K: Hash + Eq + Clone, V: Clone> Default for Shards<K, V> {
    fn default() -> Self {
        let empty = Arc::new(HashMap::new());
        Shards {
            shards: (0..SHARDS).map(|_| empty.clone()).collect(),
            hasher: RandomState::new(),
            len: 0,
        }
    }
}

impl<K: std::fmt::Debug, V: std::fmt::Debug> std::fmt::Debug for Shards<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.shards.iter().flat_map(|s| s.iter()))
            .finish()
    }
}

impl<K: Hash + Eq + Clone, V: Clone> Shards<K, V> {
    fn shard_of<Q: Hash + ?Sized>(&self, key: &Q) -> usize {
        (self.hasher.hash_one(key) as usize) % SHARDS
    }

    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shards.get(self.shard_of(key))?.get(key)
    }

    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(key).is_some()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.shards.iter().flat_map(|s| s.iter())
    }

    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.iter().map(|(k, _)| k)
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }

    /// A new version with `changes` applied (`None` removes the key);
    /// shards no change falls in are shared with `self`.
    pub fn with_changes(&self, changes: impl IntoIterator<Item = (K, Option<V>)>) -> Self {
        let mut shards: Vec<Arc<HashMap<K, V>>> = self.shards.to_vec();
        let mut copied = vec![false; SHARDS];
        let mut len = self.len;
        for (k, v) in changes {
            let i = self.shard_of(&k);
            if !copied[i] {
                shards[i] = Arc::new((*shards[i]).clone());
                copied[i] = true;
            }
            let Some(map) = Arc::get_mut(&mut shards[i]) else {
                continue;
            };
            let had = match v {
                Some(v) => map.insert(k, v).is_some(),
                None => {
                    let had = map.remove(&k).is_some();
                    if had {
                        len -= 1;
                    }
                    continue;
                }
            };
            if !had {
                len += 1;
            }
        }
        Shards {
            shards: shards.into(),
            hasher: self.hasher.clone(),
            len,
        }
    }
}

impl<K: Hash + Eq + Clone, V: Clone> FromIterator<(K, V)> for Shards<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Shards::default().with_changes(iter.into_iter().map(|(k, v)| (k, Some(v))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_copies_only_its_shard() {
        let base: Shards<u32, u32> = (0..10_000).map(|i| (i, i)).collect();
        assert_eq!(base.len(), 10_000);
        let next = base.with_changes([(5, Some(50)), (10_001, Some(1)), (7, None), (99_999, None)]);
        assert_eq!(
            (next.get(&5), next.get(&10_001), next.get(&7)),
            (Some(&50), Some(&1), None)
        );
        assert_eq!((base.get(&5), base.get(&7)), (Some(&5), Some(&7)));
        assert_eq!(next.len(), 10_000);
        let shared = base
            .shards
            .iter()
            .zip(next.shards.iter())
            .filter(|(a, b)| Arc::ptr_eq(a, b))
            .count();
        assert!(shared >= SHARDS - 4, "{shared} shards shared");
        assert_eq!(next.iter().count(), 10_000);
    }
}
