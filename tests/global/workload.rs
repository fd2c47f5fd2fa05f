//! A multi-threaded workload through the global allocator: producers build buffers of every
//! size class and kind, hand them to consumers and exit while those blocks are still live;
//! consumers check keys and contents, post a share of them to a peer, and free them.

use crate::peer::Peer;
use crate::{assert_healthy, pattern};
use std::collections::HashMap;
use std::sync::mpsc;

/// What producers hand over.
enum Item {
    Bytes(u64, Vec<u8>),
    Text(u64, String),
    Words(u64, Box<[u64]>),
}

const PRODUCERS: u64 = 4;
const CONSUMERS: usize = 3;
/// Items per producer (fewer in the emulated guest, where each costs ~20× more).
fn items() -> u64 {
    if crate::common::on_verbs() { 200 } else { 600 }
}

fn size_of_item(seed: u64) -> usize {
    match seed % 10 {
        0 => 1 + (seed as usize * 7919) % (4 << 20), // up to 4 MiB
        1 | 2 => 1 + (seed as usize * 131) % (256 << 10),
        _ => 1 + (seed as usize * 31) % 2048,
    }
}

fn make(seed: u64) -> Item {
    let n = size_of_item(seed);
    match seed % 3 {
        0 => Item::Bytes(seed, (0..n).map(|i| pattern(seed, i)).collect()),
        1 => Item::Text(
            seed,
            (0..n)
                .map(|i| (b'a' + pattern(seed, i) % 26) as char)
                .collect(),
        ),
        _ => Item::Words(seed, (0..n.div_ceil(8) as u64).map(|i| i ^ seed).collect()),
    }
}

/// The item's bytes, after checking that they are what `make` built.
fn check(item: &Item) -> &[u8] {
    match item {
        Item::Bytes(seed, v) => {
            assert!(v.iter().enumerate().all(|(i, &b)| b == pattern(*seed, i)));
            v
        }
        Item::Text(seed, s) => {
            assert!(
                s.bytes()
                    .enumerate()
                    .all(|(i, b)| b == b'a' + pattern(*seed, i) % 26)
            );
            s.as_bytes()
        }
        Item::Words(seed, w) => {
            assert!(w.iter().enumerate().all(|(i, &x)| x == i as u64 ^ seed));
            // SAFETY: a `[u64]` viewed as its bytes.
            unsafe { std::slice::from_raw_parts(w.as_ptr().cast::<u8>(), w.len() * 8) }
        }
    }
}

#[test]
fn buffers_handed_between_threads_all_have_keys_and_land_exactly_at_a_peer() {
    let (tx, rx) = mpsc::channel::<Item>();
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|t| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                // A map that grows (and rehashes) while items are built.
                let mut names: HashMap<u64, String> = HashMap::new();
                for i in 0..items() {
                    let seed = t * 1_000_003 + i;
                    names.insert(
                        seed,
                        format!("item-{seed}-{}", "x".repeat((i % 50) as usize)),
                    );
                    tx.send(make(seed)).unwrap();
                }
                for (seed, name) in &names {
                    let k = rdma_pool::keys_of(name.as_ptr()).expect("map values are pool blocks");
                    assert!(k.contains(name.as_ptr() as usize, name.len()), "{seed}");
                }
                names.len()
            })
        })
        .collect();
    drop(tx);
    // Producers exit with their blocks alive in the channel.
    let made: usize = producers.into_iter().map(|p| p.join().unwrap()).sum();
    assert_eq!(made as u64, PRODUCERS * items());

    let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            let rx = rx.clone();
            std::thread::spawn(move || {
                let mut peer = Peer::new(4 << 20);
                let (mut seen, mut posted) = (0u64, 0u64);
                loop {
                    let item = rx.lock().unwrap().recv();
                    let Ok(item) = item else { break };
                    let bytes = check(&item);
                    let k = rdma_pool::keys_of(bytes.as_ptr()).expect("every live block has keys");
                    assert!(k.contains(bytes.as_ptr() as usize, bytes.len()));
                    seen += 1;
                    if seen % 7 == 0 || bytes.len() > (1 << 20) {
                        peer.write_and_check(bytes);
                        posted += 1;
                    }
                }
                (seen, posted)
            })
        })
        .collect();
    let (mut seen, mut posted) = (0, 0);
    for c in consumers {
        let (s, p) = c.join().unwrap();
        seen += s;
        posted += p;
    }
    assert_eq!(seen, PRODUCERS * items());
    assert!(posted > seen / 8, "{posted} of {seen} posted");
    assert_healthy();
}

#[test]
fn a_vec_growing_to_mibs_stays_inside_one_registration_at_every_step() {
    let mut v: Vec<u8> = Vec::new();
    let mut moves = 0;
    let mut last = (std::ptr::null(), 0);
    for i in 0..(24usize << 20) {
        v.push(pattern(5, i));
        if (v.as_ptr(), v.capacity()) != last {
            last = (v.as_ptr(), v.capacity());
            moves += 1;
            let k = rdma_pool::keys_of(v.as_ptr()).expect("a pool block");
            assert!(
                k.contains(v.as_ptr() as usize, v.capacity()),
                "capacity {}",
                v.capacity()
            );
        }
    }
    assert!(moves > 10);
    let mut peer = Peer::new(24 << 20);
    peer.write_and_check(&v);
    // Shrinking keeps it registered too.
    v.truncate(3 << 20);
    v.shrink_to_fit();
    peer.write_and_check(&v);
    assert_healthy();
}

#[test]
fn a_peer_reads_strings_and_vecs_through_the_opt_in_rights() {
    let mut peer = Peer::new(1 << 20);
    let text = format!("{} read remotely", "pool memory ".repeat(1000));
    assert_eq!(peer.peer_reads(text.as_bytes()), text.as_bytes());
    let words: Vec<u32> = (0..50_000).collect();
    // SAFETY: a `[u32]` viewed as its bytes.
    let bytes = unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), words.len() * 4) };
    assert_eq!(peer.peer_reads(bytes), bytes);
    let boxed = Box::new([0xA5u8; 333]);
    assert_eq!(peer.peer_reads(&boxed[..]), &boxed[..]);
    assert_healthy();
}
