//! Degradation: a refused pinned registration (memlock budget, `max_mr`) falls back to the
//! chunk's ODP region, else to unregistered memory that is flagged and counted — data intact,
//! no panic — or, under `RegistrationPolicy::Required`, fails the run. The memlock preflight.

use super::odp::dst_bytes;
use super::*;
use rdma_pool::arena::{DegradeCause, RegMode, Registration, RegistrationPolicy};
use rdma_pool::nic::soft::{MemlockLimit, ReregMode, SoftConfig};

fn budget_bed(memlock: MemlockLimit, odp: bool) -> Bed {
    soft_bed(SoftConfig {
        memlock,
        odp,
        rereg: ReregMode::Unsupported,
        ..Default::default()
    })
}

fn pinned(bed: &Bed, policy: RegistrationPolicy) -> Arena {
    Arena::new(
        &bed.a.pd,
        ArenaConfig {
            registration: Registration::Pinned,
            policy,
            ..small_cfg()
        },
    )
    .unwrap()
}

/// Allocate `n` one-slab runs, each filled with its index.
fn runs(arena: &Arena, n: u8) -> Vec<Run> {
    (0..n)
        .map(|i| {
            let r = arena.alloc_run(SLAB, 64).expect("degraded, not refused");
            fill(r, SLAB, i + 1);
            r
        })
        .collect()
}

fn intact(runs: &[Run]) {
    for (i, r) in runs.iter().enumerate() {
        assert!(bytes(*r, SLAB).iter().all(|&b| b == i as u8 + 1), "run {i}");
    }
}

#[test]
fn memlock_budget_hit_falls_back_to_odp() {
    let _g = serial();
    let bed = budget_bed(MemlockLimit::Bytes(2 * SLAB as u64), true);
    let arena = pinned(&bed, RegistrationPolicy::Degrade);
    let rs = runs(&arena, 6);
    intact(&rs);
    let s = arena.stats();
    assert_eq!(s.mode, RegMode::Pinned);
    assert!(s.odp_fallbacks >= 1 && s.odp_mrs >= 1, "{s:?}");
    assert_eq!(s.unregistered_bytes, 0);
    let d = s.last_degradation.unwrap();
    assert_eq!((d.cause, d.odp_fallback), (DegradeCause::Memlock, true));
    // Every run has keys, and the ODP ones carry RDMA.
    let (_mem, dst) = bed.b.reg_buf(4096, 0, RW);
    for (i, r) in rs.iter().enumerate() {
        let k = arena.keys_of(r.as_ptr()).unwrap();
        assert_eq!(
            write_out(&bed, k, r.as_ptr() as usize, 4096, &dst),
            WcStatus::Success
        );
        assert!(dst_bytes(&dst).iter().all(|&b| b == i as u8 + 1));
    }
    assert!(arena.validate());
}

#[test]
fn memlock_budget_hit_without_odp_serves_flagged_memory_then_registers_again() {
    let _g = serial();
    let bed = budget_bed(MemlockLimit::Bytes(2 * SLAB as u64), false);
    let arena = pinned(&bed, RegistrationPolicy::Degrade);
    let rs = runs(&arena, 4);
    intact(&rs);
    let keyed: Vec<bool> = rs
        .iter()
        .map(|r| arena.keys_of(r.as_ptr()).is_some())
        .collect();
    assert_eq!(keyed, [true, true, false, false]);
    assert!(arena.sge_of(&[0u8; 1]).is_err());
    let s = arena.stats();
    assert_eq!(
        (s.unregistered_bytes, s.unregistered_runs),
        (2 * SLAB as u64, 2)
    );
    assert_eq!(
        s.last_degradation.map(|d| (d.cause, d.odp_fallback)),
        Some((DegradeCause::Memlock, false))
    );
    // Later growth tries again: once pinned memory is available (the registered runs are
    // purged, which deregisters them), new runs are registered.
    for r in &rs[..2] {
        // SAFETY: the test no longer uses these runs.
        assert_eq!(unsafe { arena.purge(r.as_ptr(), r.len()) }.unwrap(), SLAB);
    }
    let r = arena.alloc_run(SLAB, 64).unwrap();
    assert!(arena.keys_of(r.as_ptr()).is_some());
    assert!(bytes(rs[2], SLAB).iter().all(|&b| b == 3));
    assert!(bytes(rs[3], SLAB).iter().all(|&b| b == 4));
    assert!(arena.validate());
}

#[test]
fn strict_mode_fails_the_allocation_instead() {
    let _g = serial();
    let bed = budget_bed(MemlockLimit::Bytes(2 * SLAB as u64), false);
    let arena = pinned(&bed, RegistrationPolicy::Required);
    let rs = runs(&arena, 2);
    let e = arena.alloc_run(SLAB, 64).unwrap_err();
    assert!(
        matches!(&e, rdma_pool::arena::Error::Nic(n) if n.errno() == Some(libc::ENOMEM)),
        "{e}"
    );
    let s = arena.stats();
    assert_eq!(
        (s.unregistered_bytes, s.failed_runs, s.degradations),
        (0, 1, 1)
    );
    intact(&rs);
    // With ODP to fall back on, strict mode still serves registered (ODP) memory.
    let bed = budget_bed(MemlockLimit::Bytes(2 * SLAB as u64), true);
    let arena = pinned(&bed, RegistrationPolicy::Required);
    let rs = runs(&arena, 4);
    assert!(rs.iter().all(|r| arena.keys_of(r.as_ptr()).is_some()));
}

