//! What reusing purged memory costs, in one run (read the ratios): free an 8 MiB block and
//! allocate it again, touching every page,
//!
//! - `reuse_8m/kept`: the freed run stays committed and registered (no purge);
//! - `reuse_8m/purged_pinned`: purged in between — deregistered, dropped — then committed and
//!   registered again on reuse;
//! - `reuse_8m/purged_odp`: purged in between on an ODP pool — dropped only, the region kept —
//!   then committed again on reuse.
//!
//! Soft NIC without a memlock limit, 4 KiB pages (so that page faults count as they would
//! for a service without hugepages).

use criterion::{Criterion, criterion_group, criterion_main};
use rdma_pool::Pool;
use rdma_pool::arena::{ArenaConfig, Hugepages, Registration};
use rdma_pool::nic::Nic;
use rdma_pool::nic::soft::{MemlockLimit, SoftConfig};
use std::alloc::Layout;
use std::hint::black_box;

fn pool(registration: Registration) -> Pool {
    let nic = Nic::soft_with(SoftConfig {
        memlock: MemlockLimit::Unlimited,
        ..Default::default()
    });
    Pool::with_config(
        &nic.alloc_pd().expect("a PD"),
        ArenaConfig {
            reserve: 1 << 32,
            chunk: 1 << 28,
            hugepages: Hugepages::Off,
            registration,
            purge_delay: None,
            ..Default::default()
        },
    )
    .expect("a pool")
}

/// Free the block at `p` and allocate it again (purging in between when `purge`), touching
/// every page; the new block.
fn cycle(pool: &Pool, p: *mut u8, layout: Layout, purge: bool) -> *mut u8 {
    // SAFETY: `p` is the live block of `layout` from `pool`.
    unsafe { pool.free_sized(p, layout) };
    if purge {
        black_box(pool.purge());
    }
    let q = pool.alloc(layout);
    assert!(!q.is_null());
    for off in (0..layout.size()).step_by(4096) {
        // SAFETY: inside the fresh block.
        unsafe { q.add(off).write_volatile(1) };
    }
    q
}

fn reuse(c: &mut Criterion) {
    let layout = Layout::from_size_align(8 << 20, 4096).expect("a layout");
    let mut g = c.benchmark_group("reuse_8m");
    for (name, registration, purge) in [
        ("kept", Registration::Pinned, false),
        ("purged_pinned", Registration::Pinned, true),
        ("purged_odp", Registration::Odp, true),
    ] {
        let pool = pool(registration);
        let mut p = pool.alloc(layout);
        g.bench_function(name, |b| b.iter(|| p = cycle(&pool, p, layout, purge)));
        if purge {
            assert!(pool.stats().alloc.arena.purged_bytes > 0);
        }
        // SAFETY: the live block, freed once.
        unsafe { pool.free_sized(p, layout) };
    }
    g.finish();
}

criterion_group!(benches, reuse);
criterion_main!(benches);
