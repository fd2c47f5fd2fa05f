//! `tokio-blocking`: a tokio blocking pool swelling to hundreds of threads and going away.
//! Three times in a row: a multi-thread runtime (`threads` workers) with
//! `max_blocking_threads(700)` gets 700 `spawn_blocking` tasks (both scaled, at least 16),
//! each allocating 32 small blocks and a 4–64 KiB buffer, sleeping 20 ms (so the tasks
//! overlap and the pool grows a thread for nearly each), summing and freeing; the runtime is
//! then dropped, its threads exit. What it measures: per-thread allocator state of
//! short-lived pool threads, as a tokio service that blocks in `spawn_blocking` has them.
//! Not from mimalloc-bench.

use super::{Rng, mix, scaled};
use std::time::Duration;

const ROUNDS: usize = 3;

fn task(id: usize) -> u64 {
    let mut rng = Rng::new(id as u64 + 606);
    let small: Vec<Box<[u8]>> = (0..32)
        .map(|_| {
            let n = rng.range(16, 512);
            vec![n as u8; n].into_boxed_slice()
        })
        .collect();
    let buf = vec![id as u8; rng.range(4 << 10, 64 << 10)];
    std::thread::sleep(Duration::from_millis(20));
    small.iter().map(|b| u64::from(b[0])).sum::<u64>() + buf.len() as u64 + u64::from(buf[0])
}

pub(crate) fn run(threads: usize, scale: f64) -> u64 {
    let tasks = scaled(700, scale).max(16);
    let mut sum = 0u64;
    for round in 0..ROUNDS {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .max_blocking_threads(tasks)
            .enable_time()
            .build()
            .expect("cannot build the tokio runtime");
        let handles: Vec<_> = (0..tasks)
            .map(|i| rt.spawn_blocking(move || task(round * tasks + i)))
            .collect();
        sum = rt.block_on(async move {
            let mut sum = sum;
            for h in handles {
                sum = mix(sum, h.await.expect("a blocking task panicked"));
            }
            sum
        });
        drop(rt);
    }
    sum
}
