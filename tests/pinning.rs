//! Rule: a pinned region holds the pages that were mapped when it was registered.
//!
//! After `madvise(MADV_DONTNEED)`, `munmap`, `mprotect` or a `MAP_FIXED` remap of registered
//! memory, hardware (and kernel rxe) keeps moving the *old* pages: a READ returns the old bytes,
//! a WRITE lands in a page the process made read-only. The soft NIC cannot keep the old pages
//! alive, so it detects the change and fails the access with an error completion, counted in
//! `stale_pinned_accesses` (quirk row `PinnedPagesOutliveTheMapping`). ODP regions follow the
//! current mapping on both. Each scenario runs on the soft NIC and in the rxe guest.

mod common;

use common::*;
use rdma_pool::nic::quirks::{Quirk, applies};
use rdma_pool::nic::*;

fn rxe(bed: &Bed) -> bool {
    applies(bed.a.nic.caps(), Quirk::PinnedPagesOutliveTheMapping)
}

fn stale_count(side: &Side) -> u64 {
    side.nic
        .as_soft()
        .map_or(0, |s| s.counters().stale_pinned_accesses)
}

/// Anonymous pages mapped by the test itself, so that it may drop, unmap or remap them.
struct Raw {
    ptr: *mut u8,
    len: usize,
}

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

