//! The malloc family, exported under the C names (and glibc's `__libc_*` aliases) so that the
//! library replaces `malloc` when preloaded (`LD_PRELOAD`) or linked.
//!
//! Contract: every block is at least 16-byte aligned (`max_align_t` on x86-64 and aarch64);
//! a request of `n` bytes is served as a pool block of `round_up(max(n, 1), 16)` bytes with
//! alignment 8 — every size class of a multiple of 16 bytes is 16-aligned (blocks sit at
//! multiples of the block size from an aligned page start), and such a request takes the
//! pool's fast path. Larger alignments are requests with that alignment. Failures set `errno`
//! (`ENOMEM`, `EINVAL`) as POSIX says, and `posix_memalign` returns the error instead.
//! `free` and `free_sized`/`free_aligned_sized` find the block by address and preserve
//! `errno`. `malloc_trim`, `mallopt`, `mallinfo`/`mallinfo2` and `malloc_stats` give
//! harmless answers from the pool's statistics.
//!
//! Invariant: `malloc_usable_size(malloc(n)) >= n` for every block handed out.

use crate::POOL;
use libc::{c_int, c_void, size_t};
use std::alloc::{GlobalAlloc, Layout};
use std::ptr::null_mut;

/// The alignment of every block (`max_align_t`).
const MIN_ALIGN: usize = 16;

fn set_errno(e: c_int) {
    // SAFETY: `__errno_location` returns this thread's `errno`.
    unsafe { *libc::__errno_location() = e };
}

fn errno() -> c_int {
    // SAFETY: as in `set_errno`.
    unsafe { *libc::__errno_location() }
}

fn page() -> usize {
    // SAFETY: no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 { v as usize } else { 4096 }
}

/// The pool layout of a `malloc(size)` (see the module contract); `None` when too large.
#[inline(always)]
fn layout_of(size: usize) -> Option<Layout> {
    let s = size.max(1).checked_next_multiple_of(MIN_ALIGN)?;
    Layout::from_size_align(s, 8).ok()
}

/// `p`, or `errno = ENOMEM` when null.
#[inline(always)]
fn or_enomem(p: *mut u8) -> *mut c_void {
    if p.is_null() {
        set_errno(libc::ENOMEM);
    }
    p.cast()
}

/// Requests from this size up are checked against the machine's memory ([`beyond_memory`]).
const HUGE: usize = 1 << 30;

/// Whether `size` bytes exceed the machine's memory and swap together: such a request is
/// refused (`ENOMEM`), as glibc's is under the kernel's heuristic overcommit, rather than
/// reserved and then met by the OOM killer when touched.
#[cold]
#[inline(never)]
fn beyond_memory(size: usize) -> bool {
    // SAFETY: an all-zero `sysinfo` is a valid out-parameter.
    let mut si: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer.
    if unsafe { libc::sysinfo(&mut si) } != 0 {
        return false;
    }
    let total = (u128::from(si.totalram) + u128::from(si.totalswap)) * u128::from(si.mem_unit);
    size as u128 > total
}

#[inline(always)]
fn alloc(size: usize, zero: bool) -> *mut c_void {
    if size >= HUGE && beyond_memory(size) {
        set_errno(libc::ENOMEM);
        return null_mut();
    }
    let Some(layout) = layout_of(size) else {
        set_errno(libc::ENOMEM);
        return null_mut();
    };
    // SAFETY: a non-zero-size layout.
    or_enomem(unsafe {
        if zero {
            POOL.alloc_zeroed(layout)
        } else {
            POOL.alloc(layout)
        }
    })
}

/// A block of `size` bytes aligned to `align` (a power of two); errno-less: null on failure.
fn alloc_aligned(align: usize, size: usize) -> *mut u8 {
    if size >= HUGE && beyond_memory(size) {
        return null_mut();
    }
    if align <= MIN_ALIGN {
        return layout_of(size).map_or(null_mut(), |l| {
            // SAFETY: a non-zero-size layout.
            unsafe { POOL.alloc(l) }
        });
    }
    match Layout::from_size_align(size.max(1), align) {
        // SAFETY: a non-zero-size layout.
        Ok(l) => unsafe { POOL.alloc(l) },
        Err(_) => null_mut(),
    }
}

