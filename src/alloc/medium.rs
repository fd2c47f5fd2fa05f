//! Medium blocks (above 64 KiB, up to `MAX_SMALL`): runs of 8 KiB slots in 2 MiB slabs,
//! first fit, grown and shrunk in place when the neighbouring slots are free — so a `Vec`
//! doubling through these sizes is not copied each time.
//!
//! Contract (the pool's medium paths are at the end of the file): a medium slab is one arena
//! run (one registration); every granule of it is marked
//! `MEDIUM` in the page table, with `start` = the slab. All changes happen under the pool's
//! medium lock; `len` is read without it (`usable_size`). Waste is at most one slot in eight
//! (a block is at least 8 slots).
//!
//! Invariant: for a slab, the set bits of `used` are exactly the union of `[i, i + len[i])`
//! over the slots `i` with `len[i] != 0`, and those runs do not overlap.

use super::class::GRANULE_SHIFT;
use super::page::{MEDIUM, Page};
use super::pool::PoolInner;
use crate::arena::SLAB;
use crate::arena::atfork::ForkGuard;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

const R: Ordering = Ordering::Relaxed;

/// log2 of a slot.
pub(crate) const SLOT_SHIFT: u32 = 13;
/// Slots per slab.
pub(crate) const SLOTS: usize = SLAB >> SLOT_SHIFT;
/// Smallest medium block.
pub(crate) const MEDIUM_MIN: usize = (64 << 10) + 1;
/// Largest alignment a medium block honours.
pub(crate) const MEDIUM_ALIGN: usize = 1 << SLOT_SHIFT;

/// One medium slab's bookkeeping (a table of them, indexed by arena slab, zero-initialised).
pub(crate) struct MediumSlab {
    used: [AtomicU64; SLOTS / 64],
    len: [AtomicU8; SLOTS],
    /// 1 + index of the next slab with room, 0 at the end (the pool's list).
    pub(crate) next: AtomicU64,
}

impl MediumSlab {
    fn bit(&self, i: usize) -> bool {
        self.used[i / 64].load(R) >> (i % 64) & 1 == 1
    }

    fn set(&self, from: usize, to: usize, on: bool) {
        for i in from..to {
            let w = &self.used[i / 64];
            let m = 1u64 << (i % 64);
            w.store(if on { w.load(R) | m } else { w.load(R) & !m }, R);
        }
    }

    /// Whether slots `[from, to)` are all free.
    fn free_run(&self, from: usize, to: usize) -> bool {
        to <= SLOTS && (from..to).all(|i| !self.bit(i))
    }

    /// Take the first run of `n` free slots. Under the medium lock.
    pub(crate) fn take(&self, n: usize) -> Option<usize> {
        let mut i = 0;
        while i + n <= SLOTS {
            match (i..i + n).find(|&j| self.bit(j)) {
                None => {
                    self.set(i, i + n, true);
                    self.len[i].store(n as u8, R);
                    return Some(i);
                }
                Some(j) => i = j + 1,
            }
        }
        None
    }

    /// Slots of the block at slot `i` (0: none).
    pub(crate) fn len_at(&self, i: usize) -> usize {
        self.len.get(i).map_or(0, |l| l.load(R) as usize)
    }

    /// Free the block at slot `i`; returns its slots. Under the medium lock.
    pub(crate) fn give(&self, i: usize) -> usize {
        let n = self.len_at(i);
        if n > 0 {
            self.set(i, i + n, false);
            self.len[i].store(0, R);
        }
        n
    }

    /// Resize the block at slot `i` to `n` slots in place, if its neighbours allow. Under the
    /// medium lock.
    pub(crate) fn resize(&self, i: usize, n: usize) -> bool {
        let cur = self.len_at(i);
        if cur == 0 {
            return false;
        }
        if n <= cur {
            self.set(i + n, i + cur, false);
        } else if self.free_run(i + cur, i + n) {
            self.set(i + cur, i + n, true);
        } else {
            return false;
        }
        self.len[i].store(n as u8, R);
        true
    }

    /// Blocks in the slab.
    /// Whether no slot is in use.
    pub(crate) fn is_empty(&self) -> bool {
        self.used.iter().all(|w| w.load(R) == 0)
    }

    /// Mark every slot of an empty slab used (a purge holds it); false when it is not empty.
    /// `_lock` is the medium lock's guard.
    pub(crate) fn hold(&self, _lock: &ForkGuard<'_, usize>) -> bool {
        if !self.is_empty() {
            return false;
        }
        self.used.iter().for_each(|w| w.store(u64::MAX, R));
        true
    }

    /// Undo [`MediumSlab::hold`].
    pub(crate) fn unhold(&self, _lock: &ForkGuard<'_, usize>) {
        self.used.iter().for_each(|w| w.store(0, R));
    }

    pub(crate) fn blocks(&self) -> u64 {
        self.len.iter().filter(|l| l.load(R) != 0).count() as u64
    }

    /// The invariant above.
    pub(crate) fn validate(&self) -> bool {
        let mut covered = [false; SLOTS];
        for i in 0..SLOTS {
            let n = self.len_at(i);
            for (j, c) in covered.iter_mut().enumerate().skip(i).take(n) {
                if *c || j >= SLOTS {
                    return false;
                }
                *c = true;
            }
        }
        (0..SLOTS).all(|i| covered[i] == self.bit(i))
    }
}

/// Slots for `size` bytes.
pub(crate) fn slots_for(size: usize) -> usize {
    size.div_ceil(1 << SLOT_SHIFT)
}

