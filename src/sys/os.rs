//! The operating-system calls of the pool: reserve, map, populate, advise, unmap — and
//! zero-initialised metadata arrays mapped straight from the kernel.
//!
//! Contract: nothing here allocates through the global allocator (the arena runs inside
//! `GlobalAlloc`); every failure is the call's `errno`. Dropping, unmapping or replacing pages
//! is told to the registered MMU notifier ([`set_mmu_notifier`]; the soft NIC registers its
//! model of the kernel's when its first device is created).
//!
//! Invariant: an [`MmapArray<T>`] of `n` elements is `n * size_of::<T>()` zero bytes when
//! created, so `T` must be valid when all-zero (integers and atomics).

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, Ordering};

/// The MMU notifier: told `(addr, len)` whenever this crate drops, unmaps or replaces pages
/// (`map_fixed`, `unmap_to_reserved`, `madvise(MADV_DONTNEED)`), as the kernel tells a NIC
/// driver's notifier. A NIC model that caches translations (the soft NIC's ODP) registers it;
/// null until then. A `fn(usize, usize)` stored as a pointer.
static MMU_NOTIFIER: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());

/// Register the MMU notifier (the last registration wins; every caller registers the same).
pub(crate) fn set_mmu_notifier(f: fn(usize, usize)) {
    MMU_NOTIFIER.store(f as *mut (), Ordering::Release);
}

/// Tell the registered notifier that pages of `[addr, addr + len)` changed.
fn mmu_notify(addr: usize, len: usize) {
    let f = MMU_NOTIFIER.load(Ordering::Acquire);
    if !f.is_null() {
        // SAFETY: only `set_mmu_notifier` stores here, and it stores a `fn(usize, usize)`.
        let f: fn(usize, usize) = unsafe { std::mem::transmute::<*mut (), fn(usize, usize)>(f) };
        f(addr, len);
    }
}

/// The calling thread's `errno`.
pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// `MAP_HUGE_2MB`: ask hugetlbfs for 2 MiB pages whatever the default huge page size.
const MAP_HUGE_2MB: libc::c_int = 21 << 26; // log2(2 MiB) << MAP_HUGE_SHIFT

/// Reserve a window for `n` reservations of `len` bytes aligned to `align` (see [`reserve`]),
/// with room for the metadata the arena and the pool map for it afterwards (about 1/256 of
/// the window). Under an address-space limit (`RLIMIT_AS`) the window and its metadata take at
/// most half of what the process has left; while that does not hold, or the kernel refuses the
/// mapping (`ENOMEM`: the limit, or a crowded address space), `n` is halved down to one, then
/// `len` down to `align`. Returns the window, its length and the reservation size used.
pub(crate) fn reserve_window(
    len: usize,
    n: u32,
    align: usize,
) -> Result<(NonNull<u8>, usize, usize), i32> {
    let budget = address_space_headroom().map(|h| h / 2);
    let (mut len, mut n) = (len, n.max(1) as usize);
    loop {
        let window = len.checked_mul(n).ok_or(libc::ENOMEM)?;
        let meta = window / 256;
        let total = window.checked_add(meta).ok_or(libc::ENOMEM)?;
        if budget.is_none_or(|b| total.saturating_add(align) <= b) {
            match reserve(total, align) {
                Ok(p) => {
                    if meta > 0 {
                        // SAFETY: the metadata's room at the end of the mapping just made: it
                        // was only there to prove the address space has it.
                        unsafe { libc::munmap(p.as_ptr().add(window).cast(), meta) };
                    }
                    return Ok((p, window, len));
                }
                Err(libc::ENOMEM) => {}
                Err(e) => return Err(e),
            }
        }
        if n > 1 {
            n /= 2;
        } else if len > align {
            len /= 2;
        } else {
            return Err(libc::ENOMEM);
        }
    }
}

/// Bytes of address space the process may still map under `RLIMIT_AS`; `None` without a
/// limit (or when it cannot be read).
pub(crate) fn address_space_headroom() -> Option<usize> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut lim) } != 0
        || lim.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    let mut buf = [0u8; 128];
    let text = read_small(c"/proc/self/statm", &mut buf)?;
    let pages = text
        .split(|b| b.is_ascii_whitespace())
        .next()
        .and_then(parse_u64)?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    let limit = usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX);
    Some(limit.saturating_sub(usize::try_from(pages * page).unwrap_or(usize::MAX)))
}

