//! The workloads: each takes a thread count and a scale (1.0 = the original's documented
//! parameters) and returns a checksum of what it computed — the same for every allocator.

mod alloc_test;
mod cache_scratch;
mod collections;
mod larson;
mod mstress;
mod xmalloc;

/// A workload: `(threads, scale) -> checksum`.
pub type Workload = fn(usize, f64) -> u64;

/// Workload names, as the binaries take them.
pub const NAMES: [&str; 7] = [
    "alloc-test",
    "larson",
    "xmalloc-test",
    "cache-scratch",
    "cache-thrash",
    "mstress",
    "collections",
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