/// `malloc(3)`.
///
/// # Safety
/// Any argument.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn malloc(size: size_t) -> *mut c_void {
    alloc(size, false)
}

/// `calloc(3)`: zero-filled; `ENOMEM` when `n * size` overflows.
///
/// # Safety
/// Any arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn calloc(n: size_t, size: size_t) -> *mut c_void {
    match n.checked_mul(size) {
        Some(total) => alloc(total, true),
        None => {
            set_errno(libc::ENOMEM);
            null_mut()
        }
    }
}

/// `free(3)`: preserves `errno`; null and pointers the library did not hand out are ignored.
///
/// # Safety
/// `p` is null, a live block of this library freed once, or memory of the allocator that ran
/// before it (ignored).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    // One call for both the save and the restore (it is a tenth of a tight malloc/free loop).
    // SAFETY: this thread's `errno`, valid for the thread's life.
    let errno = unsafe { libc::__errno_location() };
    // SAFETY: as above.
    let saved = unsafe { *errno };
    // SAFETY: forwarded from the caller.
    unsafe { POOL.free_unsized(p.cast()) };
    // SAFETY: as above.
    unsafe { *errno = saved };
}

/// `cfree`: `free`.
///
/// # Safety
/// As [`free`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cfree(p: *mut c_void) {
    // SAFETY: forwarded.
    unsafe { free(p) }
}

/// C23 `free_sized`: `free` (the block's size is found by its address).
///
/// # Safety
/// As [`free`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn free_sized(p: *mut c_void, _size: size_t) {
    // SAFETY: forwarded.
    unsafe { free(p) }
}

/// C23 `free_aligned_sized`: `free`.
///
/// # Safety
/// As [`free`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn free_aligned_sized(p: *mut c_void, _align: size_t, _size: size_t) {
    // SAFETY: forwarded.
    unsafe { free(p) }
}

/// `realloc(3)`: `realloc(NULL, n)` is `malloc(n)`; `realloc(p, 0)` frees `p` and returns
/// NULL (glibc); on failure `p` is untouched and `errno` is `ENOMEM`.
///
/// # Safety
/// `p` is null or a live block of this library.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: size_t) -> *mut c_void {
    if p.is_null() {
        return alloc(size, false);
    }
    if size == 0 {
        // SAFETY: forwarded.
        unsafe { free(p) };
        return null_mut();
    }
    if size >= HUGE && beyond_memory(size) {
        set_errno(libc::ENOMEM);
        return null_mut();
    }
    // SAFETY: forwarded; a non-zero size.
    or_enomem(unsafe { POOL.realloc_unsized(p.cast(), size) })
}

/// `reallocarray(3)`: `realloc(p, n * size)`, `ENOMEM` when the product overflows.
///
/// # Safety
/// As [`realloc`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: size_t, size: size_t) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: forwarded.
        Some(total) => unsafe { realloc(p, total) },
        None => {
            set_errno(libc::ENOMEM);
            null_mut()
        }
    }
}

/// `posix_memalign(3)`: `EINVAL` unless `align` is a power of two and a multiple of
/// `sizeof(void *)`, `ENOMEM` when out of memory; `errno` is left alone.
///
/// # Safety
/// `out` is valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_memalign(
    out: *mut *mut c_void,
    align: size_t,
    size: size_t,
) -> c_int {
    if !align.is_power_of_two() || align % size_of::<*mut c_void>() != 0 {
        return libc::EINVAL;
    }
    let e = errno();
    let p = alloc_aligned(align, size);
    set_errno(e);
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: the caller's contract.
    unsafe { *out = p.cast() };
    0
}

/// C11 `aligned_alloc`: `EINVAL` unless `align` is a power of two (glibc ≥ 2.38).
///
/// # Safety
/// Any arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn aligned_alloc(align: size_t, size: size_t) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    or_enomem(alloc_aligned(align, size))
}