/// Reserve `len` bytes of address space aligned to `align` (a power of two), inaccessible and
/// without commit charge (`PROT_NONE`, `MAP_NORESERVE`).
pub(crate) fn reserve(len: usize, align: usize) -> Result<NonNull<u8>, i32> {
    let total = len.checked_add(align).ok_or(libc::ENOMEM)?;
    // SAFETY: a fresh anonymous mapping at an address of the kernel's choice.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(errno());
    }
    let start = p as usize;
    let aligned = (start + align - 1) & !(align - 1);
    // SAFETY: both trims are inside the mapping just made and owned by no one else.
    unsafe {
        if aligned > start {
            libc::munmap(p, aligned - start);
        }
        let end = aligned + len;
        if start + total > end {
            libc::munmap(end as *mut libc::c_void, start + total - end);
        }
    }
    NonNull::new(aligned as *mut u8).ok_or(libc::ENOMEM)
}

/// Map `[addr, addr + len)` (inside a reservation the arena owns) readable and writable,
/// without commit charge: hugetlb 2 MiB pages when `huge`, ordinary anonymous memory otherwise.
///
/// # Safety
/// The range lies inside a reservation owned by the caller; what was mapped there is replaced.
pub(crate) unsafe fn map_fixed(addr: *mut u8, len: usize, huge: bool) -> Result<(), i32> {
    let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED;
    if huge {
        flags |= libc::MAP_HUGETLB | MAP_HUGE_2MB;
    }
    // SAFETY: MAP_FIXED over memory the caller owns (see above).
    let p = unsafe {
        libc::mmap(
            addr.cast(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(errno())
    } else {
        mmu_notify(addr as usize, len);
        Ok(())
    }
}

/// Return `[addr, addr + len)` to `PROT_NONE` reservation.
///
/// # Safety
/// As [`map_fixed`]; nothing in the range may be used afterwards.
pub(crate) unsafe fn unmap_to_reserved(addr: *mut u8, len: usize) -> Result<(), i32> {
    // SAFETY: forwarded from the caller.
    let p = unsafe {
        libc::mmap(
            addr.cast(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        Err(errno())
    } else {
        mmu_notify(addr as usize, len);
        Ok(())
    }
}

/// `madvise(addr, len, advice)`; a discarding advice (`MADV_DONTNEED`) is told to the soft
/// NIC's model of the MMU notifier.
///
/// # Safety
/// The advice must not discard memory anyone still uses (`MADV_DONTNEED`).
pub(crate) unsafe fn madvise(addr: *mut u8, len: usize, advice: libc::c_int) -> Result<(), i32> {
    // SAFETY: forwarded from the caller.
    if unsafe { libc::madvise(addr.cast(), len, advice) } == 0 {
        if advice == libc::MADV_DONTNEED {
            mmu_notify(addr as usize, len);
        }
        Ok(())
    } else {
        Err(errno())
    }
}

/// Give back the whole OS pages inside `[addr, addr + len)` of private anonymous memory that
/// no NIC ever registers (`MADV_DONTNEED`, no NIC model told): they read as zero until written
/// again. The pages are found with the kernel's real page size (on a kernel of 64 KiB pages a
/// 4 KiB-rounded range would take its neighbours along). The bytes advised away (0: no whole
/// page inside, or the advice failed); at most that much was resident.
///
/// # Safety
/// Nobody reads those bytes before writing them again, unless zeros are what it expects.
pub(crate) unsafe fn discard_inside(addr: usize, len: usize) -> usize {
    // SAFETY: no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let (from, to) = (addr.next_multiple_of(page), (addr + len) & !(page - 1));
    if from >= to {
        return 0;
    }
    // SAFETY: whole pages inside the caller's range; the caller vouches nobody uses them.
    match unsafe { libc::madvise(from as *mut libc::c_void, to - from, libc::MADV_DONTNEED) } {
        0 => to - from,
        _ => 0,
    }
}

/// Fault `[addr, addr + len)` in writable (`MADV_POPULATE_WRITE`, Linux ≥ 5.14): an error
/// (`ENOMEM`, `EFAULT`) rather than a `SIGBUS` when hugetlb pages run out.
pub(crate) fn populate_write(addr: *mut u8, len: usize) -> Result<(), i32> {
    // SAFETY: populating allocates pages and changes no content.
    unsafe { madvise(addr, len, libc::MADV_POPULATE_WRITE) }
}

/// Bytes the process can still populate: the smaller of `MemAvailable` (`/proc/meminfo`) and
/// the cgroup v2 headroom (`memory.max - memory.current` of the process's cgroup, when it has a
/// limit). `None` when neither can be read. Reads into stack buffers.
pub(crate) fn memory_headroom() -> Option<u64> {
    let mut buf = [0u8; 4096];
    let avail = read_small(c"/proc/meminfo", &mut buf)
        .and_then(|t| field_kib(t, b"MemAvailable:"))
        .map(|kib| kib.saturating_mul(1024));
    let cgroup = cgroup_headroom();
    match (avail, cgroup) {
        (Some(a), Some(c)) => Some(a.min(c)),
        (a, c) => a.or(c),
    }
}

/// `memory.max - memory.current` of this process's cgroup (v2), if it has a limit.
fn cgroup_headroom() -> Option<u64> {
    let mut buf = [0u8; 512];
    // "0::/path\n" in cgroup v2.
    let line = read_small(c"/proc/self/cgroup", &mut buf)?;
    let path = line
        .split(|&b| b == b'\n')
        .find_map(|l| l.strip_prefix(b"0::"))?;
    let mut file = [0u8; 512];
    let read = |name: &[u8], file: &mut [u8; 512]| -> Option<u64> {
        let prefix = b"/sys/fs/cgroup";
        let n = prefix.len() + path.len() + 1 + name.len();
        if n >= file.len() {
            return None;
        }
        file[..prefix.len()].copy_from_slice(prefix);
        file[prefix.len()..prefix.len() + path.len()].copy_from_slice(path);
        file[prefix.len() + path.len()] = b'/';
        file[prefix.len() + path.len() + 1..n].copy_from_slice(name);
        file[n] = 0;
        let cpath = std::ffi::CStr::from_bytes_until_nul(&file[..=n]).ok()?;
        let mut v = [0u8; 64];
        parse_u64(read_small(cpath, &mut v)?)
    };
    let max = read(b"memory.max", &mut file)?;
    let current = read(b"memory.current", &mut file)?;
    Some(max.saturating_sub(current))
}

/// Read up to `buf.len()` bytes of a small file.
pub(crate) fn read_small<'a>(path: &std::ffi::CStr, buf: &'a mut [u8]) -> Option<&'a [u8]> {
    // SAFETY: open/read/close on a NUL-terminated path and a caller's buffer.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return None;
        }
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        (n > 0).then(|| &buf[..n as usize])
    }
}

