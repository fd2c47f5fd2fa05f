//! `alloc-test` (mimalloc-bench `bench/alloc-test`, built with `BENCH=4`): every thread owns
//! `2^18 / T` slots, half filled at the start; each step picks a slot with an 80/20 (Pareto)
//! distribution — most picks land in a small hot range — and frees what is there (reading it
//! first) or allocates 5 B–1 KiB (size classes drawn with probability ~2^-(c-1)) and fills it.
//! 100 million steps per thread, at most 16 threads, seed 41 in every thread.

use super::{mix, scaled};

/// The original's generator (a xorshift variant returning the high 32 bits).
struct Rng32(u64);

impl Rng32 {
    fn next(&mut self) -> u32 {
        let ret = self.0.wrapping_mul(0xd989_bcac_c137_dcd5);
        self.0 ^= self.0 >> 11;
        self.0 ^= self.0 << 31;
        self.0 ^= self.0 >> 18;
        (ret >> 32) as u32
    }

    fn next64(&mut self) -> u64 {
        (u64::from(self.next()) << 32) | u64::from(self.next())
    }
}

/// 5..=1024 bytes: class `c` in 2..=9 with probability ~2^-(c-1), uniform inside it.
fn size(r: u64) -> usize {
    let c = ((r & 127) + 1).trailing_zeros() + 2;
    (((r >> 7) & ((1 << c) - 1)) + 1 + (1 << c)) as usize
}

/// The 80/20 slot choice: bucket `k` (probability `P[k]`) maps to a range of `P[6 - k]` of
/// the slots, so the likeliest buckets land in the smallest, hottest ranges.
const P: [f64; 7] = [
    0.262144, 0.393216, 0.24576, 0.08192, 0.01536, 0.001536, 0.000064,
];

struct Pareto {
    /// `(cumulative probability, first slot, slots)` per bucket.
    buckets: [(f64, usize, usize); 7],
}

impl Pareto {
    fn new(slots: usize) -> Pareto {
        let mut buckets = [(0.0, 0, 0); 7];
        let (mut cum, mut start) = (0.0, 0);
        // Range sizes in bucket order, laid out one after the other.
        for k in 0..7 {
            cum += P[k];
            let len = ((slots as f64 * P[6 - k]) as usize).max(1);
            buckets[k] = (cum, start, len);
            start += len;
        }
        Pareto { buckets }
    }

    fn pick(&self, r1: u32, r2: u32, slots: usize) -> usize {
        let u = f64::from(r1) / f64::from(u32::MAX);
        let &(_, start, len) = self
            .buckets
            .iter()
            .find(|b| u <= b.0)
            .unwrap_or(&self.buckets[6]);
        (start + r2 as usize % len) % slots
    }
}

pub(crate) fn run(threads: usize, scale: f64) -> u64 {
    let threads = threads.clamp(1, 16);
    let iters = scaled(100_000_000, scale);
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            std::thread::spawn(move || {
                let slots_n = (1 << 18) / threads;
                let mut rng = Rng32(41);
                let pareto = Pareto::new(slots_n);
                let mut slots: Vec<Option<Box<[u8]>>> = (0..slots_n).map(|_| None).collect();
                let mut sum = 0u64;
                for i in 0..slots_n / 32 {
                    let bits = rng.next();
                    for j in 0..32 {
                        if bits & (1 << j) != 0 {
                            let sz = size(rng.next64());
                            slots[i * 32 + j] = Some(vec![sz as u8; sz].into_boxed_slice());
                        }
                    }
                }
                for _ in 0..iters {
                    let (r1, r2) = (rng.next(), rng.next());
                    let idx = pareto.pick(r1, r2, slots_n);
                    match slots[idx].take() {
                        Some(b) => sum = sum.wrapping_add(b.iter().map(|&x| u64::from(x)).sum()),
                        None => {
                            let sz = size(rng.next64());
                            slots[idx] = Some(vec![sz as u8; sz].into_boxed_slice());
                        }
                    }
                }
                for b in slots.into_iter().flatten() {
                    sum = sum.wrapping_add(b.iter().map(|&x| u64::from(x)).sum());
                }
                sum
            })
        })
        .collect();
    handles
        .into_iter()
        .fold(0, |s, h| mix(s, h.join().unwrap()))
}