/// `memalign(3)`: an alignment that is not a power of two is rounded up to one (glibc);
/// `EINVAL` when there is none.
///
/// # Safety
/// Any arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memalign(align: size_t, size: size_t) -> *mut c_void {
    let Some(align) = align.max(1).checked_next_power_of_two() else {
        set_errno(libc::EINVAL);
        return null_mut();
    };
    or_enomem(alloc_aligned(align, size))
}

/// `valloc(3)`: page-aligned.
///
/// # Safety
/// Any argument.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn valloc(size: size_t) -> *mut c_void {
    or_enomem(alloc_aligned(page(), size))
}

/// `pvalloc(3)`: page-aligned, the size rounded up to whole pages.
///
/// # Safety
/// Any argument.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pvalloc(size: size_t) -> *mut c_void {
    match size.max(1).checked_next_multiple_of(page()) {
        Some(s) => or_enomem(alloc_aligned(page(), s)),
        None => {
            set_errno(libc::ENOMEM);
            null_mut()
        }
    }
}

/// `malloc_usable_size(3)`: 0 for null and for pointers the library did not hand out.
///
/// # Safety
/// `p` is null or a live block.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> size_t {
    if p.is_null() {
        return 0;
    }
    // SAFETY: forwarded.
    unsafe { POOL.usable_size(p.cast()) }.unwrap_or(0)
}

/// `malloc_trim(3)`: returns every idle slab to the system now; 1 when some memory was
/// released.
///
/// # Safety
/// Any argument.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn malloc_trim(_pad: size_t) -> c_int {
    c_int::from(POOL.purge() > 0)
}

/// `mallopt(3)`: accepted and ignored (1, success): the pool has its own configuration.
///
/// # Safety
/// Any arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mallopt(_param: c_int, _value: c_int) -> c_int {
    1
}

/// glibc's `struct mallinfo2`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct Mallinfo2 {
    /// Bytes committed by the pool (`arena`).
    pub arena: size_t,
    /// Free chunks (0).
    pub ordblks: size_t,
    /// Free fastbin blocks (0).
    pub smblks: size_t,
    /// Mapped regions: the pool's memory regions.
    pub hblks: size_t,
    /// Bytes in large runs.
    pub hblkhd: size_t,
    /// Unused (0).
    pub usmblks: size_t,
    /// Unused (0).
    pub fsmblks: size_t,
    /// Bytes handed out (counting blocks freed into thread caches: see `live_bytes`).
    pub uordblks: size_t,
    /// Bytes committed and not in use.
    pub fordblks: size_t,
    /// Releasable bytes (the idle cached ones).
    pub keepcost: size_t,
}

/// Bytes handed out: small blocks and large runs in use. Blocks freed into a thread's cache,
/// or freed by another thread and not yet collected by their page's owner, still count (the
/// pool's statistics read no thread's cache).
pub(crate) fn live_bytes(s: &pool::alloc::PoolStats) -> u64 {
    s.small_allocated_bytes + s.large_allocated_bytes
}

fn info() -> Mallinfo2 {
    let Ok(pool) = POOL.pool() else {
        return Mallinfo2::default();
    };
    let s = pool.stats();
    let used = live_bytes(&s.alloc) as usize;
    let committed = s.alloc.arena.committed_bytes as usize;
    Mallinfo2 {
        arena: committed,
        hblks: s.alloc.arena.mrs as usize,
        hblkhd: s.alloc.large_allocated_bytes as usize,
        uordblks: used,
        fordblks: committed.saturating_sub(used),
        keepcost: (s.alloc.large_cached_bytes + s.alloc.spare_bytes) as usize,
        ..Mallinfo2::default()
    }
}

/// `mallinfo2(3)`, from the pool's statistics.
///
/// # Safety
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mallinfo2() -> Mallinfo2 {
    info()
}

