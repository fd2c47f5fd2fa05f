//! The arena's address space: the window, the reservations made in it so far, its chunks and
//! slabs, and the arithmetic from an address to its chunk and slab.
//!
//! Contract:
//! - every address the arena can ever hand out lies in `[base, base + window)`; the first
//!   `reserved_now()` bytes of it (`reserve · k`, `1 <= k`) are reserved, and the reservation
//!   only grows, under the arena's lock ([`Arena::reserve_through`]), never past the window;
//! - an address maps to its chunk with one subtraction and one shift, to its slab with one
//!   subtraction and the slab shift; neither takes a lock nor makes a system call;
//! - [`Arena::span`] (the chunks opened so far) takes the arena's lock, nothing else here does.

use super::{Arena, Error, SLAB_SHIFT, State};
use std::sync::atomic::Ordering;

impl Arena {
    /// First byte of the reservation.
    pub(crate) fn base(&self) -> usize {
        self.base
    }

    /// Bytes of address space held from [`Arena::base`]: every address the arena can ever
    /// hand out lies in `[base, base + window)`.
    pub(crate) fn window(&self) -> usize {
        self.window
    }

    /// Bytes reserved so far: one or more reservations of the configured `reserve`.
    pub(super) fn reserved_now(&self) -> usize {
        self.reserved.load(Ordering::Relaxed)
    }

    /// Bytes from the start of the reservation to the end of the last chunk opened.
    pub(crate) fn span(&self) -> usize {
        self.lock().next_chunk << self.chunk_shift
    }

    /// Bytes per chunk actually used (the configured size clamped to `max_mr_size`).
    pub fn chunk_size(&self) -> usize {
        1 << self.chunk_shift
    }

    /// Whether `ptr` lies in the arena's address space (registered or not).
    pub fn contains(&self, ptr: *const u8) -> bool {
        (ptr as usize).wrapping_sub(self.base) < self.window
    }

    /// The chunk `ptr` lies in: one subtraction and one shift.
    ///
    /// # Examples
    /// ```
    /// # use rdma_pool::arena::{Arena, ArenaConfig, Hugepages};
    /// # let pd = rdma_pool::nic::Nic::soft().alloc_pd()?;
    /// # let cfg = ArenaConfig { reserve: 1 << 30, chunk: 1 << 26, hugepages: Hugepages::Off, ..Default::default() };
    /// # let arena = Arena::new(&pd, cfg)?;
    /// let run = arena.alloc_run(4096, 64)?;
    /// assert_eq!(arena.chunk_of(run.as_ptr()), Some(0));
    /// assert_eq!(arena.chunk_of(run.as_ptr().wrapping_add(1 << 26)), Some(1));
    /// # Ok::<(), rdma_pool::PoolError>(())
    /// ```
    pub fn chunk_of(&self, ptr: *const u8) -> Option<usize> {
        let off = (ptr as usize).wrapping_sub(self.base);
        (off < self.window).then_some(off >> self.chunk_shift)
    }

    pub(super) fn chunk_base(&self, c: usize) -> usize {
        self.base + (c << self.chunk_shift)
    }

    pub(crate) fn slab_index(&self, addr: usize) -> usize {
        (addr - self.base) >> SLAB_SHIFT
    }

    /// Chunks in the reservations made so far.
    pub(super) fn chunks(&self) -> usize {
        self.reserved_now() >> self.chunk_shift
    }

    /// The error for a run the window has no room for.
    pub(super) fn full(&self) -> Error {
        Error::ReservationFull {
            reserved: self.reserved_now(),
        }
    }

    /// Chunks in the whole window.
    pub(super) fn window_chunks(&self) -> usize {
        self.window >> self.chunk_shift
    }

    /// Add reservations behind the last until chunks `[c, c + m)` are reserved (under the
    /// lock: `_st` proves it); false when the window has no room for them.
    pub(super) fn reserve_through(&self, _st: &mut State, c: usize, m: usize) -> bool {
        let need = (c + m) << self.chunk_shift;
        let mut now = self.reserved_now();
        if need > self.window {
            return false;
        }
        while now < need {
            now += self.reserve;
        }
        self.reserved.store(now, Ordering::Relaxed);
        true
    }
}
