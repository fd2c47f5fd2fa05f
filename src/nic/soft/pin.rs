//! Pinned pages: what a pinned (non-ODP) region holds, and how the soft NIC notices that the
//! process no longer sees those pages.
//!
//! Hardware pins the pages mapped at registration (`pin_user_pages(FOLL_LONGTERM)`) and keeps
//! moving *those* pages whatever the process does to its mapping afterwards: after
//! `madvise(MADV_DONTNEED)` a READ returns the old bytes, after `mprotect(PROT_READ)` a WRITE
//! still lands, after `munmap` (or a `MAP_FIXED` remap) the NIC still reads the old pages. User
//! space cannot keep private pages alive behind the process's back, so the soft NIC *detects*
//! instead of silently moving bytes the hardware would not:
//!
//! - at registration every page is faulted in, as pinning does (`MADV_POPULATE_WRITE` where the
//!   mapping is writable, else `MADV_POPULATE_READ`), and each page's identity is recorded from
//!   `/proc/self/pagemap`: the present bit, the swapped bit, the file-or-shared bit and, where
//!   the process may read it (root), the page frame number;
//! - every access re-reads the entries of the pages it touches ([`PinnedPages::held`]); a
//!   different entry means the pinned pages are not the ones the process sees any more;
//! - a DMA that faults on a pinned region (protection lowered, range unmapped) means the same:
//!   registration proved the range was mapped with the rights the region needs.
//!
//! Either way the access fails with an error completion and is counted
//! (`Counters::stale_pinned_accesses`). ODP regions follow the current mapping (that is what
//! ODP does) and are not checked here.
//!
//! Detected: a dropped or unmapped page the CPU has not touched again (`MADV_DONTNEED`,
//! `munmap`, a new mapping not yet faulted in), a file or shared page where an anonymous one was
//! (or the reverse, e.g. a `MAP_FIXED` remap of a memfd), and any loss of protection the access
//! needs (through the DMA fault); with frame numbers (root), also a dropped page the CPU has
//! read again (it now shows the zero page, `KPF_ZERO_PAGE` in `/proc/kpageflags`). Not
//! detected: a dropped page the CPU has written again, and `mprotect` that keeps the rights an
//! access needs.
//!
//! Any other change of frame is *not* taken for a replacement: nothing pins the pages here, so
//! the kernel migrates them (compaction, NUMA balancing, THP collapse), which real pinning
//! forbids; a new frame with the same kind of page says nothing about the process (two CI runs
//! failed on migrated pages when every frame change counted). A page caught mid-migration
//! reads as swapped out for a moment; [`PinnedPages::held`] looks again before it calls such a
//! page gone.
//!
//! Invariant: `ids.len()` is the number of pages `[addr, addr + len)` touches, an id holds only
//! `IDENTITY` bits, and an id of 0
//! ("not recorded": the page could not be read at registration) is never compared.

use super::mem;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;

/// `MADV_POPULATE_READ` / `MADV_POPULATE_WRITE` (Linux 5.14; not in the `libc` crate yet).
const MADV_POPULATE_READ: libc::c_int = 22;
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// Bits of a pagemap entry that identify the page behind a virtual page: its kind, compared
/// always, and its frame (root only), compared only against the zero page (module contract).
const PFN: u64 = (1 << 55) - 1;
const FILE_OR_SHARED: u64 = 1 << 61;
const SWAPPED: u64 = 1 << 62;
const PRESENT: u64 = 1 << 63;
const KIND: u64 = FILE_OR_SHARED | SWAPPED | PRESENT;
const IDENTITY: u64 = PFN | KIND;

/// `KPF_ZERO_PAGE` in `/proc/kpageflags`: the zero page or the huge zero page.
const KPF_ZERO_PAGE: u64 = 1 << 24;

/// How often, and how long apart, [`PinnedPages::held`] looks again at a page that reads as
/// swapped out: a migration entry lasts microseconds; 20 × 500 µs outlasts a busy compaction.
const MIGRATION_LOOKS: u32 = 20;
const MIGRATION_PAUSE: std::time::Duration = std::time::Duration::from_micros(500);

/// The identities of the pages a pinned region holds.
pub(super) struct PinnedPages {
    first_page: usize,
    ids: Box<[u64]>,
}