/// The number after `name` in a `/proc` key-value text.
fn field_kib(text: &[u8], name: &[u8]) -> Option<u64> {
    let at = text.windows(name.len()).position(|w| w == name)?;
    let rest = &text[at + name.len()..];
    let digits: &[u8] = rest
        .iter()
        .position(|b| b.is_ascii_digit())
        .map(|i| &rest[i..])?;
    let end = digits
        .iter()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len());
    parse_u64(&digits[..end])
}

/// A decimal number (leading/trailing whitespace allowed); `None` for "max" or garbage.
fn parse_u64(s: &[u8]) -> Option<u64> {
    let s = s.trim_ascii();
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    s.iter().try_fold(0u64, |n, &d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// Whether transparent huge pages may back `MADV_HUGEPAGE` memory (the sysfs switch is not
/// `[never]`). Reads into a stack buffer.
pub(crate) fn thp_available() -> bool {
    let path = c"/sys/kernel/mm/transparent_hugepage/enabled";
    // SAFETY: open/read/close on a NUL-terminated path and a stack buffer.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return false;
        }
        let mut buf = [0u8; 128];
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        n > 0 && !contains(&buf[..n as usize], b"[never]")
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A fixed-length array of `T` in its own anonymous mapping, zeroed, never from the global
/// allocator.
pub(crate) struct MmapArray<T> {
    ptr: NonNull<T>,
    len: usize,
    /// Registered with the leak checker as a root region (see [`lsan_root`]).
    scanned: bool,
    _own: PhantomData<T>,
}

// SAFETY: the array owns its elements like a `Box<[T]>`.
unsafe impl<T: Send> Send for MmapArray<T> {}
// SAFETY: as `Box<[T]>`: shared access hands out `&T` only.
unsafe impl<T: Sync> Sync for MmapArray<T> {}

impl<T> MmapArray<T> {
    /// `len` zeroed elements.
    ///
    /// # Safety
    /// The all-zero bit pattern is a valid `T`.
    pub(crate) unsafe fn zeroed(len: usize) -> Result<Self, i32> {
        // SAFETY: forwarded.
        unsafe { Self::zeroed_scanned(len, true) }
    }

    /// [`MmapArray::zeroed`] for a table whose pointers lead only into memory the pool maps
    /// itself (never to a block of the system allocator): the leak checker does not scan it
    /// (the page table spans 1/32 of the window, tens of GiB of untouched address space).
    ///
    /// # Safety
    /// As [`MmapArray::zeroed`].
    pub(crate) unsafe fn zeroed_unscanned(len: usize) -> Result<Self, i32> {
        // SAFETY: forwarded.
        unsafe { Self::zeroed_scanned(len, false) }
    }

    unsafe fn zeroed_scanned(len: usize, scanned: bool) -> Result<Self, i32> {
        let bytes = len.checked_mul(size_of::<T>()).ok_or(libc::ENOMEM)?.max(1);
        // SAFETY: a fresh private anonymous mapping (zero-filled by the kernel).
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(errno());
        }
        if scanned {
            lsan_root(p, bytes, true);
        }
        Ok(MmapArray {
            ptr: NonNull::new(p.cast()).ok_or(libc::ENOMEM)?,
            len,
            scanned,
            _own: PhantomData,
        })
    }

    /// Give the OS pages wholly inside elements `[from, from + n)` back (`MADV_DONTNEED`):
    /// they read as zero again, and cost no memory until written. True when every byte of
    /// the range was in such a page and was given back; false leaves it as it was, or zeroed
    /// in part (the caller then writes what it needs).
    ///
    /// # Safety
    /// No other thread writes those elements meanwhile (a write racing the discard may be
    /// lost), and the all-zero bit pattern is a valid `T`.
    pub(crate) unsafe fn discard(&self, from: usize, n: usize) -> bool {
        let (Some(end), true) = (from.checked_add(n), n > 0) else {
            return false;
        };
        if end > self.len {
            return false;
        }
        let at = self.ptr.as_ptr() as usize + from * size_of::<T>();
        let bytes = n * size_of::<T>();
        if at % 4096 != 0 || bytes % 4096 != 0 {
            return false;
        }
        // SAFETY: whole pages of this private anonymous mapping (checked above); the caller
        // vouches that zeros are valid elements and that nobody writes them meanwhile.
        unsafe { libc::madvise(at as *mut libc::c_void, bytes, libc::MADV_DONTNEED) == 0 }
    }

    /// Element `i`, or `None` past the end.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        // SAFETY: `i < len` elements were zero-initialised and are valid `T`s.
        (i < self.len).then(|| unsafe { &*self.ptr.as_ptr().add(i) })
    }

    /// Element `i` without a bounds check.
    ///
    /// # Safety
    /// `i < self.len()`.
    #[inline]
    pub(crate) unsafe fn get_unchecked(&self, i: usize) -> &T {
        // SAFETY: `i < len` (the caller's promise), and those elements are valid `T`s.
        unsafe { &*self.ptr.as_ptr().add(i) }
    }

    /// Element `i` mutably, or `None` past the end.
    pub(crate) fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        // SAFETY: as `get`, with exclusive access through `&mut self`.
        (i < self.len).then(|| unsafe { &mut *self.ptr.as_ptr().add(i) })
    }

    /// Number of elements.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl<T> Drop for MmapArray<T> {
    fn drop(&mut self) {
        // SAFETY: drop each element in place, then unmap the array we mapped.
        unsafe {
            std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(
                self.ptr.as_ptr(),
                self.len,
            ));
            let bytes = (self.len * size_of::<T>()).max(1);
            if self.scanned {
                lsan_root(self.ptr.as_ptr().cast(), bytes, false);
            }
            libc::munmap(self.ptr.as_ptr().cast(), bytes);
        }
    }
}

