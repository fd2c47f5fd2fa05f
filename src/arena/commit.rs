//! Mapping chunks and committing slabs: hugetlb → transparent huge pages → 4 KiB pages.
//!
//! Contract: a chunk (or a dedicated multi-chunk range) is mapped once when opened — one
//! hugetlb mapping of the whole range, or one ordinary mapping with `MADV_HUGEPAGE` — so the
//! process gains O(1) VMAs per chunk however many slabs are committed. Slabs are committed with
//! `MADV_POPULATE_WRITE`, which fails with an error (never a `SIGBUS`) when the hugetlb pool is
//! empty; the range from the failing slab to the end of the chunk is then remapped as ordinary
//! memory once (two VMAs, still O(1)), unless the policy is [`Hugepages::Require`].
//!
//! A remap binds the new mapping to the chunk's NUMA node again (`numa.rs`): a fresh mapping
//! has no policy.
//!
//! A chunk is mapped for one [`Backing`]: dense chunks (whole-slab pages, large runs, queue
//! memory) take hugetlb, then transparent huge pages in a pinned arena (4 KiB pages in a lazy
//! one, which faults memory in where it is touched: `Pages::transparent_huge`); sparse chunks (slabs cut into pages
//! smaller than a slab, which many heaps share and each touches a little of) are ordinary
//! memory advised `MADV_NOHUGEPAGE`, so touching one block faults in — and, pinned, pins —
//! 4 KiB, not 2 MiB. Only [`Hugepages::Require`] puts sparse chunks on hugetlb too. Sparse
//! chunks exist in a lazy (ODP) arena, and in a pinned one for slabs of pages of at most a
//! step, which it registers a step at a time (`step.rs`); a pinned slab registered whole is
//! populated and pinned whole, so small pages there would pin as much and cost more faults and
//! NIC translations (`run.rs`). A pinned rail (`rails/`) pins a sparse slab whole, on 4 KiB
//! pages: as many bytes as on a huge page, with more translations on that device. Sparse
//! memory is not populated when committed: it is touched a page at a time.
//!
//! Invariant: in a mapped range, slabs `[0, huge_until)` are hugetlb-mapped and slabs
//! `[huge_until, end)` ordinary; `huge_until` only decreases; a sparse chunk's ordinary slabs
//! are [`PageKind::Small`].

use super::fork::ForkPolicy;
use super::{Error, Hugepages, SLAB};
use crate::sys::os;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What backs a committed slab.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PageKind {
    /// hugetlb 2 MiB pages.
    Hugetlb,
    /// Ordinary memory advised `MADV_HUGEPAGE` where THP is enabled (the kernel uses huge
    /// pages when it finds free 2 MiB frames).
    Thp,
    /// Ordinary 4 KiB pages.
    Small,
}

impl PageKind {
    /// A short name for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            PageKind::Hugetlb => "hugetlb",
            PageKind::Thp => "thp",
            PageKind::Small => "4k",
        }
    }

    pub(crate) fn code(self) -> u8 {
        match self {
            PageKind::Hugetlb => 1,
            PageKind::Thp => 2,
            PageKind::Small => 3,
        }
    }
}

/// What a chunk's slabs are cut into, which decides their pages (see the module contract).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backing {
    /// Whole-slab pages and runs: huge pages pay.
    Dense,
    /// Pages smaller than a slab, shared by heaps that each touch a few blocks: 4 KiB pages.
    Sparse,
}

/// The page policy of one arena.
pub(crate) struct Pages {
    pub(crate) policy: Hugepages,
    pub(crate) fork: ForkPolicy,
    /// THP is enabled in sysfs.
    pub(crate) thp: bool,
    /// Ordinary pages are not populated when committed (an ODP arena: the CPU or the NIC
    /// faults them in on first touch, and the automatic prefetch asks for what it prefetches).
    /// hugetlb pages always are: a first touch of an unpopulated `MAP_NORESERVE` hugetlb page
    /// with the pool dry would be `SIGBUS`.
    pub(crate) lazy: bool,
    /// `mbind` calls that failed (the memory stayed unbound).
    pub(crate) bind_failures: AtomicU64,
}

