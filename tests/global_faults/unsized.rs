//! Size-less frees, sizes and `realloc` (what C's `free`, `malloc_usable_size` and `realloc`
//! need; the C library in `capi/` is built on them) for every kind of block a `GlobalPool`
//! with the `Mmap` fallback hands out: the pool's, the bootstrap region's, degraded mappings;
//! and pointers it never handed out, which are left alone and counted.

use rdma_pool::GlobalPool;
use rdma_pool::arena::Hugepages;
use rdma_pool::global::{Fallback, GlobalConfig, GlobalState};
use rdma_pool::nic::{self, Nic};
use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicPtr, Ordering::Relaxed};

fn soft() -> nic::Result<Nic> {
    Ok(Nic::soft())
}

fn no_device() -> nic::Result<Nic> {
    Err(nic::Error::NoDevice)
}

static STASH: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());

/// A NIC opener that allocates through the pool it opens for (a bootstrap block, kept in
/// `STASH`), as libibverbs does under the C library.
fn allocating_opener() -> nic::Result<Nic> {
    // SAFETY: a non-zero-size layout; the block is freed by the test.
    let p = unsafe { GlobalAlloc::alloc(&B, Layout::from_size_align(300, 8).unwrap()) };
    STASH.store(p, Relaxed);
    Ok(Nic::soft())
}

const MMAP: GlobalConfig = GlobalConfig {
    arena: rdma_pool::arena::ArenaConfig {
        reserve: 1 << 30,
        chunk: 1 << 24,
        hugepages: Hugepages::Off,
        ..GlobalConfig::DEFAULT.arena
    },
    fallback: Fallback::Mmap,
    open: Some(soft),
    ..GlobalConfig::DEFAULT
};

/// Fill `n` bytes at `p` with `v`, and check them.
///
/// # Safety
/// `p` is valid for `n` bytes.
unsafe fn fill(p: *mut u8, n: usize, v: u8) {
    // SAFETY: the caller's contract.
    unsafe {
        std::ptr::write_bytes(p, v, n);
        assert!(std::slice::from_raw_parts(p, n).iter().all(|&b| b == v));
    }
}

/// Initialised by `allocating_opener`.
static B: GlobalPool = GlobalPool::with_config(GlobalConfig {
    open: Some(allocating_opener),
    ..MMAP
});

#[test]
fn pool_and_bootstrap_blocks_free_resize_and_measure_without_their_layout() {
    static P: GlobalPool = GlobalPool::with_config(MMAP);
    P.init().unwrap();
    // SAFETY: non-zero-size layouts; every block is freed once; strangers are only passed to
    // the size-less calls, which leave them alone.
    unsafe {
        for size in [1usize, 16, 100, 4096, 70_000, 1 << 20, 3 << 20] {
            let p = P.alloc(Layout::from_size_align(size, 8).unwrap());
            assert!(P.keys_of(p).is_some());
            let usable = P.usable_size(p).unwrap();
            assert!(usable >= size);
            fill(p, usable, 0x11);
            let q = P.realloc_unsized(p, size * 2 + 5);
            assert!(!q.is_null() && q as usize % 16 == 0);
            assert!(
                std::slice::from_raw_parts(q, size)
                    .iter()
                    .all(|&b| b == 0x11)
            );
            assert!(P.usable_size(q).unwrap() >= size * 2 + 5);
            let r = P.realloc_unsized(q, size / 3 + 1);
            assert!(
                std::slice::from_raw_parts(r, size / 3 + 1)
                    .iter()
                    .all(|&b| b == 0x11)
            );
            P.free_unsized(r);
        }
        assert_eq!(
            P.pool().unwrap().live_blocks(),
            0,
            "every pool block came back"
        );

        // Bootstrap blocks: what is allocated while the pool calls into the NIC — here, by
        // the NIC opener of `B` while `B` initialises.
        B.init().unwrap();
        let b = STASH.load(Relaxed);
        assert!(B.keys_of(b).is_none(), "a bootstrap block");
        assert_eq!(b as usize % 16, 0, "C's alignment even for align 8");
        assert_eq!(B.usable_size(b), Some(300));
        fill(b, 300, 0x22);
        // This thread's first block of `B`'s class, outside the count below: registering its
        // page puts the NIC layer's records in the (process-wide) bootstrap region too.
        B.free_unsized(B.alloc(std::alloc::Layout::from_size_align(600, 8).unwrap()));
        let live = B.stats().bootstrap_live_bytes;
        // Moved into the pool by a realloc outside the mark, its bytes kept.
        let m = B.realloc_unsized(b, 600);
        assert!(B.keys_of(m).is_some());
        assert!(
            std::slice::from_raw_parts(m, 300)
                .iter()
                .all(|&b| b == 0x22)
        );
        assert_eq!(
            B.stats().bootstrap_live_bytes,
            live - 300,
            "the header's size was freed"
        );
        B.free_unsized(m);
        assert!(B.validate());

        // Pointers into a pool block that are not its first byte: ignored, counted, and the
        // block stays whole (not handed out twice).
        let foreign = P.stats().foreign_frees;
        for size in [64usize, 100, 4096, 300_000, 3 << 20] {
            let p = P.alloc(Layout::from_size_align(size, 8).unwrap());
            fill(p, size, 0x44);
            for off in [1usize, 8, 16, size / 2] {
                assert_eq!(P.usable_size(p.add(off)), None, "{size} + {off}");
                assert!(
                    P.realloc_unsized(p.add(off), 10).is_null(),
                    "{size} + {off}"
                );
                P.free_unsized(p.add(off));
                let q = P.alloc(Layout::from_size_align(size, 8).unwrap());
                assert_ne!(q, p.add(off), "{size}: an inner pointer was handed out");
                P.free_unsized(q);
            }
            assert!(
                std::slice::from_raw_parts(p, size)
                    .iter()
                    .all(|&b| b == 0x44)
            );
            P.free_unsized(p);
        }
        // Each of the 20 inner pointers: refused by realloc and by free, both counted.
        assert_eq!(P.stats().foreign_frees, foreign + 40);

        // Strangers: null, the stack, a system block.
        let foreign = P.stats().foreign_frees;
        let on_stack = 5u64;
        let sys = std::alloc::System.alloc(Layout::new::<u64>());
        P.free_unsized(std::ptr::null_mut());
        P.free_unsized(&on_stack as *const u64 as *mut u8);
        P.free_unsized(sys);
        assert_eq!(P.stats().foreign_frees, foreign + 2);
        assert_eq!(P.usable_size(sys), None);
        assert!(
            P.realloc_unsized(sys, 100).is_null(),
            "a stranger is not resized"
        );
        std::alloc::System.dealloc(sys, Layout::new::<u64>());
        assert_eq!(on_stack, 5);
    }
    assert!(P.validate());
}

