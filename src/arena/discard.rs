//! Giving back pages of memory the arena keeps handed out: a reused run zeroed by dropping
//! its pages, and free pages inside a slab still in use.
//!
//! Contract: only where nothing pins the pages — an ODP arena without rails — and only where
//! dropping does not split a huge page or empty the hugetlb pool (slabs of 4 KiB pages, or
//! THP for whole runs). The pages read as zero at their next touch, by the CPU or, faulted
//! in, by the NIC (the soft NIC is told through `os::madvise`). The slabs stay `LIVE` and
//! registered: keys keep their meaning. A rail attached meanwhile waits for the drop to
//! finish before it pins anything (`Rails::without_rails`).

use super::commit::PageKind;
use super::purge::LIVE;
use super::{Arena, RegMode, SLAB};
use crate::sys::os;
use std::sync::atomic::Ordering;

impl Arena {
    /// Zero `[addr, addr + len)` of a run being handed out again (`calloc` of a reused block)
    /// by dropping its pages (`MADV_DONTNEED`: the kernel gives zero pages at the next touch)
    /// instead of writing them: a reused block of gigabytes then costs no memory until used.
    /// Only where nothing pins the pages and no page is hugetlb (whose first touch could then
    /// find the hugetlb pool empty): an ODP arena without rails. False (nothing done) elsewhere
    /// or for a short range: the caller writes the zeros.
    pub(crate) fn zero_by_discard(&self, addr: usize, len: usize) -> bool {
        const MIN: usize = 1 << 20;
        if len < MIN || !self.discards_free() {
            return false;
        }
        let first = self.slab_index(addr);
        let slabs = len.div_ceil(SLAB);
        let plain = (first..first + slabs).all(|i| {
            self.slabs.get(i).is_some_and(|s| {
                let k = s.kind.load(Ordering::Relaxed);
                k == PageKind::Thp.code() || k == PageKind::Small.code()
            })
        });
        if !plain {
            return false;
        }
        // SAFETY: no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let whole = len & !(page - 1);
        // SAFETY: the run's pages, about to be handed out and used by nobody: the caller
        // zeroes them; an ODP region follows (the soft NIC is told by `os::madvise`), and no
        // rail pins them meanwhile (`without_rails`).
        let dropped = self.rails.without_rails(|| unsafe {
            os::madvise(addr as *mut u8, whole, libc::MADV_DONTNEED).is_ok()
        });
        if !dropped {
            return false;
        }
        // SAFETY: the tail past the whole pages, ours likewise.
        unsafe { std::ptr::write_bytes((addr + whole) as *mut u8, 0, len - whole) };
        true
    }

    /// Give the 4 KiB pages of `[addr, addr + len)` — free memory inside a live slab, which
    /// the caller holds and nobody uses — back to the system (`MADV_DONTNEED`): they read as
    /// zero at the next touch, by the CPU or (faulted in) by the NIC. Only in an ODP arena
    /// without rails (no region pins them) and on slabs of 4 KiB pages (dropping part of a
    /// huge page would split it). True when done; false changes nothing.
    pub(crate) fn discard_free(&self, addr: usize, len: usize) -> bool {
        if len == 0 || addr % 4096 != 0 || len % 4096 != 0 || !self.discards_free() {
            return false;
        }
        let first = self.slab_index(addr);
        let last = self.slab_index(addr + len - 1);
        if !(first..=last).all(|i| self.slab_discardable(i)) {
            return false;
        }
        // SAFETY: the caller's free pages of live ODP slabs; the soft NIC is told
        // (`os::madvise`), a hardware ODP region follows the mapping, and no rail pins them
        // meanwhile (`without_rails`).
        self.rails.without_rails(|| unsafe {
            os::madvise(addr as *mut u8, len, libc::MADV_DONTNEED).is_ok()
        })
    }

    /// Whether [`Arena::discard_free`] may give pages back here at all: an ODP arena without
    /// rails, on a kernel of 4 KiB pages (a larger OS page would take neighbours along).
    pub(crate) fn discards_free(&self) -> bool {
        // SAFETY: no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        self.mode == RegMode::Odp && !self.rails.any() && page == 4096
    }

    /// Whether the slab holding `addr` is one whose free pages [`Arena::discard_free`] gives
    /// back (live, on 4 KiB pages), in an arena where it may.
    pub(crate) fn may_discard_in(&self, addr: usize) -> bool {
        addr.checked_sub(self.base())
            .is_some_and(|o| self.slab_discardable(o >> super::SLAB_SHIFT))
    }

    fn slab_discardable(&self, i: usize) -> bool {
        self.slabs.get(i).is_some_and(|s| {
            s.kind.load(Ordering::Relaxed) == PageKind::Small.code()
                && s.state.load(Ordering::Relaxed) == LIVE
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::arena::{Arena, ArenaConfig, Error, Hugepages};
    use crate::nic::Nic;
    use std::sync::Barrier;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    fn arena() -> (Arena, Nic) {
        let cfg = ArenaConfig {
            reserve: 1 << 30,
            chunk: 1 << 26,
            hugepages: Hugepages::Off,
            ..Default::default()
        };
        let arena = Arena::new(&Nic::soft().alloc_pd().unwrap(), cfg).unwrap();
        (arena, Nic::soft())
    }

    #[test]
    fn an_attach_waits_for_pages_being_given_back_and_stops_the_next() {
        let (arena, other) = arena();
        let pd = other.alloc_pd().unwrap();
        let (inside, dropped) = (Barrier::new(2), AtomicBool::new(false));
        std::thread::scope(|s| {
            s.spawn(|| {
                assert!(arena.rails.without_rails(|| {
                    inside.wait();
                    std::thread::sleep(Duration::from_millis(200));
                    dropped.store(true, Ordering::SeqCst);
                    true
                }));
            });
            inside.wait();
            arena.attach(&pd).unwrap();
            assert!(
                dropped.load(Ordering::SeqCst),
                "the attach waited for the drop"
            );
        });
        assert!(
            !arena
                .rails
                .without_rails(|| unreachable!("a rail is attached"))
        );
        arena.detach(&pd).unwrap();
        assert!(
            arena.rails.without_rails(|| true),
            "no rail: pages go back again"
        );
    }

    #[test]
    fn an_attach_that_waits_too_long_attaches_nothing() {
        let (arena, other) = arena();
        let pd = other.alloc_pd().unwrap();
        let inside = Barrier::new(2);
        std::thread::scope(|s| {
            s.spawn(|| {
                arena.rails.without_rails(|| {
                    inside.wait();
                    std::thread::sleep(Duration::from_millis(2500));
                    true
                })
            });
            inside.wait();
            assert!(matches!(arena.attach(&pd), Err(Error::Busy(_))));
            assert!(arena.rail_stats().is_empty(), "nothing attached");
        });
        assert!(arena.rails.without_rails(|| true));
        assert_eq!(arena.attach(&pd).unwrap(), 0, "the slot is free again");
        assert!(arena.rails_valid());
    }
}
