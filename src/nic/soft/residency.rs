//! The soft NIC's ODP residency of a region ([`Residency`]): which pages the NIC has faulted
//! in, for reading and for writing — two bitmaps for an explicit ODP region, a sparse map for
//! an implicit one (the whole address space).
//!
//! Contract: a page present for writing is present for reading; pages are removed (on an
//! invalidation or `advise_mr` with `FLUSH`) by range.

use super::mem;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Per-page ODP residency of a region: a page is present for reading, and maybe for writing.
pub(super) enum Residency {
    /// Explicit ODP: one bit per page of the region, in two bitmaps.
    Explicit {
        first_page: usize,
        read: Box<[AtomicU64]>,
        write: Box<[AtomicU64]>,
    },
    /// Implicit ODP: the whole address space, so a sparse set (page → writable).
    Implicit(Mutex<std::collections::HashMap<usize, bool>>),
}

impl Residency {
    pub(super) fn new(addr: usize, len: usize) -> Residency {
        if len == usize::MAX {
            return Residency::Implicit(Mutex::new(Default::default()));
        }
        let ps = mem::page_size();
        let first = addr / ps;
        let last = (addr + len).div_ceil(ps);
        let words = (last - first).div_ceil(64);
        let bitmap = || (0..words).map(|_| AtomicU64::new(0)).collect::<Box<[_]>>();
        Residency::Explicit {
            first_page: first,
            read: bitmap(),
            write: bitmap(),
        }
    }

    /// Is `page` (a page number) present with the needed right?
    pub(super) fn present(&self, page: usize, write: bool) -> bool {
        match self {
            Residency::Explicit {
                first_page,
                read,
                write: w,
            } => {
                let Some((word, bit)) = bit_of(page, *first_page, read.len()) else {
                    return false;
                };
                let map = if write { w } else { read };
                map[word].load(Ordering::Acquire) & bit != 0
            }
            Residency::Implicit(set) => {
                let set = set.lock().unwrap_or_else(|e| e.into_inner());
                set.get(&page).is_some_and(|&w| w || !write)
            }
        }
    }

    /// Make `page` present (readable; writable too when `write`). Returns true if it was not.
    pub(super) fn insert(&self, page: usize, write: bool) -> bool {
        match self {
            Residency::Explicit {
                first_page,
                read,
                write: w,
            } => {
                // A page outside the region is never made resident.
                let Some((word, bit)) = bit_of(page, *first_page, read.len()) else {
                    return false;
                };
                let was = read[word].fetch_or(bit, Ordering::AcqRel) & bit != 0;
                let was_w = !write || w[word].fetch_or(bit, Ordering::AcqRel) & bit != 0;
                !(was && was_w)
            }
            Residency::Implicit(set) => {
                let mut set = set.lock().unwrap_or_else(|e| e.into_inner());
                match set.get_mut(&page) {
                    None => {
                        set.insert(page, write);
                        true
                    }
                    Some(w) => {
                        let upgraded = write && !*w;
                        *w |= write;
                        upgraded
                    }
                }
            }
        }
    }

    /// [`Residency::remove_range`] that never waits: an implicit region's set whose lock is
    /// held (by this very thread, say, growing it inside the allocator) is left as it is.
    pub(super) fn try_remove_range(&self, first: usize, last: usize) {
        match self {
            Residency::Implicit(set) => {
                if let Ok(mut set) = set.try_lock() {
                    set.retain(|&p, _| p < first || p > last);
                }
            }
            explicit => explicit.remove_range(first, last),
        }
    }

    /// Drop pages `first..=last` from the device's translation (an MMU-notifier
    /// invalidation). Pages outside the region are ignored.
    pub(super) fn remove_range(&self, first: usize, last: usize) {
        match self {
            Residency::Explicit {
                first_page,
                read,
                write,
            } => {
                let pages = read.len() * 64;
                let lo = first.saturating_sub(*first_page);
                let hi = last
                    .saturating_sub(*first_page)
                    .min(pages.saturating_sub(1));
                if last < *first_page || lo >= pages {
                    return;
                }
                for i in lo..=hi {
                    read[i / 64].fetch_and(!(1 << (i % 64)), Ordering::AcqRel);
                    write[i / 64].fetch_and(!(1 << (i % 64)), Ordering::AcqRel);
                }
            }
            Residency::Implicit(set) => {
                set.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .retain(|&p, _| p < first || p > last);
            }
        }
    }

    /// Number of pages present.
    pub(super) fn count(&self) -> usize {
        match self {
            Residency::Explicit { read, .. } => read
                .iter()
                .map(|w| w.load(Ordering::Acquire).count_ones() as usize)
                .sum(),
            Residency::Implicit(set) => set.lock().unwrap_or_else(|e| e.into_inner()).len(),
        }
    }
}

/// The bitmap word and bit of `page` in a region whose first page is `first` and whose bitmap
/// has `words` words; `None` outside the region.
fn bit_of(page: usize, first: usize, words: usize) -> Option<(usize, u64)> {
    let i = page.checked_sub(first).filter(|i| i / 64 < words)?;
    Some((i / 64, 1 << (i % 64)))
}