#[test]
fn degraded_mappings_free_and_resize_without_their_layout() {
    static D: GlobalPool = GlobalPool::with_config(GlobalConfig {
        open: Some(no_device),
        ..MMAP
    });
    // SAFETY: non-zero-size layouts; every block is freed once.
    unsafe {
        let p = D.alloc(Layout::from_size_align(1000, 8).unwrap());
        assert_eq!(D.state(), GlobalState::Failed);
        assert!(!p.is_null() && D.keys_of(p).is_none());
        let usable = D.usable_size(p).unwrap();
        assert!(
            usable >= 1000 && usable % 4096 == 0,
            "whole pages: {usable}"
        );
        fill(p, usable, 0x33);
        let q = D.realloc_unsized(p, 50_000);
        assert!(!q.is_null());
        assert!(
            std::slice::from_raw_parts(q, usable)
                .iter()
                .all(|&b| b == 0x33)
        );
        assert!(D.usable_size(q).unwrap() >= 50_000);
        D.free_unsized(q);
        assert_eq!(
            D.usable_size(q),
            None,
            "unmapped, and gone from the registry"
        );
        assert_eq!(D.stats().foreign_frees, 0);
        assert_eq!(D.stats().degraded_allocations, 2);
    }
}

/// Resident pages of `[p, p + len)` (`mincore`).
fn resident_pages(p: *mut u8, len: usize) -> usize {
    let pages = len.div_ceil(4096);
    let mut v = vec![0u8; pages];
    // SAFETY: a mapped range (the caller's block) and a vector of one byte per page.
    let rc = unsafe { libc::mincore(p.cast(), len, v.as_mut_ptr()) };
    assert_eq!(rc, 0);
    v.iter().filter(|&&b| b & 1 != 0).count()
}

#[test]
fn a_large_zeroed_block_reusing_a_dirty_run_costs_no_memory_until_touched() {
    static Z: GlobalPool = GlobalPool::with_config(MMAP);
    Z.init().unwrap();
    let len = 64 << 20;
    let layout = Layout::from_size_align(len, 8).unwrap();
    // SAFETY: non-zero-size layouts; every block is freed once with its layout.
    unsafe {
        let p = Z.alloc(layout);
        std::ptr::write_bytes(p, 0xAB, len);
        assert_eq!(resident_pages(p, len), len / 4096);
        Z.dealloc(p, layout);
        let q = Z.alloc_zeroed(layout);
        assert_eq!(q, p, "the freed run is reused");
        // Its pages were dropped (MADV_DONTNEED on an ODP arena of 4 KiB pages), not written.
        assert!(
            resident_pages(q, len) < 16,
            "{} pages resident",
            resident_pages(q, len)
        );
        assert!(std::slice::from_raw_parts(q, len).iter().all(|&b| b == 0));
        Z.dealloc(q, layout);
    }
}