impl Raw {
    fn new(pages: usize, fill: u8) -> Raw {
        let len = pages * page();
        // SAFETY: a fresh private anonymous mapping.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        // SAFETY: the mapping is `len` bytes, readable and writable.
        unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), fill, len) };
        Raw {
            ptr: ptr.cast(),
            len,
        }
    }

    fn page(&self, i: usize) -> *mut libc::c_void {
        self.ptr.wrapping_add(i * page()).cast()
    }

    fn reg(&self, side: &Side, access: Access) -> Mr {
        // SAFETY: the mapping outlives every region of the scenario (regions drop first).
        unsafe { side.pd.reg_mr(self.ptr, self.len, access) }.unwrap()
    }

    /// The bytes of page `i`, read by the CPU.
    fn bytes(&self, i: usize) -> &[u8] {
        // SAFETY: page `i` is mapped and readable whenever a scenario calls this.
        unsafe { std::slice::from_raw_parts(self.page(i).cast::<u8>(), page()) }
    }

    fn fill(&self, i: usize, v: u8) {
        // SAFETY: page `i` is mapped writable whenever a scenario calls this.
        unsafe { std::ptr::write_bytes(self.page(i).cast::<u8>(), v, page()) }
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: our own mapping (unmapping an already unmapped part is harmless).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// READ all of `mem` (registered as `mr` on side b) into a fresh buffer on side a.
fn read_all(bed: &Bed, mr: &Mr) -> (WcStatus, Buffer) {
    let (dst, dst_mr) = bed.a.reg_buf(mr.len(), 0, Access::LOCAL_WRITE);
    let status = read(bed, &dst_mr, mr.len(), mr.addr() as u64, mr.rkey());
    drop(dst_mr);
    (status, dst)
}

/// On the soft NIC: the remote access failed, nothing landed, the change was counted, and the
/// responder QP failed with it (remote access errors fail both ends).
fn assert_refused(bed: &Bed, status: WcStatus, dst: &Buffer) {
    assert_eq!(status, WcStatus::RemAccessErr);
    assert!(dst.as_slice().iter().all(|&x| x == 0), "nothing landed");
    assert_eq!(stale_count(&bed.b), 1);
    assert_eq!(bed.qb.state().unwrap(), QpState::Error);
}

#[test]
fn a_dropped_page_is_still_read_by_the_nic_or_the_access_fails() {
    let _g = serial();
    let bed = bed();
    let mem = Raw::new(2, 0x41);
    let mr = mem.reg(&bed.b, RW);
    // SAFETY: our own mapping; the CPU now sees zero pages there.
    assert_eq!(
        unsafe { libc::madvise(mem.page(1), page(), libc::MADV_DONTNEED) },
        0
    );
    assert!(mem.bytes(1).iter().all(|&x| x == 0));
    let (status, dst) = read_all(&bed, &mr);
    if rxe(&bed) {
        assert_eq!(status, WcStatus::Success);
        assert!(dst.as_slice().iter().all(|&x| x == 0x41), "the old bytes");
    } else {
        assert_refused(&bed, status, &dst);
    }
}

#[test]
fn a_dropped_page_the_cpu_wrote_again_is_not_what_the_nic_reads() {
    let _g = serial();
    let bed = bed();
    let mem = Raw::new(1, 0x41);
    let mr = mem.reg(&bed.b, RW);
    // SAFETY: our own mapping.
    unsafe { libc::madvise(mem.page(0), page(), libc::MADV_DONTNEED) };
    mem.fill(0, 0x42); // the CPU faults in a new page
    let (status, dst) = read_all(&bed, &mr);
    if rxe(&bed) {
        assert_eq!(status, WcStatus::Success);
        assert!(dst.as_slice().iter().all(|&x| x == 0x41), "the old bytes");
    } else if status == WcStatus::Success {
        // The documented limit of the soft NIC (soft/pin.rs): the new page looks like the old
        // one (frame numbers are not compared: the kernel migrates unpinned pages). Then the
        // current bytes move, and nothing is counted.
        assert!(dst.as_slice().iter().all(|&x| x == 0x42));
        assert_eq!(stale_count(&bed.b), 0);
    } else {
        assert_refused(&bed, status, &dst);
    }
}

#[test]
fn a_write_into_a_page_made_read_only_lands_or_fails() {
    let _g = serial();
    let bed = bed();
    let mem = Raw::new(1, 0);
    let mr = mem.reg(&bed.b, RW);
    // SAFETY: our own mapping; the CPU may only read it now.
    assert_eq!(
        unsafe { libc::mprotect(mem.page(0), page(), libc::PROT_READ) },
        0
    );
    let (_src, src_mr) = bed.a.reg_buf(page(), 0x43, Access::LOCAL_WRITE);
    let status = write(&bed, &src_mr, page(), mr.addr() as u64, mr.rkey());
    if rxe(&bed) {
        assert_eq!(status, WcStatus::Success);
        assert!(mem.bytes(0).iter().all(|&x| x == 0x43), "landed");
    } else {
        assert_eq!(status, WcStatus::RemAccessErr);
        assert!(mem.bytes(0).iter().all(|&x| x == 0), "nothing landed");
        assert_eq!(stale_count(&bed.b), 1);
    }
}

#[test]
fn an_unmapped_page_is_still_read_by_the_nic_or_the_access_fails() {
    let _g = serial();
    let bed = bed();
    let mem = Raw::new(2, 0x44);
    let mr = mem.reg(&bed.b, RW);
    // SAFETY: our own mapping.
    assert_eq!(unsafe { libc::munmap(mem.page(1), page()) }, 0);
    let (status, dst) = read_all(&bed, &mr);
    if rxe(&bed) {
        assert_eq!(status, WcStatus::Success);
        assert!(dst.as_slice().iter().all(|&x| x == 0x44), "the old bytes");
    } else {
        assert_refused(&bed, status, &dst);
    }
}

#[test]
fn a_map_fixed_remap_is_not_what_the_nic_reads() {
    let _g = serial();
    let bed = bed();
    let mem = Raw::new(1, 0x45);
    let mr = mem.reg(&bed.b, RW);
    // A shared file page mapped over the registered one, with other bytes in it.
    // SAFETY: memfd_create with a valid C string; ftruncate and mmap on the fd we own; the
    // MAP_FIXED target is our own mapping.
    unsafe {
        let fd = libc::memfd_create(c"rdma-pool-remap".as_ptr(), 0);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, page() as libc::off_t), 0);
        let p = libc::mmap(
            mem.page(0),
            page(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            0,
        );
        assert_eq!(p, mem.page(0));
        libc::close(fd);
    }
    mem.fill(0, 0x55);
    let (status, dst) = read_all(&bed, &mr);
    if rxe(&bed) {
        assert_eq!(status, WcStatus::Success);
        assert!(dst.as_slice().iter().all(|&x| x == 0x45), "the old bytes");
    } else {
        assert_refused(&bed, status, &dst);
    }
}

