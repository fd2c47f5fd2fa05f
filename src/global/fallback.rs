//! Where a `GlobalPool` puts what it cannot serve from the pool (degraded blocks, bootstrap
//! overflow): the system allocator, or — for a pool that *is* the process's `malloc`
//! (a C library preloaded with `LD_PRELOAD`), where the system allocator would call the pool
//! again — anonymous mappings of its own ([`Fallback`]).
//!
//! Contract (`Mmap`): a block of `size` bytes aligned to `align` is a mapping of exactly
//! `round_up(size, page)` bytes starting at the block (the alignment slack is unmapped at
//! once), zero-filled by the kernel; freeing unmaps exactly that, and growing moves it with
//! `mremap` when its alignment is at most a page. Nothing here allocates. Each block costs
//! whole pages: an emergency path, not a heap.
//!
//! Invariant: `fallback_alloc` → `fallback_dealloc` with the same layout releases every page
//! mapped for the block; a live `Mmap` block is in the registry (`registry`), which gives its
//! size to size-less frees (C's `free`) and tells it from a pointer nobody here handed out.

use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr::null_mut;

/// Where a `GlobalPool` serves what the pool cannot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Fallback {
    /// The system allocator (`malloc`): the default for a Rust program's global allocator.
    #[default]
    System,
    /// Anonymous mappings of whole pages, never `malloc`: for a pool that is the process's
    /// `malloc` itself (the C library), where `malloc` would re-enter the pool.
    Mmap,
}

fn page() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 { v as usize } else { 4096 }
}

/// `n` rounded up to whole pages; `None` on overflow.
fn pages(n: usize) -> Option<usize> {
    let p = page();
    n.max(1).checked_add(p - 1).map(|v| v & !(p - 1))
}

/// A fresh block for `layout` (zero-filled when mapped), or null.
///
/// # Safety
/// `layout` has a non-zero size.
pub(super) unsafe fn fallback_alloc(how: Fallback, layout: Layout, zero: bool) -> *mut u8 {
    match how {
        // SAFETY: forwarded from the caller.
        Fallback::System => unsafe {
            if zero {
                System.alloc_zeroed(layout)
            } else {
                System.alloc(layout)
            }
        },
        Fallback::Mmap => {
            let p = map(layout);
            if !p.is_null() && !registry::insert(p as usize, layout.size()) {
                // The registry is full: a block it cannot find again is not handed out.
                // SAFETY: the mapping just made, exactly.
                unsafe { unmap(p, layout.size()) };
                return null_mut();
            }
            p
        }
    }
}

/// Unmap the `Mmap` block `p` of `size` bytes (not the registry's entry).
///
/// # Safety
/// `p` is a live `Mmap` block of `size` bytes.
unsafe fn unmap(p: *mut u8, size: usize) {
    if let Some(len) = pages(size) {
        // SAFETY: the block's own mapping, exactly (module contract).
        unsafe { libc::munmap(p.cast(), len) };
    }
}

/// The size of a live block `fallback_alloc(how, ..)` returned (what was asked for); `None`
/// when `p` is not one (under `System`, any pointer is taken for one of `malloc`'s).
pub(super) fn size_of(how: Fallback, p: *const u8) -> Option<usize> {
    match how {
        // SAFETY: under `System` the caller passes only `malloc`'s blocks or null.
        Fallback::System => Some(unsafe { libc::malloc_usable_size(p as *mut libc::c_void) }),
        Fallback::Mmap => registry::find(p as usize).map(|(_, size)| size),
    }
}

/// Bytes usable in the block `p` of [`size_of`] `size`: its whole pages under `Mmap`.
pub(super) fn usable(how: Fallback, size: usize) -> usize {
    match how {
        Fallback::System => size,
        Fallback::Mmap => pages(size).unwrap_or(size),
    }
}

/// Free a block without its layout: a fallback block, or (`false`) a pointer that is not one
/// (ignored; under `System` every pointer is passed to `free`).
///
/// # Safety
/// `p` is null, a live fallback block freed once, or a pointer nobody here handed out.
pub(super) unsafe fn free_unsized(how: Fallback, p: *mut u8) -> bool {
    match how {
        Fallback::System => {
            // SAFETY: forwarded from the caller.
            unsafe { libc::free(p.cast()) };
            true
        }
        Fallback::Mmap => match registry::find(p as usize) {
            Some((slot, size)) => {
                registry::remove(slot);
                // SAFETY: a live block of `size` bytes (the registry says so).
                unsafe { unmap(p, size) };
                true
            }
            None => false,
        },
    }
}