impl Pages {
    /// Bind `[addr, addr + len)` (mapped, untouched) to node `node - 1`; `node == 0` binds
    /// nothing. Returns the node code in force: `node`, or 0 when `mbind` failed (counted,
    /// never an error: the memory stays usable, unbound).
    pub(crate) fn bind(&self, addr: *mut u8, len: usize, node: u32) -> u32 {
        if node == 0 {
            return 0;
        }
        // SAFETY: the range is a mapping of the arena's; only its policy changes.
        match unsafe { crate::sys::numa::bind(addr, len, node - 1) } {
            Ok(()) => node,
            Err(errno) => {
                self.bind_failures.fetch_add(1, Relaxed);
                tracing::debug!(
                    target: "rdma_pool::arena",
                    node = node - 1,
                    errno,
                    "mbind failed; the memory stays unbound"
                );
                0
            }
        }
    }

    /// Map `[addr, addr + slabs·SLAB)` for `backing` and return its `huge_until` (unbound: the
    /// caller binds).
    pub(crate) fn map_range(
        &self,
        addr: *mut u8,
        slabs: u32,
        backing: Backing,
    ) -> Result<u32, Error> {
        let len = slabs as usize * SLAB;
        if self.policy.hugetlb() && (backing == Backing::Dense || self.policy == Hugepages::Require)
        {
            // SAFETY: the range is an unused part of the arena's reservation.
            match unsafe { os::map_fixed(addr, len, true) } {
                Ok(()) => {
                    self.dontfork_range(addr, len)?;
                    return Ok(slabs);
                }
                Err(errno) if self.policy == Hugepages::Require => {
                    return Err(Error::HugepagesUnavailable { errno });
                }
                Err(_) => {}
            }
        }
        self.map_ordinary(addr, len, 0, backing)?;
        Ok(0)
    }

    /// Map ordinary memory over `[addr, addr + len)` for `backing`, bound to node code `node`
    /// (see [`Pages::bind`]).
    fn map_ordinary(
        &self,
        addr: *mut u8,
        len: usize,
        node: u32,
        backing: Backing,
    ) -> Result<(), Error> {
        // SAFETY: the range belongs to the arena and holds no handed-out memory.
        unsafe { os::map_fixed(addr, len, false) }.map_err(|errno| Error::Os {
            what: "mmap",
            errno,
        })?;
        let advice = if self.transparent_huge(backing) {
            libc::MADV_HUGEPAGE
        } else {
            libc::MADV_NOHUGEPAGE
        };
        // SAFETY: advice about page size only. Failure (no THP in the kernel) is not an error:
        // the slabs are then counted as 4 KiB.
        let _ = unsafe { os::madvise(addr, len, advice) };
        self.bind(addr, len, node);
        self.dontfork_range(addr, len)
    }

    pub(crate) fn dontfork_range(&self, addr: *mut u8, len: usize) -> Result<(), Error> {
        if self.fork == ForkPolicy::DontFork {
            // SAFETY: only changes what a child inherits.
            unsafe { os::madvise(addr, len, libc::MADV_DONTFORK) }.map_err(|errno| Error::Os {
                what: "madvise(MADV_DONTFORK)",
                errno,
            })?;
        }
        Ok(())
    }

    /// Whether ordinary memory of `backing` is advised onto transparent huge pages: dense
    /// memory of a pinned arena, which is populated and pinned whole anyway (there huge pages
    /// cost nothing more and save the NIC 511 translations in 512). Never in a lazy (ODP)
    /// arena: its memory faults in where the program or the NIC touches it, and on huge pages
    /// each touch of a large block would fault in 2 MiB — a receive buffer sized to the
    /// largest message and written a message at a time, or a block aligned to 2 MiB written
    /// at both ends (`overaligned`: 159 MiB resident on huge pages, 53 MiB on 4 KiB ones).
    /// hugetlb pages, which an administrator reserved for the purpose, are used as before.
    fn transparent_huge(&self, backing: Backing) -> bool {
        self.policy != Hugepages::Off && !self.lazy && backing == Backing::Dense
    }

