//! Values that many connections hold alike, shared (issue 22: memory per idle session):
//! the user name a pool logs in with, the connection attributes its driver sends (a
//! hundred bytes and more, repeated on every backend connection), a server's version and
//! plugin name (every connection's greeting). A login takes the allocation a live
//! connection holds for the same value, if any; the table keeps only weak references, so
//! a value goes with the last connection that held it.

use std::collections::hash_map::{DefaultHasher, Entry};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, Weak};

/// A table of shared values of one type (`str`, `[u8]`). Taken once per login, never per
/// request.
pub struct Interner<T: ?Sized> {
    table: Mutex<Table<T>>,
}

struct Table<T: ?Sized> {
    /// By the value's hash; a second value with the same hash is not shared.
    live: HashMap<u64, Weak<T>>,
    /// When the table holds this many entries, those whose value is gone are dropped.
    purge_at: usize,
}

/// Entries below which the table is never purged.
const PURGE_FLOOR: usize = 64;

impl<T: ?Sized> Default for Interner<T> {
    fn default() -> Self {
        Interner {
            table: Mutex::new(Table {
                live: HashMap::new(),
                purge_at: PURGE_FLOOR,
            }),
        }
    }
}

impl<T: ?Sized + Eq + Hash> Interner<T>
where
    Arc<T>: for<'a> From<&'a T>,
{
    /// `value`, in the allocation live sessions share for it.
    pub fn get(&self, value: &T) -> Arc<T> {
        let mut hasher = DefaultHasher::new();
        value.hash(&mut hasher);
        let hash = hasher.finish();
        let Ok(mut table) = self.table.lock() else {
            return Arc::from(value);
        };
        let table = &mut *table;
        let shared = match table.live.entry(hash) {
            Entry::Occupied(mut slot) => match slot.get().upgrade() {
                Some(held) if *held == *value => held,
                // Another value with the same hash: this one stays unshared.
                Some(_) => Arc::from(value),
                None => {
                    let new = Arc::from(value);
                    slot.insert(Arc::downgrade(&new));
                    new
                }
            },
            Entry::Vacant(slot) => {
                let new = Arc::from(value);
                slot.insert(Arc::downgrade(&new));
                new
            }
        };
        if table.live.len() >= table.purge_at {
            table.live.retain(|_, held| held.strong_count() > 0);
            table.purge_at = (table.live.len() * 2).max(PURGE_FLOOR);
        }
        shared
    }

    /// How many values the table holds, live or not yet purged (for tests).
    #[cfg(test)]
    fn entries(&self) -> usize {
        self.table.lock().map_or(0, |t| t.live.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_with_the_same_value_share_one_allocation_while_one_holds_it() {
        let names: Interner<str> = Interner::default();
        let a = names.get("app");
        let b = names.get("app");
        assert!(Arc::ptr_eq(&a, &b));
        let other = names.get("report");
        assert!(!Arc::ptr_eq(&a, &other));
        assert_eq!((&*a, &*other), ("app", "report"));
        // Gone with the last holder: the next login makes it again.
        drop((a, b));
        let again = names.get("app");
        assert_eq!(&*again, "app");
        assert_eq!(Arc::strong_count(&again), 1);
    }

    #[test]
    fn values_nobody_holds_are_dropped_from_the_table() {
        let attributes: Interner<[u8]> = Interner::default();
        let kept: Vec<Arc<[u8]>> = (0..10u32)
            .map(|i| attributes.get(&i.to_le_bytes()))
            .collect();
        for i in 0..10_000u32 {
            let _gone = attributes.get(&(i + 100).to_le_bytes());
        }
        // The ten still held, and no more than the purge's bound of the rest.
        assert!(
            attributes.entries() <= 2 * PURGE_FLOOR,
            "{} entries",
            attributes.entries()
        );
        for (i, k) in kept.iter().enumerate() {
            assert!(Arc::ptr_eq(k, &attributes.get(&(i as u32).to_le_bytes())));
        }
    }
}
