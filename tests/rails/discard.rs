//! Pages an ODP arena gives back are never under a pinned rail: a rail attached while a purge
//! drops free pages waits for the drop to finish before it pins anything. On soft NICs the
//! rail's device (without ODP) counts every access, and every release of a pinned region, that
//! met a page dropped under it.

use super::*;
use rdma_pool::arena::Registration;
use std::sync::atomic::{AtomicBool, Ordering};

/// Attach and detach cycles raced against purges that give pages back (a quarter in the rxe
/// guest: `common::scaled`).
fn rounds() -> usize {
    common::scaled(60).max(8)
}

/// 64-byte blocks a heap's four 4 KiB first pages of the class hold.
const FIRST: usize = 4 * 64;
#[test]
fn a_rail_attached_while_free_pages_go_back_never_pins_a_dropped_page() {
    let _s = serial();
    let cfg = ArenaConfig {
        registration: Registration::Auto,
        ..config()
    };
    let (n0, n1) = if on_verbs() {
        nics()
    } else {
        (Nic::soft(), Nic::soft_with(degrade::no_odp()))
    };
    let t = TwoRails::on(n0, n1, cfg, false);
    let pool = &t.pool;
    let odp = pool.stats().alloc.arena.mode == RegMode::Odp;
    let l = Layout::from_size_align(64, 8).unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| {
        let stop = &stop;
        // Four 64 KiB pages of 64-byte blocks written, all freed but one block, then a purge
        // that gives the three empty pages back (ODP, no rail attached): again and again.
        sc.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let blocks: Vec<*mut u8> = (0..FIRST + 4 * 1024).map(|_| pool.alloc(l)).collect();
                for &p in &blocks {
                    assert!(!p.is_null());
                    // SAFETY: a fresh block of 64 bytes.
                    unsafe { p.write_bytes(0x5a, 64) };
                }
                let keep = blocks[FIRST + 5];
                for &p in blocks.iter().filter(|&&p| p != keep) {
                    // SAFETY: a block of `pool`, freed once.
                    unsafe { pool.free_sized(p, l) };
                }
                pool.purge();
                // SAFETY: the block kept above, 64 bytes.
                let kept = unsafe { std::slice::from_raw_parts(keep, 64) };
                assert!(kept.iter().all(|&b| b == 0x5a), "the live block is intact");
                // SAFETY: as above.
                unsafe { pool.free_sized(keep, l) };
            }
        });
        for _ in 0..rounds() {
            pool.attach(&t.s1.pd).unwrap();
            std::thread::yield_now();
            pool.detach(&t.s1.pd).unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    if odp && !cfg!(feature = "memcheck") {
        assert!(
            pool.stats().alloc.discarded_bytes > 0,
            "pages were given back meanwhile"
        );
    }
    if let Some(soft) = t.s1.nic.as_soft() {
        let c = soft.counters();
        assert_eq!(
            (c.stale_pinned_accesses, c.stale_pinned_releases),
            (0, 0),
            "no pinned region of the rail held a page dropped under it"
        );
    }
    // The rail works on what is there now.
    pool.attach(&t.s1.pd).unwrap();
    let mut b = allocator_api2::vec![in pool; 0u8; 70_000];
    t.round_trip(1, &mut b, 3);
    assert!(pool.validate());
}
