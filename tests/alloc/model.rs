//! A proptest model of alloc / zeroed / realloc / free with alignments against a reference:
//! contents preserved, no overlap, alignment honoured, usable size at least what was asked.

use super::*;
use proptest::prelude::*;
use std::alloc::Layout;
use std::collections::BTreeMap;
use std::sync::OnceLock;

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        size: usize,
        align_shift: u32,
        zeroed: bool,
    },
    Free {
        pick: usize,
        sized: bool,
    },
    Realloc {
        pick: usize,
        size: usize,
    },
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        20 => 0usize..=128,
        8 => 129usize..=4096,
        3 => 4097usize..=200_000,
        1 => (1usize << 20) - 8..=(3 << 20),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (size(), 0u32..=13, any::<bool>())
            .prop_map(|(size, align_shift, zeroed)| Op::Alloc { size, align_shift, zeroed }),
        4 => (any::<usize>(), any::<bool>()).prop_map(|(pick, sized)| Op::Free { pick, sized }),
        2 => (any::<usize>(), size()).prop_map(|(pick, size)| Op::Realloc { pick, size }),
    ]
}

struct Live {
    layout: Layout,
    seed: u64,
}

/// The offsets a block's pattern is written at and checked: every byte of small blocks; the
/// ends and a stride through large ones (byte-by-byte over megabytes is slow in debug builds).
fn offsets(len: usize) -> impl Iterator<Item = usize> {
    let stride = if len <= 8192 { 1 } else { 509 };
    (0..len.min(2048))
        .chain((2048..len.saturating_sub(2048)).step_by(stride))
        .chain(len.saturating_sub(2048).max(2048.min(len))..len)
}

fn fill(p: *mut u8, len: usize, seed: u64) {
    for i in offsets(len) {
        // SAFETY: a live block of at least `len` bytes.
        unsafe { *p.add(i) = pattern(seed, i) };
    }
}

/// Check the pattern written over `written` bytes, in the first `len` of them.
fn check_prefix(p: *const u8, written: usize, len: usize, seed: u64) {
    for i in offsets(written).filter(|&i| i < len) {
        // SAFETY: a live block of at least `len` bytes.
        let b = unsafe { *p.add(i) };
        assert_eq!(
            b,
            pattern(seed, i),
            "byte {i} of a {written}-byte block changed"
        );
    }
}

fn check(p: *const u8, len: usize, seed: u64) {
    for i in offsets(len) {
        // SAFETY: as above.
        let b = unsafe { *p.add(i) };
        assert_eq!(
            b,
            pattern(seed, i),
            "byte {i} of a {len}-byte block changed"
        );
    }
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<(Nic, Pd, Pool)> = OnceLock::new();
    let (_, _, pool) = POOL.get_or_init(|| {
        let nic = Nic::soft();
        let pd = nic.alloc_pd().unwrap();
        let pool = pool_on(&pd, Access::empty());
        (nic, pd, pool)
    });
    pool
}

fn run(ops: Vec<Op>) {
    let pool = pool();
    let mut live: BTreeMap<usize, Live> = BTreeMap::new();
    let mut seed = 1u64;
    let no_overlap = |live: &BTreeMap<usize, Live>, p: usize, len: usize| {
        if let Some((&q, l)) = live.range(..=p).next_back() {
            assert!(
                q + l.layout.size() <= p || l.layout.size() == 0,
                "{q:#x} overlaps {p:#x}"
            );
        }
        if let Some((&q, _)) = live.range(p + 1..).next() {
            assert!(p + len <= q, "{p:#x}+{len} overlaps {q:#x}");
        }
    };
    for op in ops {
        seed += 1;
        match op {
            Op::Alloc {
                size,
                align_shift,
                zeroed,
            } => {
                let layout = Layout::from_size_align(size, 1 << align_shift).unwrap();
                let p = if zeroed {
                    pool.alloc_zeroed(layout)
                } else {
                    pool.alloc(layout)
                };
                assert!(!p.is_null());
                assert_eq!(p as usize % layout.align(), 0, "{layout:?}");
                assert!(pool.usable_size(p).unwrap() >= size);
                assert!(!live.contains_key(&(p as usize)), "handed out twice");
                no_overlap(&live, p as usize, size);
                if zeroed {
                    // SAFETY: a fresh block of `size` bytes.
                    let s = unsafe { std::slice::from_raw_parts(p, size) };
                    assert!(s.iter().all(|&b| b == 0), "alloc_zeroed gave dirty memory");
                }
                let keys = pool.keys_of(p).expect("every block is registered");
                assert!(
                    keys.contains(p as usize, size.max(1)),
                    "a block straddles registrations"
                );
                fill(p, size, seed);
                live.insert(p as usize, Live { layout, seed });
            }
            Op::Free { pick, sized } if !live.is_empty() => {
                let p = *live.keys().nth(pick % live.len()).unwrap();
                let l = live.remove(&p).unwrap();
                check(p as *const u8, l.layout.size(), l.seed);
                // SAFETY: a live block of this pool, with its layout.
                unsafe {
                    if sized {
                        pool.free_sized(p as *mut u8, l.layout)
                    } else {
                        pool.free(p as *mut u8)
                    }
                };
            }
            Op::Realloc { pick, size } if !live.is_empty() => {
                let p = *live.keys().nth(pick % live.len()).unwrap();
                let l = live.remove(&p).unwrap();
                // SAFETY: a live block of this pool with that layout.
                let q = unsafe { pool.realloc(p as *mut u8, l.layout, size) };
                assert!(!q.is_null());
                assert_eq!(q as usize % l.layout.align(), 0);
                check_prefix(q, l.layout.size(), size, l.seed);
                assert!(pool.usable_size(q).unwrap() >= size);
                no_overlap(&live, q as usize, size);
                fill(q, size, seed);
                let layout = Layout::from_size_align(size, l.layout.align()).unwrap();
                live.insert(q as usize, Live { layout, seed });
            }
            _ => {}
        }
    }
    for (p, l) in live {
        check(p as *const u8, l.layout.size(), l.seed);
        // SAFETY: a live block of this pool.
        unsafe { pool.free(p as *mut u8) };
    }
}

/// 100 cases of ~1100 operations: over 100k operations per run on the host. The model runs on
/// the soft NIC wherever it runs, so the emulated rxe guest (where it would take many minutes)
/// runs a few cases only: `scripts/test.sh` sets `PROPTEST_CASES` there.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]
    #[test]
    fn pool_matches_the_reference_model(ops in proptest::collection::vec(op(), 1000..1200)) {
        let _g = serial();
        run(ops);
    }
}

#[test]
fn the_model_leaves_the_pool_consistent() {
    let _g = serial();
    run((0..2000)
        .map(|i| match i % 3 {
            0 | 1 => Op::Alloc {
                size: (i * 37) % 3000,
                align_shift: (i % 7) as u32,
                zeroed: i % 5 == 0,
            },
            _ => Op::Free {
                pick: i * 7,
                sized: i % 2 == 0,
            },
        })
        .collect());
    assert!(pool().validate());
    assert_eq!(pool().live_blocks(), 0);
}
