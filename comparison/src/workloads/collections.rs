//! `collections`: what a Rust service's heap traffic looks like — per thread, requests are
//! parsed into `String`s, indexed in a `HashMap<String, Vec<u64>>` that grows and is pruned,
//! responses are built with `format!` and `Vec` growth, and every 4096th request the map is
//! cloned (a snapshot) and dropped. 1,000,000 requests per thread. Not from mimalloc-bench; added because this is the traffic
//! a `#[global_allocator]` of an RDMA service sees.

use super::{Rng, mix, scaled};
use std::collections::HashMap;

pub(crate) fn run(threads: usize, scale: f64) -> u64 {
    let requests = scaled(1_000_000, scale);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                let mut rng = Rng::new(t as u64 + 1);
                let mut index: HashMap<String, Vec<u64>> = HashMap::new();
                let mut sum = 0u64;
                for i in 0..requests {
                    let key = format!("user-{}/item-{}", rng.range(0, 4999), rng.range(0, 99));
                    let n = rng.range(1, 64);
                    let entry = index.entry(key).or_default();
                    entry.extend((0..n as u64).map(|x| x ^ i as u64));
                    if entry.len() > 512 {
                        entry.drain(..256);
                    }
                    let mut response = String::with_capacity(16);
                    for v in entry.iter().rev().take(8) {
                        response.push_str(&v.to_string());
                        response.push(',');
                    }
                    sum = mix(sum, response.len() as u64);
                    if index.len() > 5_000 {
                        // Prune a tenth: the keys ending in a digit that cycles.
                        let d = char::from(b'0' + (i % 10) as u8);
                        index.retain(|k, _| !k.ends_with(d));
                    }
                    if i % 4096 == 0 {
                        let snapshot = index.clone();
                        sum = mix(sum, snapshot.len() as u64);
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
