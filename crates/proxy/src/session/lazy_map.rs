//! A map that takes no room until its first entry. Every idle session keeps its maps, and
//! most stay empty for its whole life (a replica connection's prepared statements, the
//! schemas of SQL-level `PREPARE`s): a `HashMap` is 48 bytes even empty, this is 8 (issue
//! 22: memory per idle session).

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;

// (The box is the point: an empty map's 48 bytes are what it saves.)
#[allow(clippy::box_collection)]
pub(super) struct LazyMap<K, V>(Option<Box<HashMap<K, V>>>);

impl<K, V> Default for LazyMap<K, V> {
    fn default() -> Self {
        LazyMap(None)
    }
}

impl<K: Hash + Eq, V> LazyMap<K, V> {
    pub(super) fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.0.as_ref()?.get(key)
    }

    pub(super) fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.0.as_mut()?.get_mut(key)
    }

    pub(super) fn insert(&mut self, key: K, value: V) -> Option<V> {
        self.0.get_or_insert_with(Box::default).insert(key, value)
    }

    /// Removes `key`'s entry; the last one removed gives the room back.
    pub(super) fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let map = self.0.as_mut()?;
        let removed = map.remove(key);
        if map.is_empty() {
            self.0 = None;
        }
        removed
    }

    pub(super) fn clear(&mut self) {
        self.0 = None;
    }

    pub(super) fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |m| m.len())
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.0.iter().flat_map(|m| m.iter())
    }
}

impl<K: Hash + Eq, V> FromIterator<(K, V)> for LazyMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(entries: I) -> Self {
        let map: HashMap<K, V> = entries.into_iter().collect();
        LazyMap((!map.is_empty()).then(|| Box::new(map)))
    }
}

#[cfg(test)]
mod tests {
    use super::LazyMap;

    #[test]
    fn it_holds_room_only_while_it_has_entries() {
        assert_eq!(std::mem::size_of::<LazyMap<u32, (u32, bool)>>(), 8);
        let mut map = LazyMap::default();
        assert!(map.0.is_none() && map.get(&1).is_none() && map.len() == 0);
        assert_eq!(map.insert(1u32, "a"), None);
        assert_eq!(map.insert(2, "b"), None);
        assert_eq!(map.insert(1, "c"), Some("a"));
        if let Some(v) = map.get_mut(&2) {
            *v = "d";
        }
        let mut entries: Vec<_> = map.iter().map(|(&k, &v)| (k, v)).collect();
        entries.sort();
        assert_eq!(entries, [(1, "c"), (2, "d")]);
        assert_eq!(map.remove(&1), Some("c"));
        assert!(map.0.is_some(), "an entry is left");
        assert_eq!(map.remove(&2), Some("d"));
        assert!(
            map.0.is_none(),
            "the last entry's removal gives the room back"
        );
        assert_eq!(map.remove(&2), None);
        let collected: LazyMap<u32, u32> = std::iter::empty().collect();
        assert!(collected.0.is_none());
        let mut collected: LazyMap<u32, u32> = [(3, 4)].into_iter().collect();
        assert_eq!(collected.get(&3), Some(&4));
        collected.clear();
        assert!(collected.0.is_none() && collected.len() == 0);
    }
}