/// glibc's deprecated `struct mallinfo` (`int` fields, saturated).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct Mallinfo {
    /// As [`Mallinfo2`], saturated to `int`.
    pub arena: c_int,
    /// As [`Mallinfo2`].
    pub ordblks: c_int,
    /// As [`Mallinfo2`].
    pub smblks: c_int,
    /// As [`Mallinfo2`].
    pub hblks: c_int,
    /// As [`Mallinfo2`].
    pub hblkhd: c_int,
    /// As [`Mallinfo2`].
    pub usmblks: c_int,
    /// As [`Mallinfo2`].
    pub fsmblks: c_int,
    /// As [`Mallinfo2`].
    pub uordblks: c_int,
    /// As [`Mallinfo2`].
    pub fordblks: c_int,
    /// As [`Mallinfo2`].
    pub keepcost: c_int,
}

/// `mallinfo(3)`.
///
/// # Safety
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mallinfo() -> Mallinfo {
    let i = info();
    let c = |v: usize| c_int::try_from(v).unwrap_or(c_int::MAX);
    Mallinfo {
        arena: c(i.arena),
        ordblks: 0,
        smblks: 0,
        hblks: c(i.hblks),
        hblkhd: c(i.hblkhd),
        usmblks: 0,
        fsmblks: 0,
        uordblks: c(i.uordblks),
        fordblks: c(i.fordblks),
        keepcost: c(i.keepcost),
    }
}

/// `malloc_stats(3)`: a few lines on standard error.
///
/// # Safety
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn malloc_stats() {
    let i = info();
    let s = POOL.stats();
    let text = format!(
        "rdma_pool: in use {} B, committed {} B, large {} B, degraded allocations {}, \
         foreign frees {}\n",
        i.uordblks, i.arena, i.hblkhd, s.degraded_allocations, s.foreign_frees
    );
    // SAFETY: a valid buffer of that length.
    unsafe { libc::write(2, text.as_ptr().cast(), text.len()) };
}

// glibc's own entry points, which some programs and libraries call directly.

/// glibc's `__libc_malloc`: [`malloc`].
///
/// # Safety
/// As [`malloc`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __libc_malloc(size: size_t) -> *mut c_void {
    alloc(size, false)
}

/// glibc's `__libc_calloc`: [`calloc`].
///
/// # Safety
/// As [`calloc`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __libc_calloc(n: size_t, size: size_t) -> *mut c_void {
    // SAFETY: forwarded.
    unsafe { calloc(n, size) }
}

/// glibc's `__libc_realloc`: [`realloc`].
///
/// # Safety
/// As [`realloc`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __libc_realloc(p: *mut c_void, size: size_t) -> *mut c_void {
    // SAFETY: forwarded.
    unsafe { realloc(p, size) }
}

/// glibc's `__libc_free`: [`free`].
///
/// # Safety
/// As [`free`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __libc_free(p: *mut c_void) {
    // SAFETY: forwarded.
    unsafe { free(p) }
}

/// glibc's `__libc_cfree`: [`free`].
///
/// # Safety
/// As [`free`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __libc_cfree(p: *mut c_void) {
    // SAFETY: forwarded.
    unsafe { free(p) }
}

/// glibc's `__libc_memalign`: [`memalign`].
///
/// # Safety
/// As [`memalign`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __libc_memalign(align: size_t, size: size_t) -> *mut c_void {
    // SAFETY: forwarded.
    unsafe { memalign(align, size) }
}

/// glibc's `__libc_valloc`: [`valloc`].
///
/// # Safety
/// As [`valloc`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __libc_valloc(size: size_t) -> *mut c_void {
    // SAFETY: forwarded.
    unsafe { valloc(size) }
}

/// glibc's `__libc_pvalloc`: [`pvalloc`].
///
/// # Safety
/// As [`pvalloc`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __libc_pvalloc(size: size_t) -> *mut c_void {
    // SAFETY: forwarded.
    unsafe { pvalloc(size) }
}

/// glibc's `__posix_memalign`: [`posix_memalign`].
///
/// # Safety
/// As [`posix_memalign`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __posix_memalign(
    out: *mut *mut c_void,
    align: size_t,
    size: size_t,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { posix_memalign(out, align, size) }
}
