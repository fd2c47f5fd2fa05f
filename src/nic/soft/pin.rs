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
//!   the process may read it (`CAP_SYS_ADMIN`), the page frame number;
//! - every access re-reads the entries of the pages it touches ([`PinnedPages::held`]); a
//!   different entry means the pinned pages are not the ones the process sees any more;
//! - a DMA that faults on a pinned region (protection lowered, range unmapped) means the same:
//!   registration proved the range was mapped with the rights the region needs.
//!
//! Either way the access fails with an error completion and is counted
//! (`Counters::stale_pinned_accesses`). ODP regions follow the current mapping (that is what
//! ODP does) and are not checked here.
//!
//! Detected without privileges: a dropped or unmapped page the CPU has not touched again
//! (`MADV_DONTNEED`, `munmap`, a new mapping not yet faulted in), a file or shared page where an
//! anonymous one was (or the reverse, e.g. a `MAP_FIXED` remap of a memfd), and any loss of
//! protection the access needs (through the DMA fault). Seen only with page frame numbers
//! (`CAP_SYS_ADMIN`): a private anonymous page replaced by another frame — a page dropped or
//! unmapped and faulted in again by the CPU, a new anonymous mapping the CPU already touched —
//! *when the kernel hands out a different frame*; it usually hands the freed frame straight
//! back (nothing pins it here, unlike under real pinning), so that case stays undetectable in
//! practice, as does `mprotect` that keeps the rights an access needs. Kernel migration of an
//! unpinned page (compaction, NUMA balancing, KSM), which real pinning prevents, would be
//! reported as a replacement.
//!
//! Invariant: `ids.len()` is the number of pages `[addr, addr + len)` touches, and an id of 0
//! ("not recorded": the page could not be read at registration) is never compared.

use super::mem;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;

/// `MADV_POPULATE_READ` / `MADV_POPULATE_WRITE` (Linux 5.14; not in the `libc` crate yet).
const MADV_POPULATE_READ: libc::c_int = 22;
const MADV_POPULATE_WRITE: libc::c_int = 23;

/// Bits of a pagemap entry that identify the page behind a virtual page.
const PFN: u64 = (1 << 55) - 1;
const FILE_OR_SHARED: u64 = 1 << 61;
const SWAPPED: u64 = 1 << 62;
const PRESENT: u64 = 1 << 63;
const IDENTITY: u64 = PFN | FILE_OR_SHARED | SWAPPED | PRESENT;

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
    /// recorded at registration. Allocation-free: entries are read in stack-sized batches.
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
                let Some(&want) = self.ids.get(page + i - self.first_page) else {
                    continue;
                };
                if want != 0 && entry & IDENTITY != want {
                    return false;
                }
            }
            page += n;
        }
        true
    }

    /// True when this registration could record page frame numbers (privileged process).
    #[cfg(test)]
    fn knows_frames(&self) -> bool {
        self.ids.iter().any(|&id| id & PFN != 0)
    }
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

/// True when this process can see page frame numbers in its pagemap (`CAP_SYS_ADMIN`), so that
/// [`PinnedPages::held`] sees every replacement (see the module contract).
pub(crate) fn frames_visible() -> bool {
    let probe = [0u8; 1];
    let page = probe.as_ptr() as usize / mem::page_size();
    let mut entry = [0u64; 1];
    read_entries(page, &mut entry).is_ok() && entry[0] & PFN != 0
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
        assert_eq!(pins.knows_frames(), frames_visible());
    }

    #[test]
    fn a_range_beyond_the_region_is_not_compared() {
        let m = anon(2);
        let p = m.as_ptr() as usize;
        let pins = PinnedPages::pin(p, mem::page_size(), false).unwrap();
        assert!(pins.held(p, 2 * mem::page_size()));
    }
}
