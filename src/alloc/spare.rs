//! Spare slabs: purged address space any later run may take, whatever it was cut into before.
//!
//! Contract: a slab becomes spare when a purge returned it to the system and nothing of it is
//! listed any more — a slab of empty pages (any page size), a slab-sized page, a freed large
//! run (each of its slabs). Its descriptors are reset to `UNUSED`. A fresh page or large run
//! takes spare slabs (first fit, aligned; within one chunk, or — for a run of more than a
//! chunk — within one registration, so that a revived run is one SGE) before the arena opens
//! fresh address space, and revives them. So the address
//! space of the reservation is never left behind in a free list of one size: a workload that
//! moves from one shape to another reuses what the previous shape freed.
//!
//! Invariant: a spare slab is purged in the arena, in no free list, and every granule
//! descriptor of it is `UNUSED`; `count == |spare bits|`.

use crate::sys::atfork::ForkLock;
use crate::sys::os::MmapArray;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// A bitmap of spare slabs under one lock.
pub(crate) struct Spare {
    bits: MmapArray<AtomicU64>,
    lock: ForkLock<()>,
    /// Spare slabs (read without the lock to skip it when there are none).
    count: AtomicUsize,
    slabs: usize,
    /// Slab 0's index in the address space (its address / `SLAB`): alignment is of
    /// addresses, and the reservation is aligned only to a chunk.
    origin: usize,
}

impl Spare {
    /// A bitmap for `slabs` slabs, slab 0 at address `origin · SLAB`.
    pub(crate) fn new(slabs: usize, origin: usize) -> Result<Spare, i32> {
        Ok(Spare {
            // SAFETY: zero is "not spare".
            bits: unsafe { MmapArray::zeroed(slabs.div_ceil(64))? },
            lock: ForkLock::new(()),
            count: AtomicUsize::new(0),
            slabs,
            origin,
        })
    }

    fn word(&self, s: usize) -> &AtomicU64 {
        self.bits
            .get(s / 64)
            .expect("slab index in the reservation")
    }

    fn is_spare(&self, s: usize) -> bool {
        self.word(s).load(Relaxed) >> (s % 64) & 1 == 1
    }

    fn set(&self, s: usize, on: bool) {
        let w = self.word(s);
        let m = 1u64 << (s % 64);
        w.store(
            if on {
                w.load(Relaxed) | m
            } else {
                w.load(Relaxed) & !m
            },
            Relaxed,
        );
    }

    /// Slabs `[s, s + n)` are spare.
    pub(crate) fn put(&self, s: usize, n: usize) {
        let _g = self.lock.lock();
        for i in s..(s + n).min(self.slabs) {
            if !self.is_spare(i) {
                self.set(i, true);
                self.count.fetch_add(1, Relaxed);
            }
        }
    }

    /// Take `n` spare slabs whose first slab's address is a multiple of `align` slabs, that do
    /// not cross a multiple of `chunk` (in slabs) unless `n` is more than a chunk, the first fitting range
    /// `[s, s + n)` for which `ok(s)` holds (e.g. that it lies in one registration); the first
    /// slab's index.
    pub(crate) fn take_if(
        &self,
        n: usize,
        align: usize,
        chunk: usize,
        ok: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        if self.count.load(Relaxed) < n || n == 0 {
            return None;
        }
        let _g = self.lock.lock();
        let align = align.max(1);
        // The first slab index from `s` on whose address is aligned.
        let up = |s: usize| (self.origin + s).next_multiple_of(align) - self.origin;
        let mut s = up(0);
        while s + n <= self.slabs {
            // No spare slab from `s` to the end of its word: skip to the next word.
            if self.word(s).load(Relaxed) >> (s % 64) == 0 {
                s = up((s / 64 + 1) * 64);
                continue;
            }
            let crosses = n <= chunk && s / chunk != (s + n - 1) / chunk;
            if crosses {
                s = up((s / chunk + 1) * chunk);
                continue;
            }
            match (s..s + n).find(|&i| !self.is_spare(i)) {
                None if !ok(s) => s = up(s + 1),
                None => {
                    (s..s + n).for_each(|i| self.set(i, false));
                    self.count.fetch_sub(n, Relaxed);
                    return Some(s);
                }
                Some(busy) => s = up(busy + 1),
            }
        }
        None
    }

    /// Spare slabs now (statistics).
    pub(crate) fn count(&self) -> usize {
        self.count.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::Spare;

    #[test]
    fn take_finds_aligned_ranges_past_empty_words_and_asks_the_predicate() {
        let sp = Spare::new(1024, 0).unwrap();
        assert_eq!(sp.take_if(1, 1, 64, |_| true), None);
        // Spare: slab 3, slabs 700..712, slabs 900..964 (crossing a 64-slab chunk at 960).
        sp.put(3, 1);
        sp.put(700, 12);
        sp.put(900, 64);
        assert_eq!(sp.count(), 77);
        // Aligned to 4 and within one chunk of 64: 700..708 would cross 704.
        assert_eq!(sp.take_if(8, 4, 64, |_| true), Some(704));
        // 700..704 is too short; 900..960 holds 60 in chunk 14.
        assert_eq!(sp.take_if(60, 1, 64, |_| true), Some(900));
        // More than a chunk may cross chunks; the predicate refuses the first candidates.
        sp.put(900, 60);
        assert_eq!(sp.take_if(65, 1, 64, |_| true), None);
        assert_eq!(sp.take_if(50, 1, 64, |s| s >= 905), Some(905));
        assert_eq!(sp.take_if(1, 1, 64, |_| true), Some(3));
        assert_eq!(sp.count(), 77 - 8 - 50 - 1);
    }
}

#[cfg(test)]
mod origin_tests {
    use super::Spare;

    #[test]
    fn alignment_is_of_addresses_not_of_indices() {
        // Slab 0 lies at slab 5 of the address space: index 3 is address slab 8.
        let sp = Spare::new(256, 5).unwrap();
        sp.put(0, 40);
        assert_eq!(sp.take_if(2, 8, 64, |_| true), Some(3));
        assert_eq!(sp.take_if(2, 16, 64, |_| true), Some(11));
        // Aligned to 32 slabs (more than a chunk of 16): address slab 32 is index 27.
        sp.put(0, 40);
        assert_eq!(sp.take_if(1, 32, 16, |_| true), Some(27));
    }
}
