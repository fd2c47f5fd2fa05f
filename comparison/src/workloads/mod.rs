//! The workloads: each takes a thread count and a scale (1.0 = the original's documented
//! parameters) and returns a checksum of what it computed — the same for every allocator.
//!
//! The first seven follow mimalloc-bench; the others probe shapes it leaves out: medium blocks
//! (64 KiB–1 MiB) fragmenting, crossing threads and growing in `Vec`s, memory given back
//! between phases, thousands of threads, a tokio blocking pool, `fork` under load, huge
//! lazily-used capacities and over-aligned blocks.

use std::mem::MaybeUninit;

mod alloc_test;
mod cache_scratch;
mod collections;
mod larson;
mod medium_frag;
mod medium_xthread;
mod mstress;
mod overaligned;
mod phases;
mod spawn;
mod threads;
mod tokio_blocking;
mod vec_growth;
mod with_capacity;
mod xmalloc;

/// A workload: `(threads, scale) -> checksum`.
pub type Workload = fn(usize, f64) -> u64;

/// Workload names, as the binaries take them.
pub const NAMES: [&str; 16] = [
    "alloc-test",
    "larson",
    "xmalloc-test",
    "cache-scratch",
    "cache-thrash",
    "mstress",
    "collections",
    "medium-frag",
    "medium-xthread",
    "vec-growth",
    "phases",
    "threads",
    "tokio-blocking",
    "spawn",
    "with-capacity",
    "overaligned",
];

/// The workload called `name`.
pub fn by_name(name: &str) -> Option<Workload> {
    Some(match name {
        "alloc-test" => alloc_test::run,
        "larson" => larson::run,
        "xmalloc-test" => xmalloc::run,
        "cache-scratch" => cache_scratch::run,
        "cache-thrash" => cache_scratch::run_thrash,
        "mstress" => mstress::run,
        "collections" => collections::run,
        "medium-frag" => medium_frag::run,
        "medium-xthread" => medium_xthread::run,
        "vec-growth" => vec_growth::run,
        "phases" => phases::run,
        "threads" => threads::run,
        "tokio-blocking" => tokio_blocking::run,
        "spawn" => spawn::run,
        "with-capacity" => with_capacity::run,
        "overaligned" => overaligned::run,
        _ => return None,
    })
}

/// A small, fast, deterministic generator (xorshift64*), seeded per thread.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `lo..=hi`.
    pub(crate) fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
}

/// `n` scaled, at least 1.
pub(crate) fn scaled(n: usize, scale: f64) -> usize {
    ((n as f64 * scale) as usize).max(1)
}

/// Mix `x` into a running checksum.
pub(crate) fn mix(sum: u64, x: u64) -> u64 {
    (sum ^ x).wrapping_mul(0x100_0000_01B3).rotate_left(5)
}

/// A block of the medium range: 64 KiB to 1 MiB.
pub(crate) fn medium_size(rng: &mut Rng) -> usize {
    rng.range(64 << 10, 1 << 20)
}

/// How many bytes of a block [`touched`] writes: the first, the last and four between.
const TOUCHES: usize = 6;

fn touch_at(len: usize, k: usize) -> usize {
    (len - 1) * k / (TOUCHES - 1)
}

/// A block of `len` (> 0) bytes, used the way a program uses a large buffer it fills only in
/// part: its first and last byte and four between are written (`tag`, `tag + 1`, …), the rest
/// is left as the allocator gave it — so an allocator that commits lazily keeps it cheap.
pub(crate) fn touched(len: usize, tag: u8) -> Box<[MaybeUninit<u8>]> {
    let mut b = Box::new_uninit_slice(len);
    for k in 0..TOUCHES {
        b[touch_at(len, k)].write(tag.wrapping_add(k as u8));
    }
    b
}

/// Read back what [`touched`] wrote (the sum of the bytes, plus the length).
pub(crate) fn read_touched(b: &[MaybeUninit<u8>]) -> u64 {
    let len = b.len();
    (0..TOUCHES)
        // SAFETY: `touched` wrote the bytes at these offsets.
        .map(|k| u64::from(unsafe { b[touch_at(len, k)].assume_init() }))
        .sum::<u64>()
        + len as u64
}
