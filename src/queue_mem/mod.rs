//! DEVX queue memory: QP, CQ and doorbell buffers for queues an mlx5 service builds itself
//! (`mlx5dv_devx_obj_create`), carved from a few large UMEMs on the arena's hugepage slabs
//! instead of one UMEM per queue.
//!
//! ```text
//! let sq = pool.queue_memory(64 << 10, 4096)?;   // a send queue buffer, page aligned
//! let db = pool.queue_memory(64, 64)?;           // its doorbell record
//! // QP context: wq_umem_id = sq.umem_id(), wq_umem_offset = sq.offset(),
//! //             dbr_umem_id = db.umem_id(), dbr_addr = db.offset()
//! ```
//!
//! Contract:
//! - Queue memory lives in a part of the arena that **no region covers** (a UMEM over memory a
//!   pinned region already covers pins it twice) and that is never purged: the device keeps
//!   writing where it was told to (`Arena::alloc_unregistered`).
//! - A UMEM ([`UMEM_BYTES`], or more for a larger carve) is registered with the page sizes its
//!   slabs allow: `2 MiB | 4 KiB` on hugetlb slabs (2 MiB aligned), `4 KiB` otherwise. A carve
//!   never crosses a UMEM; its offset is a multiple of its alignment (64 B for doorbell
//!   records, at least the 4 KiB page for queue buffers), checked in debug builds.
//! - A freed carve returns to its UMEM. A UMEM with no carve left is deregistered (its slabs
//!   wait, committed, for the next UMEM), except the last one, kept for the next carve.
//! - On a device without DEVX (kernel rxe, a soft NIC configured so) every call is a typed
//!   [`QueueMemError::Unsupported`], never a crash.
//!
//! Invariant (checked by `Pool::validate` through `QueueMem::validate`): for every UMEM,
//! `carved == 64 · |set bits|`, and the live carves' ranges are disjoint and inside it.

mod area;
mod error;

pub use error::QueueMemError;

use crate::alloc::Core;
use crate::arena::{PageKind, SLAB};
use crate::sys::atfork::{ForkGuard, ForkLock};
use area::Area;
use std::ptr::NonNull;

/// Bytes of a UMEM the pool carves queue memory from (a larger carve gets one of its own).
pub const UMEM_BYTES: usize = 8 << 20;

/// The smallest carve and alignment: a doorbell record.
pub const UNIT: usize = 64;

/// A carve of queue memory: what a DEVX object needs (UMEM id and offset) and the CPU pointer.
/// Dropping it returns the memory to its UMEM (destroy the DEVX object using it first).
#[must_use = "dropping queue memory returns it"]
pub struct QueueBuf<'p> {
    queue: &'p QueueMem,
    area: u32,
    umem_id: u32,
    offset: usize,
    len: usize,
    ptr: NonNull<u8>,
    page_size: usize,
}

// SAFETY: the carve is plain memory owned by this handle; the pool is `Sync`.
unsafe impl Send for QueueBuf<'_> {}
// SAFETY: as above; `&QueueBuf` hands out only the address.
unsafe impl Sync for QueueBuf<'_> {}

impl std::fmt::Debug for QueueBuf<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueBuf")
            .field("umem_id", &self.umem_id)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("page_size", &self.page_size)
            .finish()
    }
}

impl QueueBuf<'_> {
    /// The UMEM id for the DEVX object (`wq_umem_id`, `dbr_umem_id`, `cq_umem_id`).
    pub fn umem_id(&self) -> u32 {
        self.umem_id
    }
    /// The carve's offset in its UMEM (`wq_umem_offset`, `dbr_addr`, …).
    pub fn offset(&self) -> u64 {
        self.offset as u64
    }
    /// The CPU's pointer to the carve.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    /// Bytes (the request rounded up to 64).
    pub fn len(&self) -> usize {
        self.len
    }
    /// Never true.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The largest page size the UMEM was registered with (2 MiB on hugetlb slabs, else 4 KiB).
    pub fn page_size(&self) -> usize {
        self.page_size
    }
}

impl Drop for QueueBuf<'_> {
    fn drop(&mut self) {
        self.queue.free(self.area, self.offset, self.len);
    }
}

/// What queue memory holds, under its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct QueueStats {
    /// UMEMs registered.
    pub umems: u64,
    /// Their bytes.
    pub umem_bytes: u64,
    /// ... of which UMEMs with 2 MiB pages (hugetlb slabs).
    pub umems_2m: u64,
    /// Live carves.
    pub carves: u64,
    /// Their bytes.
    pub carved_bytes: u64,
    /// Committed slabs waiting for a UMEM (of UMEMs deregistered when they emptied).
    pub spare_bytes: u64,
}

/// The pool's queue memory (a field of its shared state).
#[derive(Default)]
pub(crate) struct QueueMem {
    state: ForkLock<State>,
}

#[derive(Default)]
struct State {
    /// Areas by index (`None`: deregistered, free for the next area: no carve names an area
    /// that emptied).
    areas: Vec<Option<Area>>,
    /// Committed runs of deregistered areas: `(addr, len, kind)`.
    spare: Vec<(usize, usize, PageKind)>,
}

