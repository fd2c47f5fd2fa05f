//! The heaps of a pool: one per thread using it, taken and given back in O(1).
//!
//! Contract: heaps live in one array mapped from the kernel (`MAP_NORESERVE`: a heap's pages
//! cost memory only once a thread used it), [`MAX_HEAPS`] long — shorter (`cap`, halved down
//! to [`MIN_HEAPS`]) under an address-space limit: at most an eighth of what it leaves. A thread claims a heap the
//! first time it allocates in the pool: the most recently given-back heap (a stack under one
//! lock, linked through `Heap::next_free`), else a never-used one at `top`. No path scans the
//! heaps to find a free one; only statistics and the purge's collection of abandoned heaps walk
//! `[0, top)`. A heap given back keeps its non-empty pages for its next owner.
//!
//! A few heaps, each reserved on first use, are no thread's: the provisioning heap
//! (`heap/provisioning.rs`) and the shared heaps (`heap/shared.rs`, two per CPU up to
//! [`MAX_SHARED`]), held for one allocation at a time, never on the free stack.
//!
//! Invariant: `top <= cap <= MAX_HEAPS`; a heap below `top` other than the provisioning and
//! shared heaps is on the free stack iff its owner is 0 or the purge's token (which gives it
//! back to 0 before anyone else can claim it); heaps at or above `top` are all zero.

use super::heap::{Heap, MAX_SHARED};
use super::pool::PoolInner;
use crate::sys::atfork::ForkLock;
use crate::sys::os::MmapArray;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Most heaps a pool holds: threads that may use one pool at the same time.
pub(crate) const MAX_HEAPS: usize = 1 << 16;

/// Fewest heaps an address-space limit may leave a pool.
const MIN_HEAPS: usize = 64;

/// See the module contract.
pub(crate) struct Heaps {
    array: MmapArray<Heap>,
    /// The array's length.
    cap: usize,
    /// Heaps ever handed out: `[0, top)` is in use or on the free stack.
    top: AtomicUsize,
    /// `1 +` index of the most recently given-back heap (0: none).
    free: ForkLock<u32>,
    claims: AtomicU64,
    /// `1 +` index of the provisioning heap (0: not reserved yet).
    meta: AtomicUsize,
    /// `1 +` index of each shared heap (0: not reserved yet).
    shared: [AtomicUsize; MAX_SHARED],
    /// Shared heaps in use: two per CPU the process may run on, `4..=MAX_SHARED`.
    shared_count: usize,
}

impl Heaps {
    pub(crate) fn new() -> Result<Heaps, i32> {
        let mut cap = MAX_HEAPS;
        // Under an address-space limit the array takes at most an eighth of what is left
        // (the heap itself needs the rest).
        if let Some(room) = crate::sys::os::address_space_headroom() {
            while cap > MIN_HEAPS && cap * size_of::<Heap>() > room / 8 {
                cap /= 2;
            }
        }
        let array = loop {
            // SAFETY: an all-zero heap is unclaimed and uninitialised.
            match unsafe { MmapArray::zeroed(cap) } {
                Ok(a) => break a,
                Err(libc::ENOMEM) if cap > MIN_HEAPS => cap /= 2,
                Err(e) => return Err(e),
            }
        };
        Ok(Heaps {
            array,
            cap,
            top: AtomicUsize::new(0),
            free: ForkLock::new(0),
            claims: AtomicU64::new(0),
            meta: AtomicUsize::new(0),
            shared: [const { AtomicUsize::new(0) }; MAX_SHARED],
            shared_count: (2 * crate::sys::numa::cpus_online()).clamp(4, MAX_SHARED),
        })
    }

    /// Heaps ever handed out (statistics).
    pub(crate) fn top(&self) -> usize {
        self.top.load(Ordering::Acquire).min(self.cap)
    }

    /// Heaps claimed so far (statistics).
    pub(crate) fn claims(&self) -> u64 {
        self.claims.load(Ordering::Relaxed)
    }

