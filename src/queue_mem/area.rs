//! One UMEM and its carves: a bitmap of 64-byte units, first fit at the carve's alignment.
//!
//! Invariant: `carved == UNIT · |set bits|`, `carves` live carves, every set run inside the
//! UMEM.

use super::{QueueMemError, UNIT};
use crate::arena::{PageKind, SLAB};
use crate::nic::{Access, Nic, Umem};

/// A registered UMEM over committed slabs no region covers.
pub(super) struct Area {
    umem: Umem,
    kind: PageKind,
    page_size: usize,
    bits: Vec<u64>,
    carved: usize,
    carves: u64,
}

/// The page sizes a UMEM over slabs of `kind` at a 2 MiB-aligned address may use.
fn bitmap_for(kind: PageKind) -> u64 {
    match kind {
        PageKind::Hugetlb => (SLAB as u64) | 4096,
        PageKind::Thp | PageKind::Small => 4096,
    }
}

impl Area {
    /// Register `(addr, len, kind)` as a UMEM of `nic`, with `pgsz_bitmap` or the page sizes
    /// the slabs allow.
    pub(super) fn register(
        nic: &Nic,
        (addr, len, kind): (usize, usize, PageKind),
        pgsz_bitmap: Option<u64>,
    ) -> Result<Area, QueueMemError> {
        let bitmap = pgsz_bitmap.unwrap_or_else(|| bitmap_for(kind));
        // SAFETY: the slabs stay committed while the arena lives and no region covers them;
        // the UMEM is deregistered (dropped) before the arena goes, with the pool's state.
        let umem = unsafe { nic.umem_reg(addr as *mut u8, len, Access::LOCAL_WRITE, bitmap) }
            .map_err(|e| match &e {
                crate::nic::Error::Verb { source, .. }
                    if source.raw_os_error() == Some(libc::EINVAL) =>
                {
                    QueueMemError::PageSize { bitmap }
                }
                crate::nic::Error::Unsupported { .. } => QueueMemError::Unsupported,
                _ => QueueMemError::Nic(e),
            })?;
        // The largest page size asked for that the slabs can back.
        let page_size = if bitmap & SLAB as u64 != 0 && kind == PageKind::Hugetlb {
            SLAB
        } else {
            4096
        };
        Ok(Area {
            umem,
            kind,
            page_size,
            bits: vec![0; (len / UNIT).div_ceil(64)],
            carved: 0,
            carves: 0,
        })
    }

    pub(super) fn addr(&self) -> usize {
        self.umem.addr()
    }
    pub(super) fn len(&self) -> usize {
        self.umem.len()
    }
    pub(super) fn umem_id(&self) -> u32 {
        self.umem.id()
    }
    pub(super) fn page_size(&self) -> usize {
        self.page_size
    }
    pub(super) fn carved(&self) -> usize {
        self.carved
    }
    pub(super) fn carves(&self) -> u64 {
        self.carves
    }
    pub(super) fn is_empty(&self) -> bool {
        self.carves == 0
    }
    /// The committed run under the UMEM.
    pub(super) fn run(&self) -> (usize, usize, PageKind) {
        (self.addr(), self.len(), self.kind)
    }

    fn bit(&self, u: usize) -> bool {
        self.bits[u / 64] & (1 << (u % 64)) != 0
    }

    fn set(&mut self, from: usize, n: usize, on: bool) {
        for u in from..from + n {
            if on {
                self.bits[u / 64] |= 1 << (u % 64);
            } else {
                self.bits[u / 64] &= !(1 << (u % 64));
            }
        }
    }

    /// Carve `len` bytes (a multiple of [`UNIT`]) at an offset that is a multiple of `align`:
    /// the offset, or `None` when the UMEM has no such room.
    pub(super) fn take(&mut self, len: usize, align: usize) -> Option<usize> {
        let (n, step) = (len / UNIT, align / UNIT);
        let units = self.len() / UNIT;
        let mut u = 0;
        while u + n <= units {
            match (u..u + n).find(|&x| self.bit(x)) {
                None => {
                    self.set(u, n, true);
                    self.carved += len;
                    self.carves += 1;
                    let off = u * UNIT;
                    debug_assert!(off % align == 0 && off + len <= self.len());
                    return Some(off);
                }
                // Skip past the used unit, to the next aligned start.
                Some(used) => u = (used + 1).next_multiple_of(step),
            }
        }
        None
    }

    /// Return the carve at `offset` of `len` bytes.
    pub(super) fn give(&mut self, offset: usize, len: usize) {
        let (u, n) = (offset / UNIT, len / UNIT);
        debug_assert!((u..u + n).all(|x| self.bit(x)), "a carve returned twice");
        self.set(u, n, false);
        self.carved -= len;
        self.carves -= 1;
    }

    /// Deregister the UMEM: false (the UMEM then stays registered, leaked, and its slabs must
    /// not host another) when the device refuses (a DEVX object still uses it).
    pub(super) fn dereg(self) -> bool {
        match self.umem.dereg() {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "rdma_pool: an empty UMEM refused dereg; leaked");
                false
            }
        }
    }

    pub(super) fn validate(&self) -> bool {
        let set: u32 = self.bits.iter().map(|w| w.count_ones()).sum();
        self.carved == set as usize * UNIT && self.addr() % self.page_size == 0
    }
}