    fn ordinary_kind(&self, backing: Backing) -> PageKind {
        if self.thp && self.transparent_huge(backing) {
            PageKind::Thp
        } else {
            PageKind::Small
        }
    }

    /// Commit slabs `[s, e)` of the range mapped at `base` with `slabs` slabs for `backing`,
    /// bound to node code `node` (what a remap of its hugetlb part is bound to).
    pub(crate) fn commit(
        &self,
        base: *mut u8,
        slabs: u32,
        huge_until: &mut u32,
        (s, e): (u32, u32),
        (node, backing): (u32, Backing),
    ) -> Result<PageKind, Error> {
        let at = |i: u32| base.wrapping_add(i as usize * SLAB);
        let len = (e - s) as usize * SLAB;
        if e <= *huge_until {
            match os::populate_write(at(s), len) {
                Ok(()) => return Ok(PageKind::Hugetlb),
                Err(errno) if self.policy == Hugepages::Require => {
                    // Give back what the partial populate took.
                    // SAFETY: these slabs were never handed out.
                    let _ = unsafe { os::madvise(at(s), len, libc::MADV_DONTNEED) };
                    return Err(Error::HugepagesUnavailable { errno });
                }
                Err(_) => {}
            }
        }
        if s < *huge_until {
            // The hugetlb pool ran dry: the rest of the range becomes ordinary memory.
            self.map_ordinary(at(s), (slabs - s) as usize * SLAB, node, backing)?;
            *huge_until = s;
        }
        // Sparse memory is touched a page at a time: by the program, or by the registration
        // of a step (`step.rs`); a pinned arena populates a sparse run it pins whole itself.
        if backing == Backing::Dense {
            self.populate_ordinary(at(s), len)?;
        }
        Ok(self.ordinary_kind(backing))
    }

    /// Populate ordinary memory that is about to be pinned; nothing for a lazy (ODP) arena.
    /// Before populating a large range, check that the system has the memory.
    pub(crate) fn populate_ordinary(&self, addr: *mut u8, len: usize) -> Result<(), Error> {
        if self.lazy {
            return Ok(());
        }
        headroom_for(len)?;
        os::populate_write(addr, len).map_err(|errno| Error::Os {
            what: "madvise(MADV_POPULATE_WRITE)",
            errno,
        })
    }

    /// Map `[addr, addr + len)` anew as ordinary memory and commit it (a purged hugetlb range
    /// revived after the hugetlb pool ran dry), bound to node code `node`.
    pub(crate) fn remap_ordinary(
        &self,
        addr: *mut u8,
        len: usize,
        (node, backing): (u32, Backing),
    ) -> Result<PageKind, Error> {
        self.map_ordinary(addr, len, node, backing)?;
        self.populate_ordinary(addr, len)?;
        Ok(self.ordinary_kind(backing))
    }

    /// Give committed slabs back (a failed run).
    pub(crate) fn decommit(&self, addr: *mut u8, len: usize) {
        // SAFETY: the slabs were never handed out.
        let _ = unsafe { os::madvise(addr, len, libc::MADV_DONTNEED) };
    }
}

/// Ranges below this are populated without a look at the system's memory (a slab or a few).
pub(crate) const HEADROOM_CHECK_MIN: usize = 64 << 20;

/// Refuse to populate `len` bytes when the system cannot give them: more than `MemAvailable`,
/// or than the cgroup's `memory.max` leaves above `memory.current` (cgroup v2). Small ranges
/// pass unchecked. Reads `/proc` and `/sys` into stack buffers (no allocation).
pub(crate) fn headroom_for(len: usize) -> Result<(), Error> {
    if len < HEADROOM_CHECK_MIN {
        return Ok(());
    }
    match os::memory_headroom() {
        Some(available) if len as u64 > available => Err(Error::NoMemory { len, available }),
        _ => Ok(()),
    }
}