#[test]
fn a_dropped_local_source_page_is_still_sent_or_the_write_fails() {
    let _g = serial();
    let bed = bed();
    let src = Raw::new(1, 0x46);
    let src_mr = src.reg(&bed.a, Access::LOCAL_WRITE);
    // SAFETY: our own mapping.
    unsafe { libc::madvise(src.page(0), page(), libc::MADV_DONTNEED) };
    let (dst, dst_mr) = bed.b.reg_buf(page(), 0, RW);
    let status = write(&bed, &src_mr, page(), dst_mr.addr() as u64, dst_mr.rkey());
    if rxe(&bed) {
        assert_eq!(status, WcStatus::Success);
        assert!(dst.as_slice().iter().all(|&x| x == 0x46), "the old bytes");
    } else {
        assert_eq!(status, WcStatus::LocAccessErr);
        assert!(dst.as_slice().iter().all(|&x| x == 0), "nothing sent");
        assert_eq!(stale_count(&bed.a), 1);
        assert_eq!(bed.qa.state().unwrap(), QpState::Error);
    }
}

#[test]
fn an_odp_region_follows_the_current_mapping_on_both() {
    let _g = serial();
    let bed = bed();
    if !bed.b.nic.caps().odp.explicit {
        return;
    }
    let mem = Raw::new(1, 0x47);
    let mr = mem.reg(&bed.b, RW | Access::ON_DEMAND);
    // SAFETY: our own mapping.
    unsafe { libc::madvise(mem.page(0), page(), libc::MADV_DONTNEED) };
    mem.fill(0, 0x48);
    let (status, dst) = read_all(&bed, &mr);
    assert_eq!(status, WcStatus::Success);
    assert!(
        dst.as_slice().iter().all(|&x| x == 0x48),
        "the current bytes"
    );
    assert_eq!(stale_count(&bed.b), 0);
}

#[test]
fn untouched_pinned_memory_moves_data_normally() {
    // The detection never refuses an access whose pages did not change: a fresh mapping the
    // CPU never touched is faulted in at registration, as pinning does.
    let _g = serial();
    let bed = bed();
    let mem = Raw::new(4, 0);
    // SAFETY: our own mapping: drop every page, so none is present before registration.
    unsafe { libc::madvise(mem.page(0), 4 * page(), libc::MADV_DONTNEED) };
    let mr = mem.reg(&bed.b, RW);
    let (_src, src_mr) = bed.a.reg_buf(4 * page(), 0x49, Access::LOCAL_WRITE);
    assert_eq!(
        write(&bed, &src_mr, 4 * page(), mr.addr() as u64, mr.rkey()),
        WcStatus::Success
    );
    mem.fill(2, 0x4a); // the CPU writes the same pages the NIC holds
    let (status, dst) = read_all(&bed, &mr);
    assert_eq!(status, WcStatus::Success);
    assert!(dst.as_slice()[..2 * page()].iter().all(|&x| x == 0x49));
    assert!(
        dst.as_slice()[2 * page()..3 * page()]
            .iter()
            .all(|&x| x == 0x4a)
    );
    assert_eq!(stale_count(&bed.b), 0);
}

