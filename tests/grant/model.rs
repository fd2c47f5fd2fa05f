//! A model of "no key comes back" (#52): random sequences of pools made and dropped on shared
//! PDs, PDs dropped, grants of every kind (type 2, type 1, region, `Auto`, owned), revoked,
//! dropped (revoked in the background), forgotten, invalidated by the peer's SEND_WITH_INV,
//! QPs failed, and verbs failing on purpose, on soft devices of several kinds (every rereg
//! mode, with and without windows, small `max_mw`/`max_mr`).
//!
//! The oracle is every key a peer was given, per device, with the grant count it was revoked
//! at. Every grant issued must carry a key never given before on its device (the runs are far
//! below the 2^20-grant horizon). After each step a peer tries a READ and a WRITE with every
//! key revoked in the last `RECENT` steps or touched by the step, and with up to `OLD` random
//! older revoked keys, through a QP that could use it (type 2: the QP it was bound through;
//! type 1 and region: a QP of its PD), at a live grant's bytes (one whose key has the stale
//! key's index where there is one): each must be refused and move no byte. A grant refused
//! with a typed error (`Limit`, `Unsupported`, `Unavailable`, `QpNotReady`, `Nic`) is not
//! issued.
//!
//! `RDMA_POOL_MODEL_STEPS` steps in all (default 20,000: about 2.5 minutes in debug on 2 cores
//! at the ~150 steps/s measured), `RDMA_POOL_MODEL_CASE_STEPS` at most per proptest case
//! (default 200), `RDMA_POOL_MODEL_OLD` older keys tried per step (default and at most 64),
//! `RDMA_POOL_MODEL_SHRINK_MS` for shrinking (default 120 s). Failures are saved in
//! `tests/proptest-regressions/grant_model.txt` and replayed first.

use super::*;
use proptest::prelude::*;
use rdma_pool::nic::soft::{ReregMode, SoftConfig};
use world::{Figures, Model};

mod world;

type PVec = allocator_api2::vec::Vec<u8, &'static Pool>;

