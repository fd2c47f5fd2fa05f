//! Memory-checker mode (feature `memcheck`): shows the blocks inside the pool to a memory
//! checker, which cannot see inside a custom allocator on its own (to AddressSanitizer the
//! arena is one mapping that is valid from end to end).
//!
//! Contract, with the feature on:
//! - a freed block is filled with [`FREED`] — a small block from byte 8 (its first word is the
//!   free-list link the pool itself writes), a large block from byte 0, at most
//!   [`FILL_MAX`] bytes — so a read after free sees `0xDF…`, never stale data;
//! - built for AddressSanitizer (`RUSTC_BOOTSTRAP=1 RUSTFLAGS="-Zsanitizer=address --cfg
//!   rdma_pool_asan"`, see `scripts/memcheck.sh`), the same bytes (a large block: all of them)
//!   are also *poisoned*: the first access to a freed block, by the program or by the soft NIC's
//!   copies, is reported where it happens; a block handed out is unpoisoned over its usable size;
//! - a small block handed out again whose fill was disturbed (a write after free) is counted in
//!   [`MemcheckStats::writes_after_free`], with its address in
//!   [`MemcheckStats::last_write_after_free`] (no `tracing` here: this runs inside `GlobalAlloc`);
//! - a live large run ends in a guard page (`LARGE_GUARD` bytes past its usable size, which
//!   shrinks by as much) filled with [`GUARD_FILL`] and poisoned: under ASan an overrun is
//!   reported at its first byte; without, the guard is checked when the run is freed
//!   ([`MemcheckStats::overruns`]). Not `PROT_NONE`: the guard is part of a pinned
//!   registration, and the kernel refuses (`EFAULT`) every later registration over a page the
//!   process cannot access — a rail attach, a `rereg_mr` growth, a purge's split — so a
//!   protected guard would change what the pool does in the very mode that checks it;
//! - a block parked in quarantine (under a revoking grant) is filled and poisoned only when it
//!   leaves quarantine: until the revocation completed the NIC may still write it;
//! - memory that changes hands inside the pool — a page re-initialised for another size class,
//!   a fresh run from the arena — is unpoisoned first, and a recycled small page is refilled
//!   with [`FREED`] so that every block of it is either all fill or zero.
//!
//! Invariant (at quiescence, under ASan): a byte of the arena is poisoned ⇔ it lies in a freed
//! block (outside a small block's link word), or in the guard page of a live large run.
//! Without the feature every function here is an empty `#[inline(always)]` one, and the pool's
//! hooks at the end (`impl Core`) are behind `cfg!(feature = "memcheck")` at their call sites:
//! nothing is added to any path.

use super::Core;
use super::page::{LARGE, Page, SMALL};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// The byte freed blocks are filled with.
pub const FREED: u8 = 0xDF;

/// Most bytes of one freed block filled (and checked) with [`FREED`].
pub const FILL_MAX: usize = 1 << 20;

/// Bytes of the guard page after a live large run (not part of its usable size): one page
/// with the feature on, else none.
pub const LARGE_GUARD: usize = if cfg!(feature = "memcheck") { 4096 } else { 0 };

/// The byte the guard after a live large run is filled with.
pub const GUARD_FILL: u8 = 0xA5;

static POISONED: AtomicU64 = AtomicU64::new(0);
static CHECKED: AtomicU64 = AtomicU64::new(0);
static WRITES_AFTER_FREE: AtomicU64 = AtomicU64::new(0);
static LAST_WAF: AtomicUsize = AtomicUsize::new(0);
static GUARDS: AtomicU64 = AtomicU64::new(0);
static OVERRUNS: AtomicU64 = AtomicU64::new(0);
static LAST_OVERRUN: AtomicUsize = AtomicUsize::new(0);

/// What memory-checker mode saw, process-wide (every pool). All zero without the feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct MemcheckStats {
    /// The feature `memcheck` is built in.
    pub enabled: bool,
    /// Built for AddressSanitizer (`--cfg rdma_pool_asan`): freed blocks are poisoned.
    pub asan: bool,
    /// Freed blocks filled (and poisoned under ASan).
    pub poisoned_blocks: u64,
    /// Small blocks whose fill was checked when they were handed out again.
    pub checked_blocks: u64,
    /// Of those, blocks whose fill had changed: a write after free.
    pub writes_after_free: u64,
    /// The address of the last such block (0: none).
    pub last_write_after_free: usize,
    /// Guard pages set after large runs.
    pub guards: u64,
    /// Large runs freed with their guard page changed: a write past the run's usable bytes.
    pub overruns: u64,
    /// The address of the last such run (0: none).
    pub last_overrun: usize,
}