/// Map `layout` as the module contract says.
fn map(layout: Layout) -> *mut u8 {
    let page = page();
    let Some(len) = pages(layout.size()) else {
        return null_mut();
    };
    let align = layout.align().max(page);
    let Some(total) = len.checked_add(align - page) else {
        return null_mut();
    };
    // SAFETY: a fresh private anonymous mapping; no pointer is read.
    let p = unsafe {
        libc::mmap(
            null_mut(),
            total,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return null_mut();
    }
    let base = p as usize;
    let start = (base + align - 1) & !(align - 1);
    // SAFETY: the slack before `start` and after `start + len` is ours and unused.
    unsafe {
        if start > base {
            libc::munmap(base as *mut libc::c_void, start - base);
        }
        let end = start + len;
        if base + total > end {
            libc::munmap(end as *mut libc::c_void, base + total - end);
        }
    }
    start as *mut u8
}

/// Free a block `fallback_alloc(how, layout)` returned.
///
/// # Safety
/// `p` came from `fallback_alloc(how, layout, _)` and is freed once.
pub(super) unsafe fn fallback_dealloc(how: Fallback, p: *mut u8, layout: Layout) {
    match how {
        // SAFETY: forwarded from the caller.
        Fallback::System => unsafe { System.dealloc(p, layout) },
        Fallback::Mmap => {
            if let Some((slot, _)) = registry::find(p as usize) {
                registry::remove(slot);
            }
            // SAFETY: forwarded from the caller.
            unsafe { unmap(p, layout.size()) };
        }
    }
}

/// Resize a block `fallback_alloc(how, layout)` returned; null (the block untouched) when it
/// cannot.
///
/// # Safety
/// As [`fallback_dealloc`]; `new_size` is non-zero.
pub(super) unsafe fn fallback_realloc(
    how: Fallback,
    p: *mut u8,
    layout: Layout,
    new_size: usize,
) -> *mut u8 {
    match how {
        // SAFETY: forwarded from the caller.
        Fallback::System => unsafe { System.realloc(p, layout, new_size) },
        Fallback::Mmap => {
            let (Some(old), Some(new)) = (pages(layout.size()), pages(new_size)) else {
                return null_mut();
            };
            if old == new {
                if let Some((slot, _)) = registry::find(p as usize) {
                    registry::set_size(slot, new_size);
                }
                return p;
            }
            if layout.align() <= page() {
                // SAFETY: the block's own mapping; the kernel moves it whole if it must.
                let q = unsafe { libc::mremap(p.cast(), old, new, libc::MREMAP_MAYMOVE) };
                if q == libc::MAP_FAILED {
                    return null_mut();
                }
                if let Some((slot, _)) = registry::find(p as usize) {
                    registry::remove(slot);
                }
                if !registry::insert(q as usize, new_size) {
                    // SAFETY: the moved mapping, exactly; nobody else knows it.
                    unsafe { unmap(q.cast(), new_size) };
                    return null_mut();
                }
                return q.cast();
            }
            let Ok(to) = Layout::from_size_align(new_size, layout.align()) else {
                return null_mut();
            };
            // SAFETY: `to` has a non-zero size (`new_size`, the caller's contract).
            let q = unsafe { fallback_alloc(how, to, false) };
            if !q.is_null() {
                // SAFETY: distinct live mappings, both valid for the copied length.
                unsafe {
                    std::ptr::copy_nonoverlapping(p, q, layout.size().min(new_size));
                    fallback_dealloc(how, p, layout);
                }
            }
            q
        }
    }
}

/// The live `Mmap` blocks: a lock-free open-addressing table of `address → size` in `.bss`
/// (untouched slots cost nothing). Insertions claim an empty or dead slot by CAS; a removal
/// marks it dead. Nothing here allocates.
///
/// Invariant: a live block's address is in exactly one slot, found by probing from its hash
/// before any empty slot.
mod registry {
    use std::sync::atomic::{AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};

    const SLOTS: usize = 1 << 14;
    const EMPTY: usize = 0;
    /// A removed entry (blocks are page-aligned: never 1).
    const DEAD: usize = 1;

    static KEYS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(EMPTY) }; SLOTS];
    static SIZES: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(0) }; SLOTS];

    fn hash(addr: usize) -> usize {
        ((addr >> 12).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17) % SLOTS
    }

    /// Record a new block; false when the table is full.
    pub(super) fn insert(addr: usize, size: usize) -> bool {
        let h = hash(addr);
        for i in 0..SLOTS {
            let slot = (h + i) % SLOTS;
            let k = KEYS[slot].load(Relaxed);
            if (k == EMPTY || k == DEAD)
                && KEYS[slot]
                    .compare_exchange(k, addr, Relaxed, Relaxed)
                    .is_ok()
            {
                SIZES[slot].store(size, Release);
                return true;
            }
        }
        false
    }

    /// The slot and size of the live block at `addr`.
    pub(super) fn find(addr: usize) -> Option<(usize, usize)> {
        if addr <= DEAD {
            return None;
        }
        let h = hash(addr);
        for i in 0..SLOTS {
            let slot = (h + i) % SLOTS;
            match KEYS[slot].load(Acquire) {
                EMPTY => return None,
                k if k == addr => return Some((slot, SIZES[slot].load(Acquire))),
                _ => {}
            }
        }
        None
    }

    pub(super) fn set_size(slot: usize, size: usize) {
        SIZES[slot].store(size, Release);
    }

    pub(super) fn remove(slot: usize) {
        KEYS[slot].store(DEAD, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mapping that starts at `p`, as `/proc/self/maps` says (start, end).
    fn mapping_at(p: *mut u8) -> Option<(usize, usize)> {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines().find_map(|l| {
            let range = l.split_whitespace().next()?;
            let (a, b) = range.split_once('-')?;
            let (a, b) = (
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            );
            (a <= p as usize && (p as usize) < b).then_some((a, b))
        })
    }

    #[test]
    fn mmap_blocks_free_without_their_layout_and_strangers_are_left_alone() {
        let layout = Layout::from_size_align(10_000, 16).unwrap();
        // SAFETY: a non-zero layout.
        let p = unsafe { fallback_alloc(Fallback::Mmap, layout, true) };
        assert_eq!(size_of(Fallback::Mmap, p), Some(10_000));
        assert_eq!(usable(Fallback::Mmap, 10_000), pages(10_000).unwrap());
        let stranger = Box::new(5u64);
        let s = &*stranger as *const u64 as *mut u8;
        assert_eq!(size_of(Fallback::Mmap, s), None);
        // SAFETY: not ours: ignored.
        assert!(!unsafe { free_unsized(Fallback::Mmap, s) });
        // SAFETY: a live block, freed once.
        assert!(unsafe { free_unsized(Fallback::Mmap, p) });
        assert_eq!(size_of(Fallback::Mmap, p), None);
        // (Whether the range is still mapped is not checked here: another test thread may
        // map the same addresses the moment they are free.)
        assert_eq!(*stranger, 5);
    }

    #[test]
    fn mmap_blocks_are_exact_mappings_zeroed_aligned_and_unmapped_on_free() {
        for (size, align) in [
            (1usize, 8usize),
            (100, 16),
            (5000, 64),
            (3 << 20, 4096),
            (10, 1 << 16),
        ] {
            let layout = Layout::from_size_align(size, align).unwrap();
            // SAFETY: a non-zero layout; freed below with it.
            let p = unsafe { fallback_alloc(Fallback::Mmap, layout, false) };
            assert!(!p.is_null());
            assert_eq!(p as usize % align.max(page()), 0);
            // SAFETY: the block's bytes.
            let bytes = unsafe { std::slice::from_raw_parts_mut(p, size) };
            assert!(bytes.iter().all(|&b| b == 0));
            bytes.fill(7);
            let (start, end) = mapping_at(p).expect("mapped");
            assert!(start <= p as usize && p as usize + size <= end);
            // SAFETY: allocated above with `layout`.
            let q = unsafe { fallback_realloc(Fallback::Mmap, p, layout, size * 3) };
            assert!(!q.is_null());
            // SAFETY: the grown block keeps the old bytes.
            assert!(
                unsafe { std::slice::from_raw_parts(q, size) }
                    .iter()
                    .all(|&b| b == 7)
            );
            let grown = Layout::from_size_align(size * 3, align).unwrap();
            assert_eq!(size_of(Fallback::Mmap, q), Some(size * 3));
            // SAFETY: the block `q` with its new layout.
            unsafe { fallback_dealloc(Fallback::Mmap, q, grown) };
            assert_eq!(size_of(Fallback::Mmap, q), None);
            // (Not checked: that the range is unmapped. Another test thread may map the same
            // addresses the moment they are free.)
        }
    }
}
