//! The allocator core against mimalloc, jemalloc and the system allocator, all through the
//! same `GlobalAlloc`-shaped adapter, in one run; read the ratios.
//!
//! - `pair_64b/*`: one 64-byte alloc + free;
//! - `churn_16b_4k/*`: free a random one of 4096 live slots and allocate 16 B–4 KiB in it;
//! - `cross_thread_256b/*`: a producer allocates 256-byte blocks, a consumer thread frees them
//!   (per block, batches of 1024 handed over through a channel);
//! - `vec_growth_1m/*`: an allocator-api2 `Vec<u8>` grown to 1 MiB by 4 KiB appends;
//! - `larson_1t/*`, `larson_2t/*`: Larson's server shape (mimalloc-bench `larson`, abench) with
//!   1 and 2 threads: each thread owns 5000 blocks of 8–999 bytes (the first generation made
//!   by the main thread), frees a random one and allocates a new one in its place, touching two
//!   bytes; every sample hands the blocks to fresh threads, so each generation frees what the
//!   previous one allocated. Throughput in replacements.
//!
//! Contenders: `rdma_pool` (a `Pool` called directly), `global_pool` (the `GlobalPool` that is
//! this binary's `#[global_allocator]`, through `GlobalAlloc`), mimalloc, jemalloc and the system
//! allocator. The pools run on the soft NIC, every byte they hand out registered. The harness's
//! own allocations go through the global pool for every contender alike.

use allocator_api2::alloc::{AllocError, Allocator};
use allocator_api2::vec::Vec as AVec;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rdma_pool::GlobalPool;
use rdma_pool::Pool;
use rdma_pool::global::GlobalConfig;
use rdma_pool::nic::Nic;
use rdma_pool::nic::soft::{MemlockLimit, SoftConfig};
use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

/// The global allocator of this bench binary, on a soft NIC without a memlock limit.
#[global_allocator]
static GLOBAL: GlobalPool = GlobalPool::with_config(GlobalConfig {
    open: Some(unlimited_soft),
    ..GlobalConfig::DEFAULT
});

fn unlimited_soft() -> rdma_pool::nic::Result<Nic> {
    Ok(Nic::soft_with(SoftConfig {
        memlock: MemlockLimit::Unlimited,
        ..Default::default()
    }))
}

/// The global pool behind the adapter: the very `GlobalAlloc` calls `Box` and `Vec` make.
struct ViaGlobal;

impl Contender for ViaGlobal {
    #[inline]
    fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: non-zero layouts only.
        unsafe { GlobalAlloc::alloc(&GLOBAL, l) }
    }
    #[inline]
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded.
        unsafe { GlobalAlloc::dealloc(&GLOBAL, p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe { GlobalAlloc::realloc(&GLOBAL, p, l, n) }
    }
}

/// What every contender offers: `GlobalAlloc`'s three calls.
trait Contender: Sync {
    fn alloc(&self, l: Layout) -> *mut u8;
    /// # Safety
    /// `p` came from `alloc` with `l`.
    unsafe fn dealloc(&self, p: *mut u8, l: Layout);
    /// # Safety
    /// As `GlobalAlloc::realloc`.
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8;
}

impl<T: GlobalAlloc + Sync> Contender for T {
    #[inline]
    fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: non-zero layouts only.
        unsafe { GlobalAlloc::alloc(self, l) }
    }
    #[inline]
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded.
        unsafe { GlobalAlloc::dealloc(self, p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe { GlobalAlloc::realloc(self, p, l, n) }
    }
}

/// The pool behind the same adapter.
struct PoolAdapter(Pool);

impl Contender for PoolAdapter {
    #[inline]
    fn alloc(&self, l: Layout) -> *mut u8 {
        self.0.alloc(l)
    }
    #[inline]
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded.
        unsafe { self.0.free_sized(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe { self.0.realloc(p, l, n) }
    }
}

/// allocator-api2 over any contender (for the `Vec` workload).
struct Api<'a>(&'a dyn Contender);

