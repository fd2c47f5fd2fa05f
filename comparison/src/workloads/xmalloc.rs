//! `xmalloc-test` (mimalloc-bench `bench/xmalloc-test`, `xmalloc-test -w T -t 5 -s 64`): T
//! producers allocate batches of 4096 objects of 64 bytes (filling each with `i % 256`) and
//! push them on one shared stack (at most 100 batches, producers wait when it is full); T
//! consumers pop batches and free every object — each freed by another thread than the one
//! that allocated it. The original runs for 5 s; this one moves a fixed 4000 batches per
//! producer (scaled) and is timed.

use super::{mix, scaled};
use std::sync::{Condvar, Mutex};

const BATCH: usize = 4096;
const MAX_QUEUED: usize = 100;

/// A batch of objects.
type Batch = Vec<Box<[u8; 64]>>;

struct Stack {
    /// Queued batches, and producers still running.
    batches: Mutex<(Vec<Batch>, usize)>,
    changed: Condvar,
}

pub(crate) fn run(threads: usize, scale: f64) -> u64 {
    let per_producer = scaled(4000, scale);
    let stack = Stack {
        batches: Mutex::new((Vec::new(), threads)),
        changed: Condvar::new(),
    };
    let sum = std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                for _ in 0..per_producer {
                    let batch: Batch = (0..BATCH)
                        .map(|i| Box::new([(i % 256) as u8; 64]))
                        .collect();
                    let mut g = stack.batches.lock().unwrap();
                    while g.0.len() >= MAX_QUEUED {
                        g = stack.changed.wait(g).unwrap();
                    }
                    g.0.push(batch);
                    stack.changed.notify_all();
                }
                let mut g = stack.batches.lock().unwrap();
                g.1 -= 1;
                stack.changed.notify_all();
            });
        }
        let consumers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut sum = 0u64;
                    loop {
                        let batch = {
                            let mut g = stack.batches.lock().unwrap();
                            loop {
                                if let Some(b) = g.0.pop() {
                                    break Some(b);
                                }
                                if g.1 == 0 {
                                    break None;
                                }
                                g = stack.changed.wait(g).unwrap();
                            }
                        };
                        stack.changed.notify_all();
                        let Some(batch) = batch else { break };
                        for obj in batch {
                            sum += u64::from(obj[0]) + u64::from(obj[63]);
                        }
                    }
                    sum
                })
            })
            .collect();
        consumers
            .into_iter()
            .map(|c| c.join().unwrap())
            .fold(0u64, u64::wrapping_add)
    });
    mix(0, sum)
}
