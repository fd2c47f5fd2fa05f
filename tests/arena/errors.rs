//! Error paths: bad input, `ibv_rereg_mr` failures (`ERR_CMD` and the kinds that keep the old
//! region), a registration refused by the memlock limit, a full reservation.

use super::*;
use rdma_pool::arena::{Error, RegistrationPolicy};
use rdma_pool::nic::soft::{MemlockLimit, ReregMode, SoftConfig};

fn keep_keys_bed() -> Bed {
    rereg_bed(ReregMode::KeepKeys)
}

/// An arena that fails a run it cannot register (`RegistrationPolicy::Required`).
fn strict_arena(bed: &Bed, chunk: usize) -> Arena {
    Arena::new(
        &bed.a.pd,
        ArenaConfig {
            chunk,
            policy: RegistrationPolicy::Required,
            ..small_cfg()
        },
    )
    .unwrap()
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let _g = serial();
    let bed = default_bed();
    let bad = |cfg: ArenaConfig| Arena::new(&bed.a.pd, cfg).unwrap_err();
    let base = ArenaConfig::default();
    assert!(matches!(
        bad(ArenaConfig {
            chunk: 3 << 20,
            ..base
        }),
        Error::Config(_)
    ));
    assert!(matches!(
        bad(ArenaConfig {
            chunk: 1 << 20,
            ..base
        }),
        Error::Config(_)
    ));
    assert!(matches!(
        bad(ArenaConfig {
            reserve: 1 << 29,
            chunk: 1 << 30,
            ..base
        }),
        Error::Config(_)
    ));
    assert!(matches!(
        bad(ArenaConfig {
            remote: Access::LOCAL_WRITE,
            ..base
        }),
        Error::Config(_)
    ));
    let arena = arena(&bed, 8 << 20, Hugepages::Off, Access::empty());
    assert!(matches!(
        arena.alloc_run(0, 64),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        arena.alloc_run(64, 3),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        arena.alloc_run(usize::MAX, 64),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(arena.stats().committed_bytes, 0);
    assert_eq!(arena.stats().mrs, 0);
}

#[test]
fn err_cmd_registers_the_range_anew() {
    let _g = serial();
    let bed = keep_keys_bed();
    let soft = bed.a.nic.as_soft().unwrap();
    let arena = arena(&bed, 8 << 20, Hugepages::Off, Access::empty());
    let a = arena.alloc_run(SLAB, 64).unwrap();
    fill(a, 4096, 0xA1);
    soft.fail_next_rereg(ReregErrorKind::Cmd, 1, libc::EIO);
    let b = arena.alloc_run(SLAB, 64).unwrap();
    fill(b, 4096, 0xB2);
    let s = arena.stats();
    assert_eq!(s.rereg_cmd_errors, 1, "{s:?}");
    assert_eq!(s.mrs, 1, "one region covers both runs again: {s:?}");
    let (ka, kb) = (
        arena.keys_of(a.as_ptr()).unwrap(),
        arena.keys_of(b.as_ptr()).unwrap(),
    );
    assert_eq!(ka, kb);
    assert_eq!(ka.len, 2 * SLAB);
    let (dst_mem, dst) = bed.b.reg_buf(4096, 0, RW);
    for (run, byte) in [(a, 0xA1), (b, 0xB2)] {
        assert_eq!(
            write_out(&bed, ka, run.as_ptr() as usize, 4096, &dst),
            WcStatus::Success
        );
        assert!(dst_mem.as_slice().iter().all(|&x| x == byte));
    }
    soft.validate().unwrap();
    assert!(arena.validate());
}

#[test]
fn rereg_errors_that_keep_the_old_region_fall_back_to_a_new_one() {
    let _g = serial();
    for kind in [ReregErrorKind::Input, ReregErrorKind::DontForkNew] {
        let bed = keep_keys_bed();
        let arena = arena(&bed, 8 << 20, Hugepages::Off, Access::empty());
        let a = arena.alloc_run(SLAB, 64).unwrap();
        bed.a
            .nic
            .as_soft()
            .unwrap()
            .fail_next_rereg(kind, 1, libc::EINVAL);
        let b = arena.alloc_run(SLAB, 64).unwrap();
        let s = arena.stats();
        assert_eq!(
            (s.mrs, s.fallbacks_to_new_mr, s.reregs),
            (2, 1, 0),
            "{kind:?} {s:?}"
        );
        let (ka, kb) = (
            arena.keys_of(a.as_ptr()).unwrap(),
            arena.keys_of(b.as_ptr()).unwrap(),
        );
        assert_ne!(ka.lkey, kb.lkey);
        let (_m, dst) = bed.b.reg_buf(4096, 0, RW);
        assert_eq!(
            write_out(&bed, ka, a.as_ptr() as usize, 64, &dst),
            WcStatus::Success
        );
        assert_eq!(
            write_out(&bed, kb, b.as_ptr() as usize, 64, &dst),
            WcStatus::Success
        );
    }
}

#[test]
fn err_cmd_then_refused_registrations() {
    let _g = serial();
    // One refusal: the range could not be registered whole; the old range alone is
    // registered again and the new slab gets a region of its own.
    let bed = keep_keys_bed();
    let soft = bed.a.nic.as_soft().unwrap();
    let arena = arena(&bed, 8 << 20, Hugepages::Off, Access::empty());
    let a = arena.alloc_run(SLAB, 64).unwrap();
    soft.fail_next_rereg(ReregErrorKind::Cmd, 1, libc::EIO);
    soft.fail_next(Verb::RegMr, 1, libc::ENOMEM);
    let b = arena.alloc_run(SLAB, 64).unwrap();
    let s = arena.stats();
    assert_eq!(
        (s.mrs, s.rereg_cmd_errors, s.fallbacks_to_new_mr),
        (2, 1, 1),
        "{s:?}"
    );
    assert_eq!(arena.keys_of(a.as_ptr()).unwrap().len, SLAB);
    assert_eq!(arena.keys_of(b.as_ptr()).unwrap().len, SLAB);
    assert!(arena.validate());

    // Every registration refused, strict policy, no ODP to fall back on: the run fails, its
    // slab is given back, and the old range is reported unregistered (keys_of says None, the
    // stats show the gap).
    let bed = soft_bed(SoftConfig {
        rereg: ReregMode::KeepKeys,
        odp: false,
        ..Default::default()
    });
    let soft = bed.a.nic.as_soft().unwrap();
    let arena = strict_arena(&bed, 8 << 20);
    let a = arena.alloc_run(SLAB, 64).unwrap();
    soft.fail_next_rereg(ReregErrorKind::Cmd, 1, libc::EIO);
    soft.fail_next(Verb::RegMr, 2, libc::ENOMEM);
    let e = arena.alloc_run(SLAB, 64).unwrap_err();
    assert!(
        matches!(&e, Error::Nic(n) if n.errno() == Some(libc::ENOMEM)),
        "{e}"
    );
    let s = arena.stats();
    assert_eq!(
        (s.mrs, s.committed_bytes, s.registered_bytes, s.failed_runs),
        (0, SLAB as u64, 0, 1),
        "{s:?}"
    );
    assert_eq!(arena.keys_of(a.as_ptr()), None);
    // The device works again: the next run is registered and reuses the given-back slab.
    let b = arena.alloc_run(SLAB, 64).unwrap();
    assert_eq!(b.as_ptr(), a.as_ptr().wrapping_add(SLAB));
    assert!(arena.keys_of(b.as_ptr()).is_some());
    assert!(arena.validate());
}

#[test]
fn memlock_refusal_fails_the_run_and_gives_the_slabs_back_when_strict() {
    let _g = serial();
    let bed = soft_bed(SoftConfig {
        memlock: MemlockLimit::Bytes(3 * SLAB as u64),
        rereg: ReregMode::Unsupported,
        odp: false,
        ..Default::default()
    });
    let arena = strict_arena(&bed, 8 << 20);
    arena.alloc_run(SLAB, 64).unwrap();
    let e = arena.alloc_run(3 * SLAB, 64).unwrap_err();
    assert!(
        matches!(&e, Error::Nic(n) if n.errno() == Some(libc::ENOMEM)),
        "{e}"
    );
    let s = arena.stats();
    assert_eq!(
        (s.committed_bytes, s.registered_bytes),
        (SLAB as u64, SLAB as u64),
        "{s:?}"
    );
    arena.alloc_run(2 * SLAB, 64).unwrap();
}

#[test]
fn a_full_reservation_is_an_error() {
    let _g = serial();
    let bed = default_bed();
    let arena = Arena::new(
        &bed.a.pd,
        ArenaConfig {
            reserve: 8 << 20,
            chunk: 4 << 20,
            hugepages: Hugepages::Off,
            ..Default::default()
        },
    )
    .unwrap();
    arena.alloc_run(2 * SLAB, 64).unwrap();
    arena.alloc_run(SLAB, 64).unwrap();
    arena.alloc_run(SLAB, 64).unwrap();
    let e = arena.alloc_run(SLAB, 64).unwrap_err();
    assert!(
        matches!(e, Error::ReservationFull { reserved } if reserved == 8 << 20),
        "{e}"
    );
}

#[test]
fn do_fork_old_keeps_the_new_translation() {
    let _g = serial();
    let bed = keep_keys_bed();
    let arena = arena(&bed, 8 << 20, Hugepages::Off, Access::empty());
    let a = arena.alloc_run(SLAB, 64).unwrap();
    bed.a
        .nic
        .as_soft()
        .unwrap()
        .fail_next_rereg(ReregErrorKind::DoForkOld, 1, libc::EINVAL);
    let b = arena.alloc_run(SLAB, 64).unwrap();
    let s = arena.stats();
    assert_eq!((s.reregs, s.rereg_cmd_errors, s.mrs), (1, 0, 1), "{s:?}");
    let k = arena.keys_of(b.as_ptr()).unwrap();
    assert!(k.contains(a.as_ptr() as usize, 2 * SLAB));
    let (_m, dst) = bed.b.reg_buf(4096, 0, RW);
    assert_eq!(
        write_out(&bed, k, b.as_ptr() as usize, 4096, &dst),
        WcStatus::Success
    );
}

#[test]
fn growth_by_rereg_resumes_after_err_cmd_unless_unsupported() {
    let _g = serial();
    for (errno, resumes) in [(libc::EIO, true), (libc::EOPNOTSUPP, false)] {
        let bed = keep_keys_bed();
        let soft = bed.a.nic.as_soft().unwrap();
        let arena = arena(&bed, 8 << 20, Hugepages::Off, Access::empty());
        arena.alloc_run(SLAB, 64).unwrap();
        soft.fail_next_rereg(ReregErrorKind::Cmd, 1, errno);
        arena.alloc_run(SLAB, 64).unwrap();
        arena.alloc_run(SLAB, 64).unwrap();
        let s = arena.stats();
        assert_eq!(s.rereg_cmd_errors, 1);
        if resumes {
            assert_eq!((s.reregs, s.fallbacks_to_new_mr, s.mrs), (1, 0, 1), "{s:?}");
        } else {
            assert_eq!((s.reregs, s.fallbacks_to_new_mr, s.mrs), (0, 1, 2), "{s:?}");
        }
    }
}

#[test]
fn dropping_the_arena_deregisters_every_region() {
    let _g = serial();
    let bed = rereg_bed(ReregMode::Unsupported);
    let soft = bed.a.nic.as_soft().unwrap();
    let arena = arena(&bed, 8 << 20, Hugepages::Off, Access::empty());
    for _ in 0..5 {
        let run = arena.alloc_run(SLAB, 64).unwrap();
        arena.keys_of(run.as_ptr()).unwrap();
    }
    let mrs = arena.stats().mrs;
    assert_eq!(mrs, 5);
    let before = soft.counters().deregistrations;
    drop(arena);
    assert_eq!(soft.counters().deregistrations - before, mrs);
    soft.validate().unwrap();
}