// SAFETY: forwards to a GlobalAlloc-shaped allocator.
unsafe impl Allocator for Api<'_> {
    fn allocate(&self, l: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let p = NonNull::new(self.0.alloc(l)).ok_or(AllocError)?;
        Ok(NonNull::slice_from_raw_parts(p, l.size()))
    }
    unsafe fn deallocate(&self, p: NonNull<u8>, l: Layout) {
        // SAFETY: forwarded.
        unsafe { self.0.dealloc(p.as_ptr(), l) }
    }
    unsafe fn grow(
        &self,
        p: NonNull<u8>,
        old: Layout,
        new: Layout,
    ) -> Result<NonNull<[u8]>, AllocError> {
        // SAFETY: forwarded (same alignment for Vec<u8>).
        let q = unsafe { self.0.realloc(p.as_ptr(), old, new.size()) };
        let q = NonNull::new(q).ok_or(AllocError)?;
        Ok(NonNull::slice_from_raw_parts(q, new.size()))
    }
}

fn contenders() -> Vec<(&'static str, Box<dyn Contender>)> {
    let nic = unlimited_soft().unwrap();
    let pd = nic.alloc_pd().unwrap();
    assert!(
        GLOBAL.init().is_ok(),
        "the global pool must be ready: {:?}",
        GLOBAL.init_error()
    );
    vec![
        ("rdma_pool", Box::new(PoolAdapter(Pool::new(&pd).unwrap()))),
        ("global_pool", Box::new(ViaGlobal)),
        ("mimalloc", Box::new(mimalloc::MiMalloc)),
        ("jemalloc", Box::new(tikv_jemallocator::Jemalloc)),
        ("system", Box::new(System)),
    ]
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

fn workloads(c: &mut Criterion) {
    let all = contenders();
    let l64 = Layout::from_size_align(64, 8).unwrap();
    let mut g = c.benchmark_group("pair_64b");
    for (name, a) in &all {
        g.bench_function(*name, |b| {
            b.iter(|| {
                let p = a.alloc(black_box(l64));
                // SAFETY: just allocated with `l64`.
                unsafe { a.dealloc(black_box(p), l64) };
            })
        });
    }
    g.finish();

    let mut g = c.benchmark_group("churn_16b_4k");
    for (name, a) in &all {
        let mut slots: Vec<(*mut u8, Layout)> = (0..4096)
            .map(|i| {
                let l = Layout::from_size_align(16 + (i * 97) % 4080, 8).unwrap();
                (a.alloc(l), l)
            })
            .collect();
        let mut x = 0x1234_5678_9abc_def1u64;
        g.bench_function(*name, |b| {
            b.iter(|| {
                let r = xorshift(&mut x);
                let slot = &mut slots[(r % 4096) as usize];
                // SAFETY: the slot holds a live block with its layout.
                unsafe { a.dealloc(slot.0, slot.1) };
                let l = Layout::from_size_align(16 + ((r >> 20) % 4081) as usize, 8).unwrap();
                *slot = (a.alloc(l), l);
            })
        });
        for (p, l) in slots {
            // SAFETY: live blocks.
            unsafe { a.dealloc(p, l) };
        }
    }
    g.finish();

    let mut g = c.benchmark_group("cross_thread_256b");
    const BATCH: usize = 1024;
    g.throughput(Throughput::Elements(BATCH as u64));
    let l256 = Layout::from_size_align(256, 8).unwrap();
    for (name, a) in &all {
        let a: &dyn Contender = &**a;
        std::thread::scope(|s| {
            let (tx, rx) = crossbeam::channel::bounded::<Vec<usize>>(4);
            let (done_tx, done_rx) = crossbeam::channel::bounded::<()>(4);
            s.spawn(move || {
                for batch in rx {
                    for p in batch {
                        // SAFETY: blocks allocated by the producer with `l256`.
                        unsafe { a.dealloc(p as *mut u8, l256) };
                    }
                    done_tx.send(()).unwrap();
                }
            });
            g.bench_function(BenchmarkId::from_parameter(name), |b| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let mut batch = Vec::with_capacity(BATCH);
                        for _ in 0..BATCH {
                            batch.push(a.alloc(l256) as usize);
                        }
                        tx.send(batch).unwrap();
                        done_rx.recv().unwrap();
                    }
                    start.elapsed()
                })
            });
            drop(tx);
        });
    }
    g.finish();

    let mut g = c.benchmark_group("vec_growth_1m");
    let chunk = [7u8; 4096];
    for (name, a) in &all {
        let api = Api(&**a);
        g.bench_function(*name, |b| {
            b.iter(|| {
                let mut v: AVec<u8, &Api> = AVec::new_in(&api);
                for _ in 0..256 {
                    // `extend_from_slice` as std does it for `Copy` (allocator-api2 0.2 pushes
                    // byte by byte, which would time the loop rather than the allocator).
                    v.reserve(chunk.len());
                    // SAFETY: `reserve` made room for `chunk.len()` more bytes.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            chunk.as_ptr(),
                            v.as_mut_ptr().add(v.len()),
                            chunk.len(),
                        );
                        v.set_len(v.len() + chunk.len());
                    }
                }
                black_box(v.len())
            })
        });
    }
    g.finish();

    larson(c, &all, 1);
    larson(c, &all, 2);
}