/// Steps back whose revoked keys are all tried again.
const RECENT: usize = 4;
/// Bytes per buffer (every grant covers a whole buffer; accesses take its first 64).
const LEN: usize = 4096;
/// What a stale WRITE writes (no buffer is filled with it).
const STALE: u8 = 0xee;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The devices the model draws from.
fn config(i: u8) -> (&'static str, SoftConfig) {
    let d = SoftConfig::default;
    let none = || SoftConfig {
        max_mw: 0,
        mw_type1: false,
        mw_type2: false,
        ..d()
    };
    match i % 8 {
        0 => ("mlx5", d()),
        1 => (
            "keep-keys",
            SoftConfig {
                rereg: ReregMode::KeepKeys,
                ..d()
            },
        ),
        2 => (
            "change-keys",
            SoftConfig {
                rereg: ReregMode::ChangeKeys,
                ..d()
            },
        ),
        3 => (
            "no-rereg",
            SoftConfig {
                rereg: ReregMode::Unsupported,
                ..d()
            },
        ),
        4 => (
            "no-rereg-no-mw",
            SoftConfig {
                rereg: ReregMode::Unsupported,
                ..none()
            },
        ),
        5 => (
            "small",
            SoftConfig {
                max_mw: 8,
                max_mr: 64,
                ..d()
            },
        ),
        6 => (
            "no-rereg-mw4",
            SoftConfig {
                rereg: ReregMode::Unsupported,
                max_mw: 4,
                ..d()
            },
        ),
        _ => (
            "type1-mw16",
            SoftConfig {
                mw_type2: false,
                max_mw: 16,
                ..d()
            },
        ),
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Fault {
    verb: u8,
    n: u32,
}

#[derive(Debug, Clone)]
pub enum Op {
    NewPool {
        dev: u8,
        pd: u8,
    },
    /// Drop a pool; its grants are first revoked (0), dropped (1) or forgotten (2).
    DropPool {
        pick: u16,
        how: u8,
    },
    /// Drop a PD with everything on it (its grants dropped), and open a new one.
    DropPd {
        dev: u8,
        pd: u8,
    },
    Grant {
        pick: u16,
        kind: GrantKind,
        owned: bool,
        write: bool,
        buf: u8,
        link: u8,
        fault: Option<Fault>,
    },
    /// `n` grants on one pool, each revoked (`drop == false`) or dropped at once.
    Churn {
        pick: u16,
        kind: GrantKind,
        n: u8,
        drop: bool,
    },
    /// `n` times: a new pool on the PD, one grant, revoked, the pool dropped.
    Cycle {
        dev: u8,
        pd: u8,
        kind: GrantKind,
        n: u8,
    },
    Revoke {
        pick: u16,
        fault: Option<Fault>,
    },
    Drop {
        pick: u16,
        fault: Option<Fault>,
    },
    Forget {
        pick: u16,
    },
    PeerInv {
        pick: u16,
    },
    FailLink {
        dev: u8,
        pd: u8,
        link: u8,
    },
    Drain,
}

fn kind() -> impl Strategy<Value = GrantKind> {
    prop_oneof![
        Just(GrantKind::Auto),
        Just(GrantKind::Type2),
        Just(GrantKind::Type1),
        Just(GrantKind::Region)
    ]
}

fn fault() -> impl Strategy<Value = Option<Fault>> {
    prop::option::weighted(
        0.1,
        (0..5u8, 1..=3u32).prop_map(|(verb, n)| Fault { verb, n }),
    )
}

pub fn op() -> impl Strategy<Value = Op> {
    let (b, w) = (any::<u8>, any::<u16>);
    prop_oneof![
        3 => (b(), b()).prop_map(|(dev, pd)| Op::NewPool { dev, pd }),
        1 => (w(), 0..3u8).prop_map(|(pick, how)| Op::DropPool { pick, how }),
        1 => (b(), b()).prop_map(|(dev, pd)| Op::DropPd { dev, pd }),
        14 => (w(), kind(), prop::bool::weighted(0.3), any::<bool>(), b(), b(), fault())
            .prop_map(|(pick, kind, owned, write, buf, link, fault)| Op::Grant { pick, kind, owned, write, buf, link, fault }),
        3 => (w(), kind(), prop_oneof![2 => 1..=32u8, 1 => 100..=160u8], any::<bool>()).prop_map(|(pick, kind, n, drop)| Op::Churn { pick, kind, n, drop }),
        2 => (b(), b(), kind(), prop_oneof![2 => 1..=8u8, 1 => 40..=80u8]).prop_map(|(dev, pd, kind, n)| Op::Cycle { dev, pd, kind, n }),
        8 => (w(), fault()).prop_map(|(pick, fault)| Op::Revoke { pick, fault }),
        3 => (w(), fault()).prop_map(|(pick, fault)| Op::Drop { pick, fault }),
        1 => w().prop_map(|pick| Op::Forget { pick }),
        2 => w().prop_map(|pick| Op::PeerInv { pick }),
        1 => (b(), b(), b()).prop_map(|(dev, pd, link)| Op::FailLink { dev, pd, link }),
        1 => Just(Op::Drain),
    ]
}

/// Runs `ops` on devices `devs`; the figures, or the first violation.
fn run(devs: &[u8], ops: &[Op]) -> Result<Figures, String> {
    let mut m = Model::new(devs);
    for (i, op) in ops.iter().enumerate() {
        m.run(op).map_err(|e| format!("{e}\n  at op {i}: {op:?}"))?;
        if i % 16 == 15 {
            m.bytes_intact()?;
        }
    }
    m.bytes_intact()?;
    Ok(m.teardown())
}

fn tally(f: Figures) {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    static T: [AtomicU64; 9] = [const { AtomicU64::new(0) }; 9];
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = *START.get_or_init(std::time::Instant::now);
    let before = T[0].fetch_add(f.steps, Relaxed);
    T[1].fetch_add(f.grants, Relaxed);
    T[2].fetch_add(f.refused_grants, Relaxed);
    T[3].fetch_add(f.stale_accesses, Relaxed);
    for (t, x) in T[4..].iter().zip(f.refusals) {
        t.fetch_add(x, Relaxed);
    }
    if (before + f.steps) / 2000 != before / 2000 {
        let s = start.elapsed().as_secs_f64();
        eprintln!(
            "grant model: {} steps ({:.0}/s), {} grants, {} refused with a typed error (limit/unsupported/qp/nic/unavailable: {:?}), {} stale accesses refused",
            T[0].load(Relaxed),
            T[0].load(Relaxed) as f64 / s,
            T[1].load(Relaxed),
            T[2].load(Relaxed),
            T[4..].iter().map(|t| t.load(Relaxed)).collect::<Vec<_>>(),
            T[3].load(Relaxed)
        );
    }
}

fn case_steps() -> usize {
    env("RDMA_POOL_MODEL_CASE_STEPS", 200).max(1)
}

/// Cases of 1 to `case_steps()` steps (half on average) for `RDMA_POOL_MODEL_STEPS` in all.
fn cases() -> u32 {
    (env("RDMA_POOL_MODEL_STEPS", 20_000) * 2 / case_steps()).max(1) as u32
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_time: env("RDMA_POOL_MODEL_SHRINK_MS", 120_000) as u32,
        max_shrink_iters: 100_000,
        failure_persistence: Some(Box::new(proptest::test_runner::FileFailurePersistence::Direct(
            "tests/proptest-regressions/grant_model.txt",
        ))),
        ..ProptestConfig::default()
    })]
    #[test]
    fn no_revoked_key_comes_back_in_the_model(
        devs in proptest::collection::vec(0..8u8, 1..=3),
        ops in proptest::collection::vec(op(), 1..=case_steps()),
    ) {
        let _g = serial();
        match run(&devs, &ops) {
            Ok(f) => tally(f),
            Err(e) => {
                let names: Vec<_> = devs.iter().map(|&c| config(c).0).collect();
                prop_assert!(false, "devices {names:?}: {e}");
            }
        }
    }
}