/// A pinned region released after the process dropped pages under it is counted even when no
/// access met them (`stale_pinned_releases`): a purge that runs before the deregistration,
/// instead of after, fails the purge tests' "nothing stale" checks this way. A region released
/// over intact pages is not counted.
#[test]
fn releasing_a_pinned_region_over_dropped_pages_is_counted() {
    let _g = serial();
    let bed = soft_bed(Default::default());
    let releases = |s: &Side| s.nic.as_soft().unwrap().counters().stale_pinned_releases;
    let intact = Raw::new(2, 1);
    intact.reg(&bed.b, RW).dereg().unwrap();
    assert_eq!(releases(&bed.b), 0);
    let mem = Raw::new(2, 1);
    let mr = mem.reg(&bed.b, RW);
    // SAFETY: our own mapping.
    assert_eq!(
        unsafe { libc::madvise(mem.page(1), page(), libc::MADV_DONTNEED) },
        0
    );
    mr.dereg().unwrap();
    assert_eq!(releases(&bed.b), 1, "dropped, then deregistered");
    // Moving a pinned region's translation away from dropped pages is a release too.
    let mem2 = Raw::new(2, 1);
    let other = Raw::new(1, 1);
    let mut mr = mem2.reg(&bed.b, RW);
    // SAFETY: our own mapping.
    assert_eq!(
        unsafe { libc::madvise(mem2.page(0), page(), libc::MADV_DONTNEED) },
        0
    );
    // SAFETY: `other` outlives the region.
    unsafe {
        mr.rereg(
            ReregFlags::CHANGE_TRANSLATION,
            None,
            other.ptr,
            other.len,
            Access::empty(),
        )
    }
    .unwrap();
    assert_eq!(releases(&bed.b), 2);
    drop(mr);
    assert_eq!(stale_count(&bed.b), 0, "no access met the pages");
}

/// The kernel migrates pages the CPU still maps (compaction, NUMA balancing): hardware pinning
/// forbids that, and the soft NIC must not mistake a migrated page for a dropped one. Where the
/// process may (root), a thread asks the kernel to compact all memory over and over while
/// WRITEs and READs go through a pinned region of small pages; every access must succeed,
/// move the right bytes, and nothing may be counted stale. Unprivileged, the kernel migrates
/// only on its own, and the accesses are checked the same way.
#[test]
fn pages_the_kernel_migrates_are_not_taken_for_dropped_ones() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let _g = serial();
    let bed = soft_bed(Default::default());
    let pages = 4096;
    let mem = Raw::new(pages, 0);
    // SAFETY: our own mapping; small pages are what compaction moves most readily.
    unsafe { libc::madvise(mem.page(0), mem.len, libc::MADV_NOHUGEPAGE) };
    let mr = mem.reg(&bed.b, RW);
    let (mut src, src_mr) = bed.a.reg_buf(16 * page(), 0, Access::LOCAL_WRITE);
    let (dst, dst_mr) = bed.a.reg_buf(16 * page(), 0, Access::LOCAL_WRITE);
    let stop = AtomicBool::new(false);
    let migrated = |f: &str| {
        std::fs::read_to_string("/proc/vmstat")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix(f)?.trim().parse::<u64>().ok())
            })
            .unwrap_or(0)
    };
    let before = migrated("pgmigrate_success ");
    let rounds = std::env::var("RDMA_POOL_MIGRATE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400usize);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                if std::fs::write("/proc/sys/vm/compact_memory", "1").is_err() {
                    break; // unprivileged: the kernel migrates on its own only
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        });
        for round in 0..rounds {
            let at = (round * 67) % (pages - 16);
            let seed = round as u8;
            for (i, b) in src.as_mut_slice().iter_mut().enumerate() {
                *b = (i as u8).wrapping_mul(7) ^ seed;
            }
            let raddr = mr.addr() as u64 + (at * page()) as u64;
            let w = write(&bed, &src_mr, 16 * page(), raddr, mr.rkey());
            let r = read(&bed, &dst_mr, 16 * page(), raddr, mr.rkey());
            if (w, r) != (WcStatus::Success, WcStatus::Success) {
                stop.store(true, Ordering::Relaxed);
                panic!(
                    "round {round}: WRITE {w:?}, READ {r:?}; {:?}",
                    bed.b.nic.as_soft().unwrap().counters()
                );
            }
            assert_eq!(dst.as_slice(), src.as_slice(), "round {round}");
        }
        stop.store(true, Ordering::Relaxed);
    });
    eprintln!(
        "pages migrated meanwhile (whole machine): {}",
        migrated("pgmigrate_success ") - before
    );
    mr.dereg().unwrap();
    let c = bed.b.nic.as_soft().unwrap().counters();
    assert_eq!((c.stale_pinned_accesses, c.stale_pinned_releases), (0, 0));
}
