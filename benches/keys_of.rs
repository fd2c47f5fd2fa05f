//! `keys_of` against the range lookups pools use today, and a NIC-ready buffer from the arena
//! against registering one. Contenders side by side in one run; read the ratios.
//!
//! - `keys_of/{arena,mutex_btreemap,rwlock_btreemap}/{1,64}_chunks`: the keys of a random
//!   address among the committed runs (one per chunk): the arena's table of atomics, against a
//!   `Mutex<BTreeMap>` range lookup (async-rdma's design) and an `RwLock<BTreeMap>` holding the
//!   same registrations.
//! - `nic_ready_4k/arena` vs `nic_ready_4k/reg_dereg`: a 4 KiB buffer the NIC can use — carved
//!   from an arena run (a bump through a registered run, as the allocator will) plus its SGE by
//!   `sge_of`, against `reg_mr` + `dereg` of a fresh 4 KiB buffer.
//!
//! `RDMA_POOL_BENCH_NIC=<device>` runs on a verbs device (e.g. `rxe0` in the QEMU guest);
//! the default is the soft NIC.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rdma_pool::arena::{Arena, ArenaConfig, Hugepages, Keys, SLAB};
use rdma_pool::nic::soft::{MemlockLimit, SoftConfig};
use rdma_pool::nic::*;
use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::{Mutex, RwLock};
use std::time::Duration;

fn nic() -> Nic {
    match std::env::var("RDMA_POOL_BENCH_NIC") {
        Ok(name) => Nic::open(&name).expect("open the bench device"),
        Err(_) => Nic::soft_with(SoftConfig {
            memlock: MemlockLimit::Unlimited,
            ..Default::default()
        }),
    }
}

/// An arena with one single-slab run in each of `chunks` chunks, every run's keys handed out.
fn arena_with(pd: &Pd, chunks: usize) -> (Arena, Vec<(usize, Keys)>) {
    let arena = Arena::new(
        pd,
        ArenaConfig {
            reserve: 1 << 30,
            chunk: SLAB,
            hugepages: Hugepages::Off,
            ..Default::default()
        },
    )
    .unwrap();
    let regs = (0..chunks)
        .map(|_| {
            let run = arena.alloc_run(SLAB, 64).unwrap();
            (run.as_ptr() as usize, arena.keys_of(run.as_ptr()).unwrap())
        })
        .collect();
    (arena, regs)
}

/// Lookups per timed iteration.
const BATCH: usize = 64;

fn lookup(map: &BTreeMap<usize, Keys>, addr: usize) -> Option<Keys> {
    let (_, k) = map.range(..=addr).next_back()?;
    k.contains(addr, 1).then_some(*k)
}

/// What a caller does with the keys: build an SGE (lkey, bounds).
#[inline(always)]
fn use_keys(k: Option<Keys>) -> usize {
    k.map_or(0, |k| k.lkey.0 as usize ^ k.addr ^ k.len)
}

/// Pseudo-random addresses inside the runs (xorshift, fixed seed).
fn addresses(regs: &[(usize, Keys)]) -> Vec<usize> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (start, _) = regs[(x as usize) % regs.len()];
            start + (x as usize >> 20) % SLAB
        })
        .collect()
}

fn keys_of(c: &mut Criterion) {
    let nic = nic();
    let pd = nic.alloc_pd().unwrap();
    let mut g = c.benchmark_group("keys_of");
    for chunks in [1usize, 64] {
        let (arena, regs) = arena_with(&pd, chunks);
        // A second rail (always a soft NIC: the lookup's cost does not depend on the device).
        let rail = Nic::soft_with(SoftConfig {
            memlock: MemlockLimit::Unlimited,
            ..Default::default()
        });
        arena.attach(&rail.alloc_pd().unwrap()).unwrap();
        for &(a, _) in &regs {
            arena.keys_of_on(a as *const u8, &rail).unwrap();
        }
        let addrs = addresses(&regs);
        let map: BTreeMap<usize, Keys> = regs.iter().map(|&(a, k)| (a, k)).collect();
        let mutex = Mutex::new(map.clone());
        let rwlock = RwLock::new(map);
        let id = |name| BenchmarkId::new(name, format!("{chunks}_chunks"));
        // Each iteration looks up a batch of 64 addresses and folds the keys into a checksum,
        // as a caller building SGEs would (the harness costs ~1 ns per iteration, and a
        // `black_box` per result would measure stores); the report is per lookup.
        g.throughput(Throughput::Elements(BATCH as u64));
        let at = std::cell::Cell::new(0usize);
        let batch = || {
            at.set((at.get() + BATCH) % addrs.len());
            &addrs[at.get()..at.get() + BATCH]
        };
        g.bench_function(id("arena"), |b| {
            b.iter(|| {
                let mut acc = 0usize;
                for &a in batch() {
                    acc ^= use_keys(arena.keys_of(a as *const u8));
                }
                black_box(acc)
            })
        });
        g.bench_function(id("arena_keys_of_on_rail"), |b| {
            b.iter(|| {
                let mut acc = 0usize;
                for &a in batch() {
                    acc ^= use_keys(arena.keys_of_on(a as *const u8, &rail));
                }
                black_box(acc)
            })
        });
        g.bench_function(id("mutex_btreemap"), |b| {
            b.iter(|| {
                let mut acc = 0usize;
                for &a in batch() {
                    acc ^= use_keys(lookup(&mutex.lock().unwrap(), a));
                }
                black_box(acc)
            })
        });
        g.bench_function(id("rwlock_btreemap"), |b| {
            b.iter(|| {
                let mut acc = 0usize;
                for &a in batch() {
                    acc ^= use_keys(lookup(&rwlock.read().unwrap(), a));
                }
                black_box(acc)
            })
        });
    }
    g.finish();
}

fn nic_ready_4k(c: &mut Criterion) {
    let nic = nic();
    let pd = nic.alloc_pd().unwrap();
    let (arena, _) = arena_with(&pd, 0);
    let run = arena.alloc_run(SLAB, SLAB).unwrap();
    let mut g = c.benchmark_group("nic_ready_4k");
    let mut off = 0usize;
    g.bench_function("arena", |b| {
        b.iter(|| {
            off = (off + 4096) % run.len();
            // SAFETY: a 4 KiB slice of the run, which lives as long as the arena.
            let buf = unsafe { std::slice::from_raw_parts(run.as_ptr().add(off), 4096) };
            black_box(arena.sge_of(black_box(buf)).unwrap())
        })
    });
    let mut buf = Buffer::new(4096).unwrap();
    g.bench_function("reg_dereg", |b| {
        b.iter(|| {
            // SAFETY: `buf` outlives the region.
            let mr = unsafe { pd.reg_mr(buf.as_mut_ptr(), 4096, Access::LOCAL_WRITE) }.unwrap();
            black_box(mr.sge(0, 4096).unwrap());
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = keys_of, nic_ready_4k
}
criterion_main!(benches);
