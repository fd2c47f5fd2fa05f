//! Refused registrations under `RegistrationPolicy::Required`: the allocation fails, and no
//! memory another thread holds is touched.

use super::*;
use rdma_pool::arena::{Registration, RegistrationPolicy};
use rdma_pool::nic::soft::{MemlockLimit, SoftConfig};
use std::alloc::Layout;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

#[test]
fn a_refused_run_registration_leaves_other_threads_runs_alone() {
    // No ODP to fall back to; steps off (fewer than 4,096 regions): whole runs, one
    // registration each, refused every 300 µs while eight threads take 1 MiB blocks.
    let nic = Nic::soft_with(SoftConfig {
        odp: false,
        implicit_odp: false,
        max_mr: 4095,
        memlock: MemlockLimit::Unlimited,
        ..Default::default()
    });
    let soft = nic.as_soft().unwrap();
    let pd = nic.alloc_pd().unwrap();
    let pool = Pool::with_config(
        &pd,
        ArenaConfig {
            reserve: 1 << 34,
            chunk: 1 << 26,
            hugepages: Hugepages::Off,
            registration: Registration::Pinned,
            policy: RegistrationPolicy::Required,
            purge_delay: None,
            ..Default::default()
        },
    )
    .unwrap();
    let stop = AtomicBool::new(false);
    let (changed, failed) = (AtomicU64::new(0), AtomicU64::new(0));
    let l = Layout::from_size_align(1 << 20, 8).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Relaxed) {
                soft.fail_next(Verb::RegMr, 1, libc::ENOMEM);
                std::thread::sleep(Duration::from_micros(300));
            }
        });
        for t in 1..=8u8 {
            let (pool, stop, changed, failed) = (&pool, &stop, &changed, &failed);
            s.spawn(move || {
                let mut held = Vec::new();
                while !stop.load(Relaxed) {
                    let p = pool.alloc(l);
                    if p.is_null() {
                        failed.fetch_add(1, Relaxed);
                    } else {
                        assert!(
                            pool.keys_of(p)
                                .is_some_and(|k| k.contains(p as usize, l.size()))
                        );
                        // SAFETY: a fresh block of `l.size()` bytes.
                        unsafe { p.write_bytes(t, l.size()) };
                        held.push(p);
                    }
                    if held.len() > 16 || stop.load(Relaxed) {
                        for p in held.drain(..) {
                            // SAFETY: the block written above.
                            let b = unsafe { std::slice::from_raw_parts(p, l.size()) };
                            if b.iter().any(|&x| x != t) {
                                changed.fetch_add(1, Relaxed);
                            }
                            // SAFETY: a block of `pool`, freed once.
                            unsafe { pool.free_sized(p, l) };
                        }
                        pool.purge();
                    }
                }
            });
        }
        std::thread::sleep(Duration::from_secs(3));
        stop.store(true, Relaxed);
    });
    assert!(failed.load(Relaxed) > 0, "no registration was refused");
    assert_eq!(
        changed.load(Relaxed),
        0,
        "live blocks changed under their owners"
    );
    let c = soft.counters();
    assert_eq!(
        c.stale_pinned_releases + c.stale_pinned_accesses,
        0,
        "{c:?}"
    );
    assert_eq!(pool.live_blocks(), 0);
    assert!(pool.validate());
}