    /// Every heap ever handed out, owned or not.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Heap> {
        (0..self.top()).filter_map(|i| self.array.get(i))
    }

    /// Claim a heap for the thread whose token is `me` (never 0), initialised for `pool`.
    /// `None` when every heap (`cap`, [`MAX_HEAPS`] unless the address space was short) is
    /// held.
    pub(crate) fn claim(&self, me: u64, pool: &PoolInner) -> Option<&Heap> {
        let h = self.pop().or_else(|| {
            let i = self.top.fetch_add(1, Ordering::AcqRel);
            if i >= self.cap {
                self.top.fetch_sub(1, Ordering::AcqRel);
                return None;
            }
            self.array.get(i)
        })?;
        // A popped heap may be held by the purge for a moment (`purge.rs`): it gives it back.
        while h
            .owner
            .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::thread::yield_now();
        }
        h.cache_claimed();
        h.claimed_young();
        h.init(pool);
        self.claims.fetch_add(1, Ordering::Relaxed);
        Some(h)
    }

    /// The provisioning heap, reserved now if it was not (a never-used heap: `None` when none
    /// is left). Its owner is 0 while nobody holds it.
    pub(crate) fn meta(&self) -> Option<&Heap> {
        self.reserved(&self.meta)
    }

    /// Shared heaps in use (`heap/shared.rs`).
    pub(crate) fn shared_count(&self) -> usize {
        self.shared_count
    }

    /// Shared heap `i` (below [`Heaps::shared_count`]), reserved now if it was not (`None`
    /// when no heap is left). Its owner is 0 while nobody holds it.
    pub(crate) fn shared(&self, i: usize) -> Option<&Heap> {
        self.reserved(self.shared.get(i)?)
    }

    /// Shared heap `i`, if it was reserved.
    pub(crate) fn shared_if_reserved(&self, i: usize) -> Option<&Heap> {
        let i = self.shared.get(i)?.load(Ordering::Acquire);
        self.array.get(i.checked_sub(1)?)
    }

    /// The heap whose `1 +` index `slot` holds, reserved now if it holds 0: a never-used heap,
    /// marked as no thread's before it is published.
    fn reserved(&self, slot: &AtomicUsize) -> Option<&Heap> {
        let i = slot.load(Ordering::Acquire);
        if i != 0 {
            return self.array.get(i - 1);
        }
        let i = self.top.fetch_add(1, Ordering::AcqRel);
        if i >= self.cap {
            self.top.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        let h = self.array.get(i)?;
        h.never_young();
        match slot.compare_exchange(0, i + 1, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Some(h),
            Err(won) => {
                // Another thread reserved one first: this one serves threads (a claim resets
                // its mark).
                self.give_back(h);
                self.array.get(won - 1)
            }
        }
    }

    /// Give `heap` (released, its owner reset to 0 by the caller) back for the next thread.
    pub(crate) fn give_back(&self, heap: &Heap) {
        let Some(i) = self.index_of(heap) else {
            return;
        };
        let mut head = self.free.lock();
        heap.next_free.store(*head, Ordering::Relaxed);
        *head = i as u32 + 1;
    }

    fn pop(&self) -> Option<&Heap> {
        let mut head = self.free.lock();
        let h = self.array.get((*head as usize).checked_sub(1)?)?;
        *head = h.next_free.load(Ordering::Relaxed);
        Some(h)
    }

    fn index_of(&self, heap: &Heap) -> Option<usize> {
        let base = self.array.get(0)? as *const Heap as usize;
        let off = (heap as *const Heap as usize).checked_sub(base)?;
        let i = off / size_of::<Heap>();
        (i < self.top()).then_some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::MAX_HEAPS;

    #[test]
    fn the_heap_array_is_address_space_not_memory() {
        // 64 Ki heaps of a few tens of KiB: reserved, never committed up front.
        let bytes = MAX_HEAPS * size_of::<super::Heap>();
        assert!(bytes < 4 << 30, "{bytes} bytes of heaps per pool");
    }
}