/// Built for AddressSanitizer (`--cfg rdma_pool_asan`, `scripts/memcheck.sh`): tell its leak
/// checker to scan (`add`) or stop scanning a metadata mapping of the pool's, whose pointers
/// keep heap objects (e.g. the arena's region handles) alive; without this, everything only the
/// pool's metadata points at would be reported as leaked. Nothing otherwise. (Not the arena
/// itself: reading its committed but untouched hugetlb pages would take huge pages, or
/// `SIGBUS` when none are left; see `scripts/lsan.supp`.)
fn lsan_root(p: *const libc::c_void, bytes: usize, add: bool) {
    #[cfg(rdma_pool_asan)]
    {
        // SAFETY: the LeakSanitizer interface linked by `-Zsanitizer=address`.
        unsafe extern "C" {
            fn __lsan_register_root_region(p: *const libc::c_void, size: usize);
            fn __lsan_unregister_root_region(p: *const libc::c_void, size: usize);
        }
        // SAFETY: the runtime records (or forgets) the range; it reads it only while mapped.
        unsafe {
            if add {
                __lsan_register_root_region(p, bytes);
            } else {
                __lsan_unregister_root_region(p, bytes);
            }
        }
    }
    let _ = (p, bytes, add);
}

/// One `T` in its own anonymous mapping (a `Box` that never touches the global allocator).
pub(crate) struct MmapBox<T> {
    ptr: NonNull<T>,
}

