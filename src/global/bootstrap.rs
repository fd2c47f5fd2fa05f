//! The bootstrap region: where [`GlobalPool`](super::GlobalPool) serves the allocations it
//! must not serve from the pool — those made while the pool itself calls into the NIC
//! (opening the device, registering, growing; see [`crate::sys::provision`]) and those that
//! race with its initialisation.
//!
//! Contract: one static, page-aligned region of [`BYTES`] in `.bss` (no page of it is touched
//! before use), handed out by a lock-free bump pointer; freeing the most recent block moves the
//! pointer back, any other free only counts. Every block is aligned to at least [`MIN_ALIGN`]
//! (what C's `malloc` promises) and preceded by a [`HEADER`] holding its size, so that a block
//! can be freed and measured without its layout ([`free`], [`size_of`]: C's `free` and
//! `malloc_usable_size`). When the region is used up, those allocations go
//! to the system allocator (`malloc`): either way the memory is not NIC-registered, which is
//! fine for the NIC layer's own bookkeeping. [`contains`] is what `dealloc` uses to recognise a
//! bootstrap block.
//!
//! Invariants: `0 <= TOP <= BYTES`; every live block lies in `[base, base + TOP)`;
//! `LIVE_BYTES <= TOP`; a live block `p` has `header(p) == its size`, `p % MIN_ALIGN == 0`.

use std::alloc::Layout;
use std::cell::UnsafeCell;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// Bytes in the bootstrap region (4 MiB of `.bss`: untouched pages cost nothing). Opening a
/// soft NIC and its arena takes about 1 MiB of it (the NIC's key tables are sized up front).
pub const BYTES: usize = 4 << 20;

#[repr(C, align(4096))]
struct Region(UnsafeCell<[u8; BYTES]>);

// SAFETY: blocks are handed out disjointly by the atomic bump pointer; each is then used by
// its owner only.
unsafe impl Sync for Region {}

/// Every block's alignment is at least this (C's `max_align_t`).
pub(crate) const MIN_ALIGN: usize = 16;

/// Bytes before every block that hold its size.
const HEADER: usize = 16;

static REGION: Region = Region(UnsafeCell::new([0; BYTES]));
static TOP: AtomicUsize = AtomicUsize::new(0);
static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
static BLOCKS: AtomicU64 = AtomicU64::new(0);

fn base() -> usize {
    REGION.0.get() as usize
}

/// True when `p` points into the bootstrap region.
#[inline(always)]
pub(crate) fn contains(p: *const u8) -> bool {
    (p as usize).wrapping_sub(base()) < BYTES
}

/// A block for `layout`, or null when the region is used up. Zeroed when `zero`.
pub(crate) fn alloc(layout: Layout, zero: bool) -> *mut u8 {
    let (size, align) = (layout.size().max(1), layout.align().max(MIN_ALIGN));
    let mut top = TOP.load(Relaxed);
    loop {
        let Some(start) = (base() + top + HEADER).checked_next_multiple_of(align) else {
            return null_mut();
        };
        let end = start - base() + size;
        if end > BYTES {
            return null_mut();
        }
        match TOP.compare_exchange_weak(top, end, Relaxed, Relaxed) {
            Ok(_) => {
                LIVE_BYTES.fetch_add(size, Relaxed);
                BLOCKS.fetch_add(1, Relaxed);
                let p = start as *mut u8;
                // SAFETY: the header is ours too (it lies past the old top, before `start`).
                unsafe { set_header(p, size) };
                if zero {
                    // SAFETY: `[start, start + size)` is ours (the bump pointer moved past it);
                    // it may hold bytes of a block freed earlier.
                    unsafe { std::ptr::write_bytes(p, 0, size) };
                }
                return p;
            }
            Err(t) => top = t,
        }
    }
}

/// # Safety
/// `p` is a block being handed out, its header ours.
unsafe fn set_header(p: *mut u8, size: usize) {
    // SAFETY: `HEADER >= 8` bytes before a `MIN_ALIGN`-aligned block (caller's contract).
    unsafe { p.sub(8).cast::<usize>().write(size) };
}

/// The size of the live bootstrap block `p` (what it was allocated or last resized to).
///
/// # Safety
/// `p` is a live block of the region (`contains(p)`, handed out and not freed).
pub(crate) unsafe fn size_of(p: *const u8) -> usize {
    // SAFETY: the block's header (module contract).
    unsafe { p.sub(8).cast::<usize>().read() }
}

/// Free a bootstrap block (its size is in its header): the most recent one gives its bytes
/// back.
///
/// # Safety
/// As [`size_of`]; the block is freed once.
pub(crate) unsafe fn free(p: *mut u8) {
    // SAFETY: forwarded from the caller.
    let size = unsafe { size_of(p) };
    LIVE_BYTES.fetch_sub(size, Relaxed);
    let (start, end) = (p as usize - base() - HEADER, p as usize - base() + size);
    // Only the block at the top can be taken back; a lost race only leaves bytes unused.
    let _ = TOP.compare_exchange(end, start, Relaxed, Relaxed);
}

/// Grow or shrink the most recent block in place; false when it is not the last block or the
/// region has no room.
///
/// # Safety
/// As [`size_of`].
pub(crate) unsafe fn resize_in_place(p: *mut u8, new_size: usize) -> bool {
    // SAFETY: forwarded from the caller.
    let (old, new) = (unsafe { size_of(p) }, new_size.max(1));
    let start = p as usize - base();
    if start + new > BYTES {
        return false;
    }
    if TOP
        .compare_exchange(start + old, start + new, Relaxed, Relaxed)
        .is_err()
    {
        return false;
    }
    // SAFETY: the block is live and ours (caller's contract); it is the top block.
    unsafe { set_header(p, new) };
    if new >= old {
        LIVE_BYTES.fetch_add(new - old, Relaxed);
    } else {
        LIVE_BYTES.fetch_sub(old - new, Relaxed);
    }
    true
}

/// `(blocks handed out, bytes live, bytes of the region in use)`.
pub(crate) fn usage() -> (u64, usize, usize) {
    (
        BLOCKS.load(Relaxed),
        LIVE_BYTES.load(Relaxed),
        TOP.load(Relaxed),
    )
}

/// The invariants of the module contract.
pub(crate) fn validate() -> bool {
    let top = TOP.load(Relaxed);
    top <= BYTES && LIVE_BYTES.load(Relaxed) <= top
}