/// The process-wide [`MemcheckStats`].
///
/// # Examples
/// ```
/// let s = rdma_pool::alloc::memcheck_stats();
/// assert_eq!(s.enabled, cfg!(feature = "memcheck"));
/// assert_eq!(s.writes_after_free, 0);
/// ```
pub fn memcheck_stats() -> MemcheckStats {
    MemcheckStats {
        enabled: cfg!(feature = "memcheck"),
        asan: cfg!(rdma_pool_asan),
        poisoned_blocks: POISONED.load(Relaxed),
        checked_blocks: CHECKED.load(Relaxed),
        writes_after_free: WRITES_AFTER_FREE.load(Relaxed),
        last_write_after_free: LAST_WAF.load(Relaxed),
        guards: GUARDS.load(Relaxed),
        overruns: OVERRUNS.load(Relaxed),
        last_overrun: LAST_OVERRUN.load(Relaxed),
    }
}

/// Whether AddressSanitizer considers any byte of `[p, p + len)` poisoned: `None` when the
/// crate was not built for ASan (for tests of the poisoning itself).
///
/// # Examples
/// ```
/// let x = [0u8; 16];
/// assert_ne!(rdma_pool::alloc::asan_poisoned(x.as_ptr(), 16), Some(true));
/// ```
pub fn asan_poisoned(p: *const u8, len: usize) -> Option<bool> {
    #[cfg(rdma_pool_asan)]
    {
        // SAFETY: the ASan runtime only reads its shadow memory for the range.
        Some(!unsafe { asan::__asan_region_is_poisoned(p, len) }.is_null())
    }
    #[cfg(not(rdma_pool_asan))]
    {
        let _ = (p, len);
        None
    }
}

#[cfg(rdma_pool_asan)]
mod asan {
    // SAFETY: the interface of the AddressSanitizer runtime linked by `-Zsanitizer=address`.
    unsafe extern "C" {
        pub(super) fn __asan_poison_memory_region(addr: *const u8, size: usize);
        pub(super) fn __asan_unpoison_memory_region(addr: *const u8, size: usize);
        pub(super) fn __asan_region_is_poisoned(addr: *const u8, size: usize) -> *const u8;
    }
}

/// Mark `[p, p + len)` poisoned for ASan (nothing otherwise).
#[inline(always)]
fn poison(p: *const u8, len: usize) {
    #[cfg(rdma_pool_asan)]
    // SAFETY: the runtime only writes its shadow memory for the range.
    unsafe {
        asan::__asan_poison_memory_region(p, len)
    };
    let _ = (p, len);
}

/// Mark `[p, p + len)` addressable for ASan (nothing otherwise): memory the pool is about to
/// hand out, zero or re-initialise.
#[inline(always)]
pub(crate) fn unpoison(p: *const u8, len: usize) {
    #[cfg(rdma_pool_asan)]
    // SAFETY: the runtime only writes its shadow memory for the range.
    unsafe {
        asan::__asan_unpoison_memory_region(p, len)
    };
    let _ = (p, len);
}

/// A block is being freed: `skip` bytes at its start stay as they are (a small block's link
/// word), the rest is filled and poisoned.
///
/// # Safety
/// `[p, p + len)` is a block of the pool that nobody uses any more.
#[inline(always)]
pub(crate) unsafe fn freed(p: *mut u8, len: usize, skip: usize) {
    if cfg!(feature = "memcheck") && len > skip {
        // SAFETY: the block is the caller's to fill (contract).
        unsafe { std::ptr::write_bytes(p.add(skip), FREED, (len - skip).min(FILL_MAX)) };
        poison(p.wrapping_add(skip), len - skip);
        POISONED.fetch_add(1, Relaxed);
    }
}

