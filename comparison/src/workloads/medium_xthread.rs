//! `medium-xthread`: medium blocks crossing threads. The threads form producer/consumer pairs
//! (`threads / 2` pairs, at least one); a producer allocates batches of 16 blocks of
//! 64 KiB–1 MiB (each written at its first and last byte and four between) and sends them
//! through a bounded channel (4 batches) to its consumer, which reads them back and frees
//! them — every block freed by another thread than the one that allocated it. 40,000 batches
//! per producer. The medium-range counterpart of `xmalloc-test`.

use super::{Rng, medium_size, mix, read_touched, scaled, touched};
use std::mem::MaybeUninit;
use std::sync::mpsc::sync_channel;

const BATCH: usize = 16;

/// A batch of blocks.
type Batch = Vec<Box<[MaybeUninit<u8>]>>;

pub(crate) fn run(threads: usize, scale: f64) -> u64 {
    let pairs = (threads / 2).max(1);
    let batches = scaled(40_000, scale);
    std::thread::scope(|s| {
        let consumers: Vec<_> = (0..pairs)
            .map(|p| {
                let (tx, rx) = sync_channel::<Batch>(4);
                s.spawn(move || {
                    let mut rng = Rng::new(p as u64 + 202);
                    for _ in 0..batches {
                        let batch: Batch = (0..BATCH)
                            .map(|_| touched(medium_size(&mut rng), rng.next() as u8))
                            .collect();
                        tx.send(batch).expect("the consumer hung up");
                    }
                });
                s.spawn(move || {
                    let mut sum = 0u64;
                    for batch in rx {
                        for b in batch {
                            sum = sum.wrapping_add(read_touched(&b));
                        }
                    }
                    sum
                })
            })
            .collect();
        consumers
            .into_iter()
            .fold(0, |s, h| mix(s, h.join().unwrap()))
    })
}
