//! The bootstrap region: where [`GlobalPool`](super::GlobalPool) serves the allocations it
//! must not serve from the pool — those made while the pool itself calls into the NIC
//! (opening the device, registering, growing; see [`crate::arena::provision`]) and those that
//! race with its initialisation.
//!
//! Contract: one static, page-aligned region of [`BYTES`] in `.bss` (no page of it is touched
//! before use), handed out by a lock-free bump pointer; freeing the most recent block moves the
//! pointer back, any other free only counts. When the region is used up, those allocations go
//! to the system allocator (`malloc`): either way the memory is not NIC-registered, which is
//! fine for the NIC layer's own bookkeeping. [`contains`] is what `dealloc` uses to recognise a
//! bootstrap block.
//!
//! Invariants: `0 <= TOP <= BYTES`; every live block lies in `[base, base + TOP)`;
//! `LIVE_BYTES <= TOP`.

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
    let (size, align) = (layout.size().max(1), layout.align());
    let mut top = TOP.load(Relaxed);
    loop {
        let Some(start) = (base() + top).checked_next_multiple_of(align) else {
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

/// Free a bootstrap block: the most recent one gives its bytes back.
pub(crate) fn free(p: *mut u8, layout: Layout) {
    let size = layout.size().max(1);
    LIVE_BYTES.fetch_sub(size, Relaxed);
    let (start, end) = (p as usize - base(), p as usize - base() + size);
    // Only the block at the top can be taken back; a lost race only leaves bytes unused.
    let _ = TOP.compare_exchange(end, start, Relaxed, Relaxed);
}

/// Grow or shrink the most recent block in place; false when it is not the last block or the
/// region has no room.
pub(crate) fn resize_in_place(p: *mut u8, layout: Layout, new_size: usize) -> bool {
    let (old, new) = (layout.size().max(1), new_size.max(1));
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