/// Mark the granules of a fresh medium slab at `start`.
pub(crate) fn mark(descs: impl Iterator<Item = (usize, *const Page)>, start: usize) {
    for (_, d) in descs {
        // SAFETY: descriptors of the pool's page table.
        let d = unsafe { &*d };
        d.start.store(start, R);
        d.kind.store(MEDIUM, Ordering::Release);
    }
}

impl PoolInner {
    /// The medium slab holding `p` and the slot `p` starts.
    fn medium_slot(&self, p: *const u8) -> Option<(&MediumSlab, usize)> {
        let off = (p as usize).wrapping_sub(self.base);
        let slab = self.medium.get(off / SLAB)?;
        Some((slab, (off % SLAB) >> SLOT_SHIFT))
    }

    /// `(first byte, bytes)` of the live medium block holding `addr` (any byte of it).
    pub(crate) fn medium_block(&self, addr: usize) -> Option<(usize, usize)> {
        let (slab, j) = self.medium_slot(addr as *const u8)?;
        let slab_start = addr - (addr - self.base) % SLAB;
        // A block is at most 255 slots long: its head is at most that far back.
        (j.saturating_sub(255)..=j).rev().find_map(|i| {
            let n = slab.len_at(i);
            (n > 0 && i + n > j).then_some((slab_start + (i << SLOT_SHIFT), n << SLOT_SHIFT))
        })
    }

    /// Medium slab `s` (by arena slab index).
    pub(super) fn medium_slab(&self, s: usize) -> Option<&MediumSlab> {
        self.medium.get(s)
    }

    pub(super) fn medium_lock(&self) -> ForkGuard<'_, usize> {
        self.medium_head.lock()
    }

    /// A medium block of `size` bytes (see `medium.rs`), zeroed when `zero`.
    pub(crate) fn alloc_medium(&self, size: usize, zero: bool) -> *mut u8 {
        let n = slots_for(size);
        loop {
            {
                let head = self.medium_lock();
                let mut cur = *head;
                while cur != 0 {
                    let Some(slab) = self.medium.get(cur - 1) else {
                        break;
                    };
                    if let Some(i) = slab.take(n) {
                        self.idle.mark_used(cur - 1);
                        drop(head);
                        let slab_addr = self.base + (cur - 1) * SLAB;
                        if let Err(e) = self.arena.revive(slab_addr as *mut u8, SLAB) {
                            self.count_failure(&e);
                            let _head = self.medium_lock();
                            slab.give(i);
                            return null_mut();
                        }
                        self.medium_live.fetch_add(n << SLOT_SHIFT, R);
                        let p = (slab_addr + (i << SLOT_SHIFT)) as *mut u8;
                        if zero {
                            // SAFETY: the block is ours and `size` bytes long.
                            super::memcheck::unpoison(p, size);
                            // SAFETY: the block is ours and `size` bytes long.
                            unsafe { std::ptr::write_bytes(p, 0, size) };
                        }
                        return p;
                    }
                    cur = slab.next.load(R) as usize;
                }
            }
            // No room: carve a slab, without the lock (the arena may call the NIC).
            let run = match self.arena.alloc_run(SLAB, SLAB) {
                Ok(run) => run,
                Err(e) => {
                    self.count_failure(&e);
                    return null_mut();
                }
            };
            let start = run.as_ptr() as usize;
            super::memcheck::unpoison(run.as_ptr(), SLAB);
            let descs = (start..start + SLAB)
                .step_by(1 << GRANULE_SHIFT)
                .map(|a| (a, self.desc(a) as *const Page));
            mark(descs, start);
            let index = (start - self.base) / SLAB;
            let mut head = self.medium_lock();
            if let Some(slab) = self.medium.get(index) {
                slab.next.store(*head as u64, R);
                *head = index + 1;
            }
        }
    }

    /// Free the medium block at `p`.
    pub(crate) fn free_medium(&self, p: *const u8) {
        if let Some((slab, i)) = self.medium_slot(p) {
            let empty = {
                let _head = self.medium_lock();
                let n = slab.give(i);
                self.medium_live.fetch_sub(n << SLOT_SHIFT, R);
                slab.is_empty()
            };
            if empty {
                self.idle_from((p as usize) & !(SLAB - 1));
                self.maybe_purge();
            }
        }
    }

    /// Resize the medium block at `p` in place to `size` bytes, if its neighbours allow.
    pub(crate) fn resize_medium(&self, p: *const u8, size: usize) -> bool {
        let Some((slab, i)) = self.medium_slot(p) else {
            return false;
        };
        let n = slots_for(size);
        let _head = self.medium_lock();
        let cur = slab.len_at(i);
        if cur == 0 || !slab.resize(i, n) {
            return false;
        }
        if n < cur {
            // Memory-checker mode: the slots given back are filled and poisoned while the lock
            // still keeps them from another thread's allocation.
            let tail = (p as usize + (n << SLOT_SHIFT)) as *mut u8;
            // SAFETY: slots of this slab that just left the block; nobody else has them yet.
            unsafe { super::memcheck::freed(tail, (cur - n) << SLOT_SHIFT, 0) };
        }
        self.medium_live.fetch_add(n << SLOT_SHIFT, R);
        self.medium_live.fetch_sub(cur << SLOT_SHIFT, R);
        true
    }

    /// Bytes usable in the medium block at `p` (0: none starts there).
    pub(crate) fn medium_len(&self, p: *const u8) -> usize {
        self.medium_slot(p)
            .map_or(0, |(slab, i)| slab.len_at(i) << SLOT_SHIFT)
    }
}
