//! The ledger: which blocks have a live or revoking grant, and the quarantine of those freed
//! meanwhile.
//!
//! Contract: every grant owns one record from the moment it is issued until its revocation
//! completed (the peer's key is dead). While a record is open, the granule descriptor of its
//! block's first byte counts it (`Page::granted`), so a free of a block there takes the cold
//! path [`Ledger::park`]; a block freed while a record on it is open is *parked* (kept out of
//! the pool: neither reused nor purged) and handed back by the [`Ledger::close`] of its last
//! record. The ledger lives in memory mapped from the kernel and its lock guards no
//! allocation, so the free path of a `GlobalAlloc` may take it from anywhere.
//!
//! Invariants (under the lock): `open + |free stack| == high <= CAP`; for every block `b`,
//! `granted(granule(b)) >= |{open records on b}|`; a parked block has an open record.

use crate::sys::atfork::{ForkGuard, ForkLock};
use crate::sys::os::MmapArray;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::Relaxed};

/// Most grants open (live or revoking) at once per pool.
pub(crate) const CAP: usize = 1 << 16;

/// One grant's claim on a block. Fields are atomics only to be shared; they change under the
/// ledger's lock.
#[derive(Default)]
struct Record {
    open: AtomicBool,
    parked: AtomicBool,
    /// First byte of the block the grant lies in.
    block: AtomicUsize,
    /// Its usable bytes.
    block_len: AtomicUsize,
    /// `index + 1` of the next free record.
    next_free: AtomicU32,
}

#[derive(Default)]
struct Head {
    /// Records ever used.
    high: u32,
    /// `index + 1` of the first free record below `high`, 0 for none.
    free: u32,
    open: u32,
    parked: u32,
    parked_bytes: usize,
}

/// See the module contract.
pub(crate) struct Ledger {
    head: ForkLock<Head>,
    records: MmapArray<Record>,
}

impl Ledger {
    pub(crate) fn new() -> Result<Ledger, i32> {
        Ok(Ledger {
            head: ForkLock::new(Head::default()),
            // SAFETY: all-zero records are closed, unparked and unlinked.
            records: unsafe { MmapArray::zeroed(CAP)? },
        })
    }

    fn head(&self) -> ForkGuard<'_, Head> {
        self.head.lock()
    }

    fn rec(&self, i: u32) -> &Record {
        self.records
            .get(i as usize)
            .expect("record indices are below CAP")
    }

    /// Open a record for a grant in `[block, block + block_len)`, counting it in the block's
    /// granule flag. `None` when [`CAP`] records are open.
    pub(crate) fn open(&self, block: usize, block_len: usize, flag: &AtomicU32) -> Option<u32> {
        let mut h = self.head();
        let i = if h.free != 0 {
            let i = h.free - 1;
            h.free = self.rec(i).next_free.load(Relaxed);
            i
        } else if (h.high as usize) < CAP {
            h.high += 1;
            h.high - 1
        } else {
            return None;
        };
        let r = self.rec(i);
        r.block.store(block, Relaxed);
        r.block_len.store(block_len, Relaxed);
        r.parked.store(false, Relaxed);
        r.open.store(true, Relaxed);
        h.open += 1;
        flag.fetch_add(1, Relaxed);
        Some(i)
    }

    /// Close record `i` (its grant's key is dead). Returns the block to free now, if it was
    /// parked and no other open record holds it.
    pub(crate) fn close(&self, i: u32, flag: &AtomicU32) -> Option<(usize, usize)> {
        let mut h = self.head();
        let r = self.rec(i);
        if !r.open.load(Relaxed) {
            return None;
        }
        r.open.store(false, Relaxed);
        flag.fetch_sub(1, Relaxed);
        h.open -= 1;
        let block = r.block.load(Relaxed);
        let parked = r.parked.swap(false, Relaxed);
        r.next_free.store(h.free, Relaxed);
        h.free = i + 1;
        if !parked {
            return None;
        }
        // Another open record on the same block inherits the parking.
        for j in 0..h.high {
            let o = self.rec(j);
            if o.open.load(Relaxed) && o.block.load(Relaxed) == block {
                o.parked.store(true, Relaxed);
                return None;
            }
        }
        let len = r.block_len.load(Relaxed);
        h.parked -= 1;
        h.parked_bytes -= len;
        Some((block, len))
    }

    /// The free path's cold branch: true when `block` has an open record, and is now parked
    /// (the caller must not free it); false when the caller frees it as usual.
    pub(crate) fn park(&self, block: usize) -> bool {
        let mut h = self.head();
        let mut len = None;
        for j in 0..h.high {
            let o = self.rec(j);
            if o.open.load(Relaxed) && o.block.load(Relaxed) == block {
                o.parked.store(true, Relaxed);
                len = Some(o.block_len.load(Relaxed));
            }
        }
        let Some(len) = len else {
            return false;
        };
        h.parked += 1;
        h.parked_bytes += len;
        true
    }

    /// `(open records, parked blocks, parked bytes)`.
    pub(crate) fn counts(&self) -> (u32, u32, usize) {
        let h = self.head();
        (h.open, h.parked, h.parked_bytes)
    }

    /// Check the invariants of the module contract (at quiescence; for tests).
    pub(crate) fn validate(&self) -> bool {
        let h = self.head();
        let mut free = 0;
        let mut f = h.free;
        while f != 0 && free <= h.high {
            free += 1;
            f = self.rec(f - 1).next_free.load(Relaxed);
        }
        let open = (0..h.high)
            .filter(|&j| self.rec(j).open.load(Relaxed))
            .count() as u32;
        let parked_ok = (0..h.high).all(|j| {
            let r = self.rec(j);
            !r.parked.load(Relaxed) || r.open.load(Relaxed)
        });
        open == h.open && open + free == h.high && parked_ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_freed_under_two_grants_comes_back_with_the_last() {
        let l = Ledger::new().unwrap();
        let flag = AtomicU32::new(0);
        let a = l.open(4096, 64, &flag).unwrap();
        let b = l.open(4096, 64, &flag).unwrap();
        assert_eq!(flag.load(Relaxed), 2);
        assert!(!l.park(8192), "another block is freed as usual");
        assert!(l.park(4096));
        assert_eq!(l.counts(), (2, 1, 64));
        assert_eq!(l.close(a, &flag), None, "b still holds it");
        assert_eq!(l.close(b, &flag), Some((4096, 64)));
        assert_eq!(l.close(b, &flag), None, "closing twice does nothing");
        assert_eq!((l.counts(), flag.load(Relaxed)), ((0, 0, 0), 0));
        assert!(l.validate());
        // Records are reused.
        let c = l.open(1, 1, &flag).unwrap();
        assert!(c == a || c == b);
        assert!(l.validate());
    }
}