impl PinnedPages {
    /// Fault `[addr, addr + len)` in as pinning does and record what backs it. `writable`: the
    /// mapping may be written (the range was checked mapped, and writable when this is true).
    ///
    /// # Errors
    /// `ENOMEM` or `EFAULT` when the pages cannot be faulted in (e.g. no huge pages left for a
    /// hugetlb mapping), as pinning fails.
    pub(super) fn pin(addr: usize, len: usize, writable: bool) -> Result<PinnedPages, i32> {
        let ps = mem::page_size();
        let (first, last) = (addr / ps, (addr + len - 1) / ps);
        let advice = if writable {
            MADV_POPULATE_WRITE
        } else {
            MADV_POPULATE_READ
        };
        // SAFETY: populating faults pages in; it changes no byte the process can see (a write
        // fault allocates a zeroed page or breaks COW with the same contents).
        let rc = unsafe {
            libc::madvise(
                (first * ps) as *mut libc::c_void,
                (last + 1 - first) * ps,
                advice,
            )
        };
        if rc != 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                // Older kernels and special mappings: record what is present, check only that.
                Some(libc::EINVAL) | Some(libc::EPERM) => {}
                Some(libc::ENOMEM) => return Err(libc::ENOMEM),
                _ => return Err(libc::EFAULT),
            }
        }
        let mut ids = vec![0u64; last + 1 - first].into_boxed_slice();
        if read_entries(first, &mut ids).is_err() {
            ids.fill(0);
        }
        for id in ids.iter_mut() {
            *id = if *id & PRESENT != 0 {
                *id & IDENTITY
            } else {
                0
            };
        }
        Ok(PinnedPages {
            first_page: first,
            ids,
        })
    }

    /// True when every page of `[addr, addr + len)` (inside the region) is still the page
    /// recorded at registration. Allocation-free: entries are read in stack-sized batches. A
    /// present page that now reads as swapped out is looked at again (it may be mid-migration)
    /// before it counts as gone.
    pub(super) fn held(&self, addr: usize, len: usize) -> bool {
        if len == 0 {
            return true;
        }
        let ps = mem::page_size();
        let (lo, hi) = (addr / ps, (addr + len - 1) / ps);
        let mut batch = [0u64; 256];
        let mut page = lo;
        while page <= hi {
            let n = (hi + 1 - page).min(batch.len());
            if read_entries(page, &mut batch[..n]).is_err() {
                // No pagemap to compare with (it was readable at registration, or every id is
                // 0 and nothing is compared): nothing can be said.
                return true;
            }
            for (i, &entry) in batch[..n].iter().enumerate() {
                if !self.same(page + i, entry) && !self.settles(page + i) {
                    return false;
                }
            }
            page += n;
        }
        true
    }

    /// True when `entry`, read for virtual page `page`, shows the page recorded there (or none
    /// was recorded, or `page` is outside the region): the same kind of page, on the same
    /// frame or, where frames are seen, on any frame but the zero page (a migrated page).
    fn same(&self, page: usize, entry: u64) -> bool {
        let Some(&want) = self.ids.get(page.wrapping_sub(self.first_page)) else {
            return true;
        };
        let frame = entry & PFN;
        want == 0 || (entry & KIND == want & KIND && (frame == want & PFN || !zero_frame(frame)))
    }

    /// True when page `page`, which differs from its record, comes back to it: only a page
    /// recorded present that reads as swapped out (a migration entry) is waited for.
    #[cold]
    fn settles(&self, page: usize) -> bool {
        let mut entry = [0u64; 1];
        for _ in 0..MIGRATION_LOOKS {
            if read_entries(page, &mut entry).is_err() {
                return true;
            }
            if self.same(page, entry[0]) {
                return true;
            }
            if entry[0] & SWAPPED == 0 {
                return false;
            }
            std::thread::sleep(MIGRATION_PAUSE);
        }
        false
    }
}

/// True when frame `pfn` is the zero page or the huge zero page. Allocation-free after the
/// first call; false when `/proc/kpageflags` cannot be read (unprivileged).
fn zero_frame(pfn: u64) -> bool {
    static KPAGEFLAGS: OnceLock<Option<File>> = OnceLock::new();
    let Some(file) = KPAGEFLAGS.get_or_init(|| File::open("/proc/kpageflags").ok()) else {
        return false;
    };
    let mut flags = [0u8; 8];
    pfn != 0
        && file.read_exact_at(&mut flags, pfn * 8).is_ok()
        && u64::from_ne_bytes(flags) & KPF_ZERO_PAGE != 0
}

/// Read the pagemap entries of pages `first..first + out.len()` of this process.
fn read_entries(first: usize, out: &mut [u64]) -> std::io::Result<()> {
    // The file of the process that opened it: a forked child opens its own.
    static PAGEMAP: OnceLock<(u32, Option<File>)> = OnceLock::new();
    let pid = std::process::id();
    let (owner, file) = PAGEMAP.get_or_init(|| (pid, File::open("/proc/self/pagemap").ok()));
    let own;
    let file = if *owner == pid {
        file.as_ref()
    } else {
        own = File::open("/proc/self/pagemap").ok();
        own.as_ref()
    }
    .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOENT))?;
    // SAFETY: `out` is a plain slice of u64; viewing it as bytes of the same length is valid
    // for writes of any bit pattern.
    let bytes = unsafe {
        std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(out))
    };
    file.read_exact_at(bytes, first as u64 * 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anon(pages: usize) -> memmap2::MmapMut {
        memmap2::MmapOptions::new()
            .len(pages * mem::page_size())
            .map_anon()
            .unwrap()
    }

    #[test]
    fn pinning_faults_pages_in_and_sees_them_dropped() {
        let mut m = anon(4);
        let ps = mem::page_size();
        let p = m.as_mut_ptr() as usize;
        let pins = PinnedPages::pin(p, 4 * ps, true).unwrap();
        assert!(pins.ids.iter().all(|&id| id & PRESENT != 0), "populated");
        assert!(pins.held(p, 4 * ps));
        // SAFETY: the mapping is ours; dropping its second page only zeroes it.
        unsafe { libc::madvise((p + ps) as *mut libc::c_void, ps, libc::MADV_DONTNEED) };
        assert!(pins.held(p, ps), "the first page is untouched");
        assert!(!pins.held(p, 2 * ps), "the second page is gone");
        assert!(!pins.held(p + ps + 100, 1));
        m[ps] = 7; // the CPU faults a page in again: maybe the same frame (see the contract)
        assert!(pins.held(p, ps));
    }

    #[test]
    fn a_range_beyond_the_region_is_not_compared() {
        let m = anon(2);
        let p = m.as_ptr() as usize;
        let pins = PinnedPages::pin(p, mem::page_size(), false).unwrap();
        assert!(pins.held(p, 2 * mem::page_size()));
    }
}
