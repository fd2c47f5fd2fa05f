//! `vec-growth`: `Vec`s grown element by element from empty, the way Rust code collects
//! output. Every thread runs rounds of four vectors growing side by side — two `Vec<u8>` to
//! 256 KiB–2 MiB and two `Vec<u64>` to 1–4 MiB, pushed in turns of 256 elements, so each
//! reallocation passes through the medium range with the others' blocks in the way — then
//! reads a few elements back and drops them. 240 rounds per thread. `Vec`'s growth policy
//! (doubling) is the same for every allocator; what differs is what a `realloc` costs (in
//! place, a copy, or `mremap`) and what memory it leaves behind.

use super::{Rng, mix, scaled};

/// Elements pushed into one vector before turning to the next.
const TURN: usize = 256;

pub(crate) fn run(threads: usize, scale: f64) -> u64 {
    let rounds = scaled(240, scale);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                let mut rng = Rng::new(t as u64 + 303);
                let mut sum = 0u64;
                for _ in 0..rounds {
                    let targets = [
                        rng.range(256 << 10, 2 << 20),
                        rng.range(256 << 10, 2 << 20),
                        rng.range(1 << 20, 4 << 20) / 8,
                        rng.range(1 << 20, 4 << 20) / 8,
                    ];
                    let (mut a, mut b) = (Vec::<u8>::new(), Vec::<u8>::new());
                    let (mut c, mut d) = (Vec::<u64>::new(), Vec::<u64>::new());
                    while a.len() < targets[0]
                        || b.len() < targets[1]
                        || c.len() < targets[2]
                        || d.len() < targets[3]
                    {
                        for _ in 0..TURN.min(targets[0].saturating_sub(a.len())) {
                            a.push(a.len() as u8);
                        }
                        for _ in 0..TURN.min(targets[1].saturating_sub(b.len())) {
                            b.push(b.len() as u8 ^ 0x5a);
                        }
                        for _ in 0..TURN.min(targets[2].saturating_sub(c.len())) {
                            c.push(c.len() as u64);
                        }
                        for _ in 0..TURN.min(targets[3].saturating_sub(d.len())) {
                            d.push(!(d.len() as u64));
                        }
                    }
                    for v in [&a, &b] {
                        sum = mix(
                            sum,
                            v.len() as u64 + u64::from(v[v.len() / 3] ^ v[v.len() - 1]),
                        );
                    }
                    for v in [&c, &d] {
                        sum = mix(sum, v.len() as u64 ^ v[v.len() / 3] ^ v[v.len() - 1]);
                    }
                }
                sum
            })
        })
        .collect();
    handles
        .into_iter()
        .fold(0, |s, h| mix(s, h.join().unwrap()))
}
