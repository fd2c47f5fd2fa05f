//! The steps' share of a device's regions, across every arena on the device: step regions
//! never outnumber a quarter of its `max_mr` in the process, whatever the number of pools.
//!
//! Contract: a table that may step slabs joins its device's [`Budget`] when made: an entry of
//! [`BUDGETS`] keyed by the device's name (hashed; two devices whose names collide share one
//! entry: they step at most one device's share together), counted by the tables on it. A slab is
//! stepped only once its table *and* its device's entry have room ([`Budget::take`]); a slab
//! that stops being stepped gives its place back ([`Budget::give`]), and a dropped table gives
//! back every place it held, then leaves. Entries are fixed (no allocation, fork-safe: a
//! `ForkLock` guards joining and leaving; taking and giving are one atomic each); a table that
//! finds all [`ENTRIES`] taken by other devices steps nothing (its slabs are registered whole,
//! as on a device with few regions).
//!
//! Invariant: for every entry `e` in use, `e.stepped >= Σ over tables on e of their stepped
//! slabs` (equal at rest: a place is taken before the table's count rises, and given back
//! after it falls), and `e.stepped <= e.limit`, where `limit` is the fewest step slabs any
//! table on the device asked for since the entry was last free (a quarter of `max_mr` over
//! `STEPS`; it never rises while any table is on the entry) — once a table with a smaller limit
//! joins, only after enough places are given back (no place is taken past it).

use crate::sys::atfork::ForkLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Devices with stepping tables at once in a process.
pub(crate) const ENTRIES: usize = 64;

/// One device's count of stepped slabs, and its bound.
struct Entry {
    /// The device's name hashed, 0 where the entry is free.
    key: AtomicU64,
    /// Tables on the device (changed under [`JOIN`] only).
    users: AtomicUsize,
    stepped: AtomicUsize,
    limit: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)] // each array element is its own entry
const FREE: Entry = Entry {
    key: AtomicU64::new(0),
    users: AtomicUsize::new(0),
    stepped: AtomicUsize::new(0),
    limit: AtomicUsize::new(0),
};

static BUDGETS: [Entry; ENTRIES] = [FREE; ENTRIES];

/// Held while a table joins or leaves an entry.
static JOIN: ForkLock<()> = ForkLock::new(());

/// A table's place in its device's budget (none: the table steps nothing).
pub(crate) struct Budget {
    entry: Option<&'static Entry>,
}

impl Budget {
    /// No budget: nothing is ever stepped.
    pub(crate) const fn none() -> Budget {
        Budget { entry: None }
    }

    /// Join device `name`'s entry, whose tables may step at most `limit` slabs together.
    pub(crate) fn join(name: &str, limit: usize) -> Budget {
        Budget::join_in(&BUDGETS, name, limit)
    }

    /// [`Budget::join`] in table `entries` (the process's, or a test's own).
    fn join_in(entries: &'static [Entry], name: &str, limit: usize) -> Budget {
        if limit == 0 {
            return Budget::none();
        }
        let key = hash(name);
        let g = JOIN.lock();
        let found = entries
            .iter()
            .find(|e| e.key.load(Ordering::Relaxed) == key && e.users.load(Ordering::Relaxed) > 0)
            .or_else(|| {
                let e = entries
                    .iter()
                    .find(|e| e.users.load(Ordering::Relaxed) == 0)?;
                e.key.store(key, Ordering::Relaxed);
                e.stepped.store(0, Ordering::Relaxed);
                e.limit.store(limit, Ordering::Relaxed);
                Some(e)
            });
        if let Some(e) = found {
            e.users.fetch_add(1, Ordering::Relaxed);
            e.limit.fetch_min(limit, Ordering::Relaxed);
        }
        drop(g); // logged outside the lock: a slow subscriber holds up no other pool, nor fork
        if found.is_none() {
            tracing::warn!(
                target: "rdma_pool::arena",
                device = name,
                "{ENTRIES} devices already register steps in this process: this arena \
                 registers its slabs whole"
            );
        }
        Budget { entry: found }
    }

    /// Take a place for one more stepped slab: false where the device has none left.
    pub(crate) fn take(&self) -> bool {
        self.entry.is_some_and(|e| {
            e.stepped
                .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                    (n < e.limit.load(Ordering::Relaxed)).then_some(n + 1)
                })
                .is_ok()
        })
    }

    /// Give back `n` places (slabs stepped no more).
    pub(crate) fn give(&self, n: usize) {
        if let Some(e) = self.entry {
            let before = e.stepped.fetch_sub(n, Ordering::AcqRel);
            debug_assert!(before >= n, "{n} places given back, {before} taken");
        }
    }

    /// Whether this table has a budget at all.
    pub(crate) fn any(&self) -> bool {
        self.entry.is_some()
    }

    /// Whether the device has a place left.
    pub(crate) fn room(&self) -> bool {
        self.entry
            .is_some_and(|e| e.stepped.load(Ordering::Relaxed) < e.limit.load(Ordering::Relaxed))
    }

    /// `(slabs stepped on the device, its limit)`.
    pub(crate) fn used(&self) -> (usize, usize) {
        self.entry.map_or((0, 0), |e| {
            (
                e.stepped.load(Ordering::Relaxed),
                e.limit.load(Ordering::Relaxed),
            )
        })
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        if let Some(e) = self.entry {
            let _g = JOIN.lock();
            if e.users.fetch_sub(1, Ordering::Relaxed) == 1 {
                e.key.store(0, Ordering::Relaxed);
            }
        }
    }
}

/// FNV-1a of the device's name, never 0 (0 marks a free entry).
fn hash(name: &str) -> u64 {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    });
    h.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Each test has a table of its own: the process's is shared with every arena of the other
    // tests running meanwhile.
    static SHARED: [Entry; 4] = [FREE; 4];
    static FULL: [Entry; 4] = [FREE; 4];

    #[test]
    fn tables_on_one_device_share_its_places_and_a_dropped_one_gives_them_back() {
        let join = |name: &str, limit| Budget::join_in(&SHARED, name, limit);
        let a = join("budget-test-dev", 3);
        let b = join("budget-test-dev", 5);
        let other = join("budget-test-other", 1);
        assert_eq!(a.used(), (0, 3), "the fewest asked for");
        assert!(a.take() && b.take() && a.take());
        assert!(!b.take() && !a.take() && !b.room());
        assert!(other.take(), "another device counts apart");
        a.give(2);
        drop(a);
        assert_eq!(b.used(), (1, 3));
        assert!(b.take() && b.take() && !b.take());
        b.give(3);
        drop(b);
        let c = join("budget-test-dev", 7);
        assert_eq!(c.used(), (0, 7), "a device no table uses starts anew");
        assert!(!Budget::none().take() && !Budget::none().room());
        assert!(join("budget-test-zero", 0).entry.is_none());
    }

    #[test]
    fn a_table_finding_every_entry_taken_steps_nothing_and_one_freed_serves_again() {
        let join = |name: &str| Budget::join_in(&FULL, name, 4);
        let mut held: Vec<Budget> = (0..FULL.len())
            .map(|i| join(&format!("budget-full-{i}")))
            .collect();
        assert!(held.iter().all(Budget::any), "an entry each");
        let refused = join("budget-full-one-more");
        assert!(!refused.take() && !refused.room(), "fails closed: no steps");
        assert_eq!(refused.used(), (0, 0));
        drop(refused);
        held.pop();
        let again = join("budget-full-again");
        assert!(
            again.any() && again.take(),
            "a freed entry serves another device"
        );
        again.give(1);
    }
}