#[test]
fn max_mr_hit_falls_back_then_degrades() {
    let _g = serial();
    for odp in [true, false] {
        let bed = soft_bed(SoftConfig {
            max_mr: 3,
            odp,
            rereg: ReregMode::Unsupported,
            ..Default::default()
        });
        let arena = pinned(&bed, RegistrationPolicy::Degrade);
        let rs = runs(&arena, 8);
        intact(&rs);
        let s = arena.stats();
        assert_eq!(
            s.last_degradation.map(|d| d.cause),
            Some(DegradeCause::MaxMr)
        );
        assert!(s.mrs <= 3, "{s:?}");
        // An ODP region would be a fourth region too: both are refused, the rest unregistered.
        assert_eq!((s.mrs, s.odp_fallbacks), (3, 0), "{s:?}");
        assert_eq!(s.unregistered_bytes, 5 * SLAB as u64, "{s:?}");
        assert!(arena.validate());
    }
}

#[test]
fn memlock_preflight_raises_the_soft_limit_to_the_hard_one() {
    let _g = serial();
    let get = || {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid out-parameter.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) }, 0);
        r
    };
    let old = get();
    if old.rlim_max > 0 {
        let lower = libc::rlimit {
            rlim_cur: old.rlim_max.min(1 << 20) / 2,
            rlim_max: old.rlim_max,
        };
        // SAFETY: lowering the soft limit is always allowed.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lower) }, 0);
    }
    let bed = bed();
    let arena = pinned(&bed, RegistrationPolicy::Degrade);
    let m = arena.stats().memlock;
    let now = get();
    assert_eq!(now.rlim_cur, now.rlim_max);
    assert_eq!(m.raised, old.rlim_max > 0);
    let bytes = |v: libc::rlim_t| {
        if v == libc::RLIM_INFINITY {
            u64::MAX
        } else {
            v
        }
    };
    assert_eq!((m.soft, m.hard), (bytes(now.rlim_cur), bytes(now.rlim_max)));
}

/// Set in the child that runs [`memlock_limit_of_8_mib_degrades_and_loses_nothing`] under the
/// kernel's default `RLIMIT_MEMLOCK`.
const CHILD: &str = "RDMA_POOL_TEST_MEMLOCK_CHILD";

/// The memlock path on the test NIC at the kernel's default limit, 8 MiB: in the rxe guest the
/// test re-runs itself in a child whose soft and hard limits are lowered to 8 MiB (the guest
/// gives the test user 1 GiB, and lowering the hard limit cannot be undone), as the guest's
/// non-root user; on the host (root bypasses the limit) a soft NIC with an 8 MiB budget stands
/// in.
#[test]
fn memlock_limit_of_8_mib_degrades_and_loses_nothing() {
    let _g = serial();
    if on_verbs() && std::env::var_os(CHILD).is_none() {
        run_alone(
            "degrade::memlock_limit_of_8_mib_degrades_and_loses_nothing",
            CHILD,
        );
        return;
    }
    if on_verbs() {
        let limit = libc::rlimit {
            rlim_cur: 8 << 20,
            rlim_max: 8 << 20,
        };
        // SAFETY: lowering both limits of this (child) process.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) }, 0);
    }
    let bed = if on_verbs() {
        bed()
    } else {
        budget_bed(MemlockLimit::Bytes(8 << 20), false)
    };
    // The peer's buffer first: on rxe both devices pin against the one process limit.
    let (_mem, dst) = bed.b.reg_buf(4096, 0, RW);
    let arena = pinned(&bed, RegistrationPolicy::Degrade);
    if on_verbs() {
        let m = arena.stats().memlock;
        assert_eq!((m.soft, m.hard), (8 << 20, 8 << 20));
    }
    let rs = runs(&arena, 12); // 24 MiB
    intact(&rs);
    let s = arena.stats();
    if on_verbs() && has_cap_ipc_lock() {
        // Root (CAP_IPC_LOCK): the kernel does not enforce the limit; nothing degrades.
        assert_eq!((s.degradations, s.registered_bytes), (0, 24 << 20), "{s:?}");
        for r in &rs {
            assert!(arena.keys_of(r.as_ptr()).is_some());
        }
        return;
    }
    assert!(s.degradations > 0, "{s:?}");
    assert!(s.registered_bytes <= 8 << 20, "{s:?}");
    assert_eq!(s.unregistered_bytes + s.registered_bytes, 24 << 20, "{s:?}");
    let d = s.last_degradation.unwrap();
    assert_eq!((d.cause, d.odp_fallback), (DegradeCause::Memlock, false));
    // What is registered still works; what is not has no keys.
    let r = rs[0];
    let k = arena.keys_of(r.as_ptr()).unwrap();
    assert_eq!(
        write_out(&bed, k, r.as_ptr() as usize, 4096, &dst),
        WcStatus::Success
    );
    assert!(dst_bytes(&dst).iter().all(|&b| b == 1));
    assert!(arena.keys_of(rs[11].as_ptr()).is_none());
    assert!(arena.validate());
}