/// A fixed sequence through every operation on every device kind, so that each is known to
/// run whatever proptest draws.
#[test]
fn every_model_operation_runs() {
    let _g = serial();
    let k = [
        GrantKind::Auto,
        GrantKind::Type2,
        GrantKind::Type1,
        GrantKind::Region,
    ];
    let mut ops = Vec::new();
    for d in 0..8u8 {
        ops.push(Op::NewPool { dev: d, pd: 0 });
        ops.push(Op::NewPool { dev: d, pd: 1 });
    }
    for i in 0..64u16 {
        let fault = (i % 5 == 0).then_some(Fault {
            verb: (i / 5 % 5) as u8,
            n: 1,
        });
        ops.push(Op::Grant {
            pick: i,
            kind: k[i as usize % 4],
            owned: i % 3 == 0,
            write: i % 2 == 0,
            buf: i as u8,
            link: i as u8,
            fault,
        });
        match i % 8 {
            0 | 1 => ops.push(Op::Revoke { pick: i * 7, fault }),
            2 => ops.push(Op::Drop { pick: i * 3, fault }),
            3 => ops.push(Op::Forget { pick: i }),
            4 => ops.push(Op::PeerInv { pick: i }),
            5 => ops.push(Op::FailLink {
                dev: i as u8,
                pd: 0,
                link: 0,
            }),
            6 => ops.push(Op::Churn {
                pick: i,
                kind: k[i as usize / 8 % 4],
                n: 8,
                drop: i % 16 == 6,
            }),
            _ => ops.push(Op::Cycle {
                dev: i as u8,
                pd: 1,
                kind: k[i as usize / 8 % 4],
                n: 2,
            }),
        }
    }
    ops.push(Op::DropPool { pick: 3, how: 2 });
    ops.push(Op::DropPd { dev: 1, pd: 0 });
    ops.push(Op::Drain);
    for devs in [[0u8, 1, 2], [3, 4, 5], [6, 7, 0]] {
        let f = run(&devs, &ops).unwrap_or_else(|e| panic!("{e}"));
        assert!(f.grants > 0 && f.stale_accesses > 0, "{f:?}");
    }
}
