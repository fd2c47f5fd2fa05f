//! `larson` (mimalloc-bench `bench/larson`, `larson 5 8 1000 5000 100 4141 T`): a server-like
//! churn. Main allocates `T × 5000` blocks of 8–999 bytes, shuffles them and hands each thread
//! 5000; a thread replaces a random one of its blocks 500,000 times (touching two bytes of
//! each new block), then hands its blocks to a fresh thread — so every generation frees what
//! the previous one (or main) allocated. The original runs for 5 s and reports throughput; this
//! one runs a fixed 100 generations per thread slot (scaled) and is timed.

use super::{Rng, mix, scaled};

const CHUNKS: usize = 5000;
const ROUNDS: usize = 100;

fn block(rng: &mut Rng) -> Vec<u8> {
    let mut v = Vec::with_capacity(rng.range(8, 999));
    v.push(b'a');
    assert_eq!(v[0], b'a');
    v.push(b'b');
    v
}

pub(crate) fn run(threads: usize, scale: f64) -> u64 {
    let generations = scaled(100, scale);
    let mut rng = Rng::new(4141);
    let total = threads * CHUNKS;
    let mut all: Vec<Vec<u8>> = (0..total).map(|_| block(&mut rng)).collect();
    for i in (1..total).rev() {
        all.swap(i, rng.range(0, i));
    }
    for _ in 0..4 * total {
        let v = rng.range(0, total - 1);
        all[v] = block(&mut rng);
    }
    let mut slices: Vec<Vec<Vec<u8>>> = Vec::new();
    while !all.is_empty() {
        let rest = all.split_off(CHUNKS.min(all.len()));
        slices.push(std::mem::replace(&mut all, rest));
    }
    let slots: Vec<_> = slices
        .into_iter()
        .enumerate()
        .map(|(t, mut blocks)| {
            std::thread::spawn(move || {
                let mut rng = Rng::new(t as u64 + 7);
                let mut ops = 0u64;
                for _ in 0..generations {
                    // A fresh thread per generation, taking over the blocks.
                    let (b, r, n) = std::thread::spawn(move || {
                        let mut n = 0u64;
                        for _ in 0..ROUNDS * CHUNKS {
                            let v = rng.range(0, CHUNKS - 1);
                            blocks[v] = block(&mut rng);
                            n += 1;
                        }
                        (blocks, rng, n)
                    })
                    .join()
                    .unwrap();
                    (blocks, rng) = (b, r);
                    ops += n;
                }
                mix(ops, blocks.iter().map(|b| b.capacity() as u64).sum())
            })
        })
        .collect();
    slots.into_iter().fold(0, |s, h| mix(s, h.join().unwrap()))
}
