//! The key book: every key this process gave a peer, by device and index, so that no later
//! grant of any pool — on any PD of the device, after any pool, PD or window is gone — hands
//! out a key a peer may still hold.
//!
//! Contract:
//! - **Room before a key is handed out.** A window fresh from the device holds its index's
//!   entry ([`hold`]) while it is allocated — the index is the window's alone meanwhile, so
//!   the keys it gives out join the entry when it goes ([`unhold`], one book operation per
//!   window, not per grant); a region grant's key is noted ([`claim`]) before the grant
//!   returns. A full book refuses the window or the region ([`Full`]: `GrantError::Limit {
//!   what: "key book", .. }`), so no key is ever issued that the book could not remember.
//!   Nothing is forgotten before its bound: an entry lives while it is held or any of its
//!   keys is live, and until the horizon passed after the last of them went.
//! - **Released when dead.** When a region grant's key dies (revocation completed, pool
//!   dropped), [`release`] starts its horizon; a window's keys start theirs when the window is
//!   deallocated (after the horizon, early on a failed invalidation, or with its pool): the
//!   entry stays until `horizon` more grants of the process were issued ([`CLOCK`]). One
//!   entry per `(device, index)` keeps every stale variant of the index (a bitmap) and the
//!   latest horizon of any of them.
//! - **Checked before a key is issued.** A window whose next variant is in the book skips it
//!   (type 2) or is held (type 1: the driver picks the next variant); a region grant whose
//!   key is in the book is held and another registered (`issue.rs`, `retire.rs`).
//! - **What advances the horizon:** grants issued by every pool of the process ([`CLOCK`]),
//!   and grants the full book refused — not other attempts, and not time: a process that
//!   stops granting keeps its book, and a full book drains (its oldest released entries lapse
//!   after at most `horizon` refusals, even when every new grant needs a new entry).
//! - **Scope:** this process. Devices are told apart by name (`ibv_get_device_name`, or the
//!   soft NIC's), so two opens of one device share entries and a device closed and opened
//!   again keeps them. Keys given out by other processes on the device are out of scope.
//! - **Memory:** at most its capacity in entries, process-wide (2^18 by default, each about 80
//!   bytes with the map's nodes: 21 MiB at most), taken from the global allocator outside any
//!   allocator lock (grants are never issued from inside the allocator). Nothing per pool.
//!
//! Invariants (under the lock): `|entries| <= max(capacity, entries when the capacity was
//! last lowered)` (a lowered capacity forgets nothing); an entry's `until` never decreases.

use crate::nic::{Nic, Rkey};
use crate::sys::atfork::{ForkGuard, ForkLock};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Grants issued by every pool of the process: the clock of the key book's horizons.
pub(crate) static CLOCK: AtomicU64 = AtomicU64::new(0);

/// The default capacity of the book (entries, one per device and key index).
pub(crate) const DEFAULT_CAPACITY: usize = 1 << 18;

/// One key index's stale variants.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The variants given out, a bit each.
    variants: [u64; 4],
    /// Keys of this index live (given out, not yet dead).
    live: u32,
    /// The [`CLOCK`] value from which, with `live == 0`, the entry may be forgotten.
    until: u64,
}

impl Entry {
    fn expired(&self, now: u64) -> bool {
        self.live == 0 && now >= self.until
    }
}

struct Book {
    entries: BTreeMap<(u64, u32), Entry>,
    capacity: usize,
    /// The clock at the last sweep that found nothing to forget (no sweep again before it
    /// moves or a key dies).
    swept_at: Option<u64>,
    refused: u64,
    /// Entries when the capacity was last set (kept if it was lowered below them).
    floor: usize,
}

static BOOK: ForkLock<Book> = ForkLock::new(Book {
    entries: BTreeMap::new(),
    capacity: DEFAULT_CAPACITY,
    swept_at: None,
    refused: 0,
    floor: 0,
});

fn book() -> ForkGuard<'static, Book> {
    BOOK.lock()
}