/// A block of `len` usable bytes is being handed out: unpoison it; a small block (`small`)
/// carrying the fill is checked for writes after free.
///
/// # Safety
/// `[p, p + len)` is a block of the pool just taken from its free structures.
#[inline(always)]
pub(crate) unsafe fn handed_out(p: *mut u8, len: usize, small: bool) {
    if !cfg!(feature = "memcheck") {
        return;
    }
    unpoison(p, len);
    if !small || len < 16 {
        return;
    }
    let n = len.min(FILL_MAX);
    // SAFETY: the block is `len` bytes long and the caller's (contract).
    let bytes = unsafe { std::slice::from_raw_parts(p.add(8), n - 8) };
    // Only a block freed since its page was (re)initialised carries the fill from byte 8.
    if bytes[..8].iter().all(|&b| b == FREED) {
        CHECKED.fetch_add(1, Relaxed);
        if bytes.iter().any(|&b| b != FREED) {
            WRITES_AFTER_FREE.fetch_add(1, Relaxed);
            LAST_WAF.store(p as usize, Relaxed);
        }
    }
}

/// A small page of `len` bytes is re-initialised for a size class: unpoison it and, unless it
/// is `fresh` (zero), refill it so that its blocks carry a uniform fill.
///
/// # Safety
/// `[p, p + len)` is an empty page nobody uses.
#[inline(always)]
pub(crate) unsafe fn recycled(p: *mut u8, len: usize, fresh: bool) {
    if cfg!(feature = "memcheck") {
        unpoison(p, len);
        if !fresh {
            // SAFETY: the page is the caller's (contract).
            unsafe { std::ptr::write_bytes(p, FREED, len) };
        }
    }
}

/// A large run of `usable` bytes followed by its guard is handed out: fill the guard with
/// [`GUARD_FILL`] and poison it.
#[inline(always)]
pub(crate) fn guard(p: *mut u8, usable: usize) {
    if LARGE_GUARD == 0 {
        return;
    }
    let g = p.wrapping_add(usable);
    unpoison(g, LARGE_GUARD);
    // SAFETY: the guard page belongs to the run (`LARGE_GUARD` bytes past its usable ones).
    unsafe { std::ptr::write_bytes(g, GUARD_FILL, LARGE_GUARD) };
    poison(g, LARGE_GUARD);
    GUARDS.fetch_add(1, Relaxed);
}

/// A large run of `usable` bytes is freed: check its guard (an overrun changed it), then
/// unpoison it before the run goes back to a list.
#[inline(always)]
pub(crate) fn unguard(p: *mut u8, usable: usize) {
    if LARGE_GUARD == 0 {
        return;
    }
    let g = p.wrapping_add(usable);
    unpoison(g, LARGE_GUARD);
    // SAFETY: the guard page belongs to the run, filled by `guard`.
    let bytes = unsafe { std::slice::from_raw_parts(g, LARGE_GUARD) };
    if bytes.iter().any(|&b| b != GUARD_FILL) {
        OVERRUNS.fetch_add(1, Relaxed);
        LAST_OVERRUN.store(p as usize, Relaxed);
    }
}

/// The pool's hooks (called only with the feature on).
impl Core {
    /// The block at `p` (or null) is handed out.
    #[cold]
    #[inline(never)]
    pub(super) fn memcheck_out(&self, p: *mut u8) {
        if let Some(page) = self.table.page_of(p) {
            let small = page.kind.load(Relaxed) == SMALL;
            if let Some(len) = self.usable_size(p) {
                // SAFETY: a block just handed out, `len` usable bytes.
                unsafe { handed_out(p, len, small) };
            }
        }
    }

    /// The live block at `p` was resized in place (within its class or large run): its usable
    /// bytes are unpoisoned.
    #[cold]
    #[inline(never)]
    pub(super) fn memcheck_resized(&self, p: *mut u8) {
        if let Some(len) = self.usable_size(p) {
            unpoison(p, len);
        }
    }

    /// The block at `p` of `page` is being freed.
    #[cold]
    #[inline(never)]
    pub(super) unsafe fn memcheck_in(&self, page: &Page, p: *mut u8) {
        match page.kind.load(Relaxed) {
            SMALL => {
                let bs = page.block_size.load(Relaxed) as usize;
                if (p as usize - page.start.load(Relaxed)) % bs == 0 {
                    // SAFETY: a block of the page being freed (the caller's contract).
                    unsafe { freed(p, bs, 8) };
                }
            }
            LARGE if page.start.load(Relaxed) == p as usize => {
                let usable = page.large_len.load(Relaxed) - LARGE_GUARD;
                unguard(p, usable);
                // SAFETY: as above.
                unsafe { freed(p, usable, 0) };
            }
            _ => {}
        }
    }
}
