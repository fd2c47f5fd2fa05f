//! `mstress` (mimalloc-bench `bench/mstress`, `mstress T 50 25`): 25 rounds of T threads
//! (main is thread 0), each allocating `100 × 50 × (tid % 8 + 1)` items of 1–16 words (kept
//! short) or 1–64 words (retained to the end), rarely ×100/×1000/×10000 larger; two thirds of
//! the time a random short-lived item is freed, a quarter of the time one is swapped with one
//! of 1000 shared transfer slots (so items move between threads and rounds). Every item is
//! filled when allocated and checked word by word when freed. Half the transfer slots are
//! freed after each round, all after the last.

use super::{mix, scaled};
use std::sync::atomic::{AtomicPtr, Ordering};

const TRANSFERS: usize = 1000;
const COOKIE: u64 = 0xbf58_476d_1ce4_e5b9;

/// The original's generator (a splitmix64 finaliser over a counter).
struct Pick(u64);

impl Pick {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 30;
        x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x ^= x >> 27;
        x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^= x >> 31;
        self.0 = x;
        x
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 <= percent
    }
}

/// An item: `n` words, word `i` holding `(n - i) ^ COOKIE` (so word 0 gives `n` back).
fn alloc_items(mut n: usize, r: &mut Pick) -> Box<[u64]> {
    if r.chance(1) {
        n *= if r.chance(1) {
            10_000
        } else if r.chance(10) {
            1000
        } else {
            100
        };
    }
    if n == 40 {
        n = 41;
    }
    (0..n).map(|i| (n - i) as u64 ^ COOKIE).collect()
}

/// Check an item word by word and free it; returns its words.
#[allow(clippy::boxed_local)] // freeing the box is the point
fn free_items(item: Box<[u64]>) -> u64 {
    let n = item.len();
    for (i, &w) in item.iter().enumerate() {
        assert_eq!(w, (n - i) as u64 ^ COOKIE, "memory corruption in an item");
    }
    n as u64
}

fn to_slot(item: Box<[u64]>) -> *mut u64 {
    Box::into_raw(item).cast::<u64>()
}

fn from_slot(p: *mut u64) -> Option<Box<[u64]>> {
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` came from `to_slot`; word 0 holds `n ^ COOKIE`, `n` the item's length.
    let n = (unsafe { *p } ^ COOKIE) as usize;
    // SAFETY: as above: the pointer and length of the boxed slice `to_slot` took apart.
    Some(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, n)) })
}

fn stress(tid: usize, scale_items: usize, transfer: &[AtomicPtr<u64>]) -> u64 {
    let mut r = Pick((tid as u64 + 1) * 43);
    let mut allocs = scale_items * (tid % 8 + 1);
    let mut retain = allocs / 2;
    let mut data: Vec<Option<Box<[u64]>>> = Vec::new();
    let mut retained: Vec<Box<[u64]>> = Vec::new();
    let mut words = 0u64;
    while allocs > 0 || retain > 0 {
        if retain == 0 || (r.chance(50) && allocs > 0) {
            let n = 1 << (r.next() % 5);
            data.push(Some(alloc_items(n, &mut r)));
            allocs -= 1;
        } else {
            let n = 1 << (r.next() % 7);
            retained.push(alloc_items(n, &mut r));
            retain -= 1;
        }
        if r.chance(66) && !data.is_empty() {
            let i = (r.next() % data.len() as u64) as usize;
            if let Some(item) = data[i].take() {
                words += free_items(item);
            }
        }
        if r.chance(25) && !data.is_empty() {
            let i = (r.next() % data.len() as u64) as usize;
            let t = (r.next() % TRANSFERS as u64) as usize;
            let mine = data[i].take().map_or(std::ptr::null_mut(), to_slot);
            data[i] = from_slot(transfer[t].swap(mine, Ordering::AcqRel));
        }
    }
    for item in retained.into_iter().chain(data.into_iter().flatten()) {
        words += free_items(item);
    }
    words
}

pub(crate) fn run(threads: usize, scale: f64) -> u64 {
    let scale_items = scaled(100 * 50, scale);
    let rounds = 25;
    let transfer: Vec<AtomicPtr<u64>> = (0..TRANSFERS)
        .map(|_| AtomicPtr::new(std::ptr::null_mut()))
        .collect();
    let mut r = Pick(43 * 43);
    let mut words = 0u64;
    for round in 0..rounds {
        words += std::thread::scope(|s| {
            let others: Vec<_> = (1..threads)
                .map(|tid| {
                    let transfer = &transfer;
                    s.spawn(move || stress(tid, scale_items, transfer))
                })
                .collect();
            let mine = stress(0, scale_items, &transfer);
            others.into_iter().map(|h| h.join().unwrap()).sum::<u64>() + mine
        });
        for slot in &transfer {
            if (r.chance(50) || round == rounds - 1)
                && let Some(item) = from_slot(slot.swap(std::ptr::null_mut(), Ordering::AcqRel))
            {
                words += free_items(item);
            }
        }
    }
    mix(0, words)
}