/// A device's identity in the book: an FNV-1a hash of its name (a collision only makes the
/// book refuse more).
fn device(nic: &Nic) -> u64 {
    nic.caps().name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// The book was full: the key was not noted, and must not be handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Full(pub(crate) usize);

impl Book {
    /// Room for `id`'s entry: it exists, or the book (swept) is below its capacity. A refusal
    /// is counted and ticks the clock, so a full book drains (see the module contract).
    fn room(&mut self, id: (u64, u32)) -> Result<(), Full> {
        if self.entries.contains_key(&id) || self.entries.len() < self.capacity {
            return Ok(());
        }
        self.sweep();
        if self.entries.len() < self.capacity {
            return Ok(());
        }
        self.refused += 1;
        CLOCK.fetch_add(1, Relaxed);
        Err(Full(self.capacity))
    }

    /// Forget the expired entries (when the clock moved or a key died since the last try).
    fn sweep(&mut self) {
        let now = CLOCK.load(Relaxed);
        if self.swept_at == Some(now) {
            return;
        }
        let before = self.entries.len();
        self.entries.retain(|_, e| !e.expired(now));
        self.swept_at = (self.entries.len() == before).then_some(now);
    }
}

/// Choose and note a key of `index` on `nic` under one lock: `pick` gets the variants of the
/// index a peer may still hold and returns the key to give out (noted as given to a peer, live
/// until [`release`]d), or `None` when there is none.
///
/// # Errors
/// [`Full`] when the key needs a new entry and the book holds its capacity in entries, none
/// of which expired: nothing is noted, and the key must not be handed out.
pub(crate) fn claim(
    nic: &Nic,
    index: u32,
    pick: impl FnOnce([u64; 4]) -> Option<Rkey>,
) -> Result<Option<Rkey>, Full> {
    let id = (device(nic), index);
    let mut b = book();
    let now = CLOCK.load(Relaxed);
    let stale = b
        .entries
        .get(&id)
        .filter(|e| !e.expired(now))
        .map_or([0; 4], |e| e.variants);
    let Some(key) = pick(stale) else {
        return Ok(None);
    };
    b.room(id)?;
    b.insert(id, key);
    Ok(Some(key))
}

/// A window fresh from the device holds its index's entry (`live`) while it is allocated:
/// the index is the window's alone meanwhile, so the keys it gives out are published only when
/// it goes ([`unhold`]), but the entry they need exists from now. Returns the variants of the
/// index a peer may still hold.
///
/// # Errors
/// [`Full`] as [`claim`]: the window must not be used.
pub(crate) fn hold(nic: &Nic, index: u32) -> Result<[u64; 4], Full> {
    let id = (device(nic), index);
    let mut b = book();
    let now = CLOCK.load(Relaxed);
    b.room(id)?;
    let e = b.entries.entry(id).or_insert(EMPTY);
    if e.expired(now) {
        *e = EMPTY;
    }
    e.live += 1;
    Ok(e.variants)
}

/// A window that held `index`'s entry goes: the keys it gave out (`given`, a bit per variant)
/// join the entry, refused until the process's grant clock reaches `until` (the last of them
/// died plus its horizon).
pub(crate) fn unhold(nic: &Nic, index: u32, given: [u64; 4], until: u64) {
    let mut b = book();
    let now = CLOCK.load(Relaxed);
    if let Some(e) = b.entries.get_mut(&(device(nic), index)) {
        e.variants.iter_mut().zip(given).for_each(|(v, g)| *v |= g);
        e.live = e.live.saturating_sub(1);
        e.until = e.until.max(until);
        if e.expired(now) {
            b.swept_at = None;
        }
    }
}

/// An entry with nothing in it.
const EMPTY: Entry = Entry {
    variants: [0; 4],
    live: 0,
    until: 0,
};

impl Book {
    fn insert(&mut self, id: (u64, u32), key: Rkey) {
        let e = self.entries.entry(id).or_insert(EMPTY);
        if e.expired(CLOCK.load(Relaxed)) {
            *e = EMPTY;
        }
        let v = key.variant() as usize;
        e.variants[v / 64] |= 1 << (v % 64);
        e.live += 1;
    }
}

/// `key` (noted) is dead: it stays in the book until `horizon` more grants of the process.
pub(crate) fn release(nic: &Nic, key: Rkey, horizon: u64) {
    let id = (device(nic), key.index());
    let mut b = book();
    let now = CLOCK.load(Relaxed);
    if let Some(e) = b.entries.get_mut(&id) {
        e.live = e.live.saturating_sub(1);
        e.until = e.until.max(now.saturating_add(horizon));
        if e.expired(now) {
            b.swept_at = None;
        }
    }
}

/// The variants of `key`'s index on `nic` a peer may still hold, a bit each.
#[cfg(test)]
fn stale(nic: &Nic, key: Rkey) -> [u64; 4] {
    let b = book();
    let now = CLOCK.load(Relaxed);
    b.entries
        .get(&(device(nic), key.index()))
        .filter(|e| !e.expired(now))
        .map_or([0; 4], |e| e.variants)
}

/// `(entries, capacity, grants refused because the book was full)`, process-wide.
pub(crate) fn counts() -> (usize, usize, u64) {
    let b = book();
    (b.entries.len(), b.capacity, b.refused)
}

/// Set the book's capacity (at least 1) and return the previous one. Entries beyond a lower
/// capacity are kept (nothing is forgotten before its bound); new keys are refused until the
/// book is below it.
pub(crate) fn set_capacity(n: usize) -> usize {
    let mut b = book();
    b.floor = b.entries.len();
    std::mem::replace(&mut b.capacity, n.max(1))
}

/// Check the invariants of the module contract.
pub(crate) fn validate() -> bool {
    let b = book();
    b.entries.len() <= b.capacity.max(b.floor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::soft::SoftConfig;

    #[test]
    fn a_key_stays_stale_for_its_horizon_and_a_full_book_refuses() {
        let nic = Nic::soft_with(SoftConfig {
            name: Some("keybook-unit".into()),
            ..Default::default()
        });
        let key = Rkey(7 << 8 | 3);
        let bit = |s: [u64; 4], v: usize| s[v / 64] & 1 << (v % 64) != 0;
        assert_eq!(claim(&nic, 7, |_| Some(key)), Ok(Some(key)));
        assert!(bit(stale(&nic, key), 3));
        assert!(!bit(stale(&nic, key), 4), "another variant");
        // `pick` sees the stale variants and may refuse.
        assert_eq!(claim(&nic, 7, |s| (!bit(s, 3)).then_some(key)), Ok(None));
        release(&nic, key, 1 << 40);
        assert!(bit(stale(&nic, key), 3), "within the horizon");
        let n = counts().0;
        let old = set_capacity(n);
        let other = Rkey(8 << 8 | 1);
        // Full (unless another test's entry expired meanwhile: then it has room).
        match claim(&nic, 8, |_| Some(other)) {
            Err(Full(cap)) => {
                assert_eq!(cap, n.max(1));
                assert!(!bit(stale(&nic, other), 1), "refused: not noted");
            }
            r => {
                assert_eq!(r, Ok(Some(other)));
                release(&nic, other, 0);
            }
        }
        set_capacity(old);
        // A horizon of 0 gives a key back at once.
        let third = Rkey(9 << 8 | 2);
        assert_eq!(claim(&nic, 9, |_| Some(third)), Ok(Some(third)));
        release(&nic, third, 0);
        assert!(!bit(stale(&nic, third), 2));
        assert!(validate());
    }
}