impl QueueMem {
    fn lock(&self) -> ForkGuard<'_, State> {
        self.state.lock()
    }

    /// Return a carve; deregister its UMEM if that left it empty and another empty one is kept.
    fn free(&self, area: u32, offset: usize, len: usize) {
        let mut st = self.lock();
        let Some(Some(a)) = st.areas.get_mut(area as usize) else {
            return;
        };
        a.give(offset, len);
        if !a.is_empty() {
            return;
        }
        let other_empty = st
            .areas
            .iter()
            .enumerate()
            .any(|(i, x)| i != area as usize && x.as_ref().is_some_and(Area::is_empty));
        if other_empty {
            if let Some(a) = st.areas[area as usize].take() {
                let run = a.run();
                // Deregistering cannot fail for a UMEM no object uses; if it does, the UMEM
                // is dropped (logged) and its memory kept out of the spare list.
                if a.dereg() {
                    st.spare.push(run);
                }
            }
        }
    }

    pub(crate) fn stats(&self) -> QueueStats {
        let st = self.lock();
        let mut s = QueueStats {
            spare_bytes: st.spare.iter().map(|r| r.1 as u64).sum(),
            ..Default::default()
        };
        for a in st.areas.iter().flatten() {
            s.umems += 1;
            s.umem_bytes += a.len() as u64;
            s.umems_2m += (a.page_size() == SLAB) as u64;
            s.carves += a.carves();
            s.carved_bytes += a.carved() as u64;
        }
        s
    }

    pub(crate) fn validate(&self) -> bool {
        self.lock().areas.iter().flatten().all(Area::validate)
    }
}

impl QueueMem {
    /// `len` bytes aligned to `align` for [`Pool::queue_memory_with`](crate::Pool::queue_memory_with),
    /// carved from a UMEM of `core`'s NIC over `core`'s arena.
    ///
    /// # Errors
    /// As `Pool::queue_memory_with`.
    pub(crate) fn carve_from(
        &self,
        core: &Core,
        len: usize,
        align: usize,
        pgsz_bitmap: Option<u64>,
    ) -> Result<QueueBuf<'_>, QueueMemError> {
        if len == 0 {
            return Err(QueueMemError::InvalidArgument("zero-length queue memory"));
        }
        if !align.is_power_of_two() || align > SLAB {
            return Err(QueueMemError::InvalidArgument(
                "alignment must be a power of two up to 2 MiB",
            ));
        }
        if !core.nic().caps().devx {
            return Err(QueueMemError::Unsupported);
        }
        // A length the address space cannot hold is refused before it is rounded (it would
        // wrap to a zero-length carve).
        let Some(len) = len.checked_next_multiple_of(UNIT).filter(|l| {
            l.checked_next_multiple_of(SLAB)
                .is_some_and(|l| l <= isize::MAX as usize)
        }) else {
            return Err(QueueMemError::InvalidArgument(
                "queue memory longer than the address space",
            ));
        };
        let align = align.max(UNIT);
        let mut st = self.lock();
        for (i, a) in st.areas.iter_mut().enumerate() {
            if let Some(off) = a.as_mut().and_then(|a| a.take(len, align)) {
                let a = a.as_ref().expect("just carved");
                return Ok(self.carve(i, a, off, len));
            }
        }
        // A new UMEM: on spare slabs if they fit, else on fresh ones.
        let want = len
            .max(UMEM_BYTES.min(core.arena().chunk_size()))
            .next_multiple_of(SLAB);
        let run = match st.spare.iter().position(|r| r.1 >= want) {
            Some(i) => st.spare.swap_remove(i),
            None => {
                let (run, kind) = core.arena().alloc_unregistered(want)?;
                (run.as_ptr() as usize, run.len(), kind)
            }
        };
        let mut a = match Area::register(core.nic(), run, pgsz_bitmap) {
            Ok(a) => a,
            Err(e) => {
                st.spare.push(run);
                return Err(e);
            }
        };
        let off = a.take(len, align).expect("a fresh UMEM holds the carve");
        // A deregistered area's slot is free: no carve names an area that emptied.
        let i = match st.areas.iter().position(Option::is_none) {
            Some(i) => {
                st.areas[i] = Some(a);
                i
            }
            None => {
                st.areas.push(Some(a));
                st.areas.len() - 1
            }
        };
        let a = st.areas[i].as_ref().expect("just pushed");
        Ok(self.carve(i, a, off, len))
    }

    fn carve(&self, i: usize, a: &Area, off: usize, len: usize) -> QueueBuf<'_> {
        let ptr = a.addr() + off;
        debug_assert!(a.addr() % a.page_size() == 0 && off + len <= a.len());
        QueueBuf {
            queue: self,
            area: i as u32,
            umem_id: a.umem_id(),
            offset: off,
            len,
            ptr: NonNull::new(ptr as *mut u8).expect("arena memory is never null"),
            page_size: a.page_size(),
        }
    }
}