/// Larson's blocks per thread and size range (mimalloc-bench: `larson 5 8 1000 5000 ...`).
const LARSON_SLOTS: usize = 5000;

fn larson_size(r: u64) -> usize {
    8 + (r % 992) as usize
}

/// Larson with `threads` threads on every contender (see the module docs).
fn larson(c: &mut Criterion, all: &[(&'static str, Box<dyn Contender>)], threads: usize) {
    let mut g = c.benchmark_group(format!("larson_{threads}t"));
    g.throughput(Throughput::Elements(threads as u64));
    for (name, a) in all {
        let a: &dyn Contender = &**a;
        let mut x = 0x4141_u64 | 1;
        // Per thread: its slots (address, size) and its random state; made by the main thread.
        let mut slots: Vec<(Vec<(usize, usize)>, u64)> = (0..threads)
            .map(|t| {
                let blocks = (0..LARSON_SLOTS)
                    .map(|_| {
                        let n = larson_size(xorshift(&mut x));
                        let l = Layout::from_size_align(n, 8).unwrap();
                        (a.alloc(l) as usize, n)
                    })
                    .collect();
                (blocks, 0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1))
            })
            .collect();
        g.bench_function(*name, |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                std::thread::scope(|s| {
                    for (blocks, rng) in slots.iter_mut() {
                        s.spawn(move || {
                            for _ in 0..iters {
                                let r = xorshift(rng);
                                let slot = &mut blocks[(r % LARSON_SLOTS as u64) as usize];
                                let old = Layout::from_size_align(slot.1, 8).unwrap();
                                // SAFETY: the slot holds a live block of `slot.1` bytes.
                                unsafe { a.dealloc(slot.0 as *mut u8, old) };
                                let n = larson_size(r >> 24);
                                let p = a.alloc(Layout::from_size_align(n, 8).unwrap());
                                // SAFETY: a fresh block of `n >= 8` bytes.
                                unsafe {
                                    p.write_volatile(b'a');
                                    p.add(1).write_volatile(b'b');
                                }
                                *slot = (p as usize, n);
                            }
                        });
                    }
                });
                start.elapsed()
            })
        });
        for (blocks, _) in slots {
            for (p, n) in blocks {
                // SAFETY: live blocks of `n` bytes.
                unsafe { a.dealloc(p as *mut u8, Layout::from_size_align(n, 8).unwrap()) };
            }
        }
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = workloads
}
criterion_main!(benches);
