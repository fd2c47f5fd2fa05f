//! Page-aligned buffers for registration: anonymous mappings (`memmap2`) and 2 MiB hugetlb pages
//! (`hugepage-rs`).
//!
//! Contract: a `Buffer` is page-aligned, zero-filled, and unmapped on drop; `huge()` never falls
//! back silently — it fails when no huge pages are reserved, and the caller decides.

use std::alloc::Layout;
use std::io;
use std::ptr::NonNull;

/// A page-aligned buffer for NIC registration.
pub struct Buffer {
    kind: Kind,
    len: usize,
}

enum Kind {
    Mmap(memmap2::MmapMut),
    Huge(NonNull<u8>, Layout),
}

// SAFETY: the buffer owns its mapping exclusively; it is plain memory.
unsafe impl Send for Buffer {}
// SAFETY: shared access only reads through `&self`.
unsafe impl Sync for Buffer {}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("len", &self.len)
            .field("hugetlb", &self.is_hugetlb())
            .finish()
    }
}

/// The huge page size from `/proc/meminfo`, if the kernel has hugetlb.
pub fn huge_page_size() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: usize = info
        .lines()
        .find_map(|l| l.strip_prefix("Hugepagesize:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

impl Buffer {
    /// A zeroed, page-aligned anonymous mapping of `len` bytes.
    ///
    /// # Errors
    /// The `mmap` failure; `InvalidInput` for `len == 0`.
    ///
    /// # Examples
    /// ```
    /// let b = rdma_pool::nic::Buffer::new(10_000).unwrap();
    /// assert_eq!(b.as_ptr() as usize % 4096, 0);
    /// assert!(b.as_slice().iter().all(|&x| x == 0));
    /// ```
    pub fn new(len: usize) -> io::Result<Buffer> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty buffer"));
        }
        Ok(Buffer {
            kind: Kind::Mmap(memmap2::MmapMut::map_anon(len)?),
            len,
        })
    }

    /// A zeroed buffer of `len` bytes (rounded up to whole huge pages) on hugetlb pages.
    ///
    /// # Errors
    /// `OutOfMemory` when no huge pages are reserved (`/proc/sys/vm/nr_hugepages`) or left;
    /// `Unsupported` without hugetlb.
    ///
    /// # Examples
    /// ```
    /// match rdma_pool::nic::Buffer::huge(1 << 21) {
    ///     Ok(b) => assert!(b.is_hugetlb()),
    ///     Err(e) => println!("no huge pages here: {e}"),
    /// }
    /// ```
    pub fn huge(len: usize) -> io::Result<Buffer> {
        let hp = huge_page_size()
            .ok_or_else(|| io::Error::new(io::ErrorKind::Unsupported, "no hugetlb support"))?;
        let size = len
            .max(1)
            .div_ceil(hp)
            .checked_mul(hp)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "buffer too large"))?;
        let layout = Layout::from_size_align(size, hp)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: the layout has a non-zero size; hugepage_rs returns null on failure.
        let p = unsafe { hugepage_rs::alloc(layout) };
        let p = NonNull::new(p)
            .ok_or_else(|| io::Error::new(io::ErrorKind::OutOfMemory, "no huge pages available"))?;
        Ok(Buffer {
            kind: Kind::Huge(p, layout),
            len: size,
        })
    }

    /// Start of the buffer.
    pub fn as_ptr(&self) -> *const u8 {
        match &self.kind {
            Kind::Mmap(m) => m.as_ptr(),
            Kind::Huge(p, _) => p.as_ptr(),
        }
    }

    /// Start of the buffer, for writing and registration.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        match &mut self.kind {
            Kind::Mmap(m) => m.as_mut_ptr(),
            Kind::Huge(p, _) => p.as_ptr(),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True for hugetlb-backed buffers.
    pub fn is_hugetlb(&self) -> bool {
        matches!(self.kind, Kind::Huge(..))
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is `len` bytes, initialised (zero-filled by the kernel).
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.len;
        // SAFETY: as for `as_slice`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), len) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Kind::Huge(p, layout) = self.kind {
            // SAFETY: `p` came from hugepage_rs::alloc with this layout and is freed once.
            unsafe { hugepage_rs::dealloc(p.as_ptr(), layout) };
        }
    }
}
