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
//! mapped for the block.

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
        Fallback::Mmap => map(layout),
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
            if let Some(len) = pages(layout.size()) {
                // SAFETY: the block's own mapping, exactly (module contract).
                unsafe { libc::munmap(p.cast(), len) };
            }
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
                return p;
            }
            if layout.align() <= page() {
                // SAFETY: the block's own mapping; the kernel moves it whole if it must.
                let q = unsafe { libc::mremap(p.cast(), old, new, libc::MREMAP_MAYMOVE) };
                return if q == libc::MAP_FAILED {
                    null_mut()
                } else {
                    q.cast()
                };
            }
            let Ok(to) = Layout::from_size_align(new_size, layout.align()) else {
                return null_mut();
            };
            let q = map(to);
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
            // SAFETY: the block `q` with its new layout.
            unsafe { fallback_dealloc(Fallback::Mmap, q, grown) };
            let len = pages(size * 3).unwrap();
            if let Some((s, e)) = mapping_at(q) {
                // Another mapping may sit next to where it was, never over it whole.
                assert!(!(s <= q as usize && q as usize + len <= e), "still mapped");
            }
        }
    }
}