// SAFETY: owns its `T` like a `Box<T>`.
unsafe impl<T: Send> Send for MmapBox<T> {}
// SAFETY: as `Box<T>`.
unsafe impl<T: Sync> Sync for MmapBox<T> {}

impl<T> MmapBox<T> {
    /// Map and move `value` in.
    pub(crate) fn new(value: T) -> Result<Self, (T, i32)> {
        // SAFETY: zeroed bytes are only a destination for the write below, never read as `T`.
        let raw = match unsafe { MmapArray::<std::mem::MaybeUninit<T>>::zeroed(1) } {
            Ok(a) => a,
            Err(e) => return Err((value, e)),
        };
        let ptr = raw.ptr.cast::<T>();
        std::mem::forget(raw);
        // SAFETY: a fresh mapping of `size_of::<T>()` bytes, suitably aligned (page-aligned).
        unsafe { ptr.as_ptr().write(value) };
        Ok(MmapBox { ptr })
    }

    /// A second handle to the value at `ptr`, never dropped.
    ///
    /// # Safety
    /// `ptr` is the value of a live `MmapBox<T>`, and the alias is not used after that box is
    /// dropped, nor mutated through ([`MmapBox::get_mut`]).
    pub(crate) unsafe fn alias(ptr: *const T) -> std::mem::ManuallyDrop<MmapBox<T>> {
        std::mem::ManuallyDrop::new(MmapBox {
            // SAFETY: the value of a live box is not null (the caller's contract).
            ptr: unsafe { NonNull::new_unchecked(ptr as *mut T) },
        })
    }

    /// The value, mutably (the owner's box: an alias is never mutated through, see
    /// [`MmapBox::alias`]).
    pub(crate) fn get_mut(&mut self) -> &mut T {
        // SAFETY: initialised in `new`; `&mut self` is the only handle in use.
        unsafe { self.ptr.as_mut() }
    }

    /// Leave the value mapped for the rest of the process (memory still in use elsewhere).
    pub(crate) fn leak(self) {
        std::mem::forget(self);
    }

    /// Never unmap: the value lives for the rest of the process.
    pub(crate) fn into_static(self) -> &'static T {
        let ptr = self.ptr;
        std::mem::forget(self);
        // SAFETY: the mapping is never unmapped now, and the value was initialised in `new`.
        unsafe { ptr.as_ref() }
    }
}

impl<T> std::ops::Deref for MmapBox<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: initialised in `new`, alive until drop.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T> Drop for MmapBox<T> {
    fn drop(&mut self) {
        // SAFETY: drop the value, then unmap what `new` mapped.
        unsafe {
            std::ptr::drop_in_place(self.ptr.as_ptr());
            lsan_root(self.ptr.as_ptr().cast(), size_of::<T>().max(1), false);
            libc::munmap(self.ptr.as_ptr().cast(), size_of::<T>().max(1));
        }
    }
}
