//! Error paths: bad input, `ibv_rereg_mr` failures (`ERR_CMD` and the kinds that keep the old
//! region), a registration refused by the memlock limit, a full reservation.

use super::*;
use rdma_pool::arena::{Error, Registration, RegistrationPolicy};
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
            reservations: 1,
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
    assert_eq!(arena.stats().reservations, 1);
}

#[test]
fn a_full_reservation_adds_another_behind_it_until_the_window_is_used() {
    let _g = serial();
    let bed = default_bed();
    for registration in [Registration::Pinned, Registration::Odp] {
        let arena = Arena::new(
            &bed.a.pd,
            ArenaConfig {
                reserve: 8 << 20,
                reservations: 4,
                chunk: 4 << 20,
                hugepages: Hugepages::Off,
                registration,
                ..Default::default()
            },
        )
        .unwrap();
        let s = arena.stats();
        assert_eq!(
            (s.reserved_bytes, s.reservations, s.window_bytes),
            (8 << 20, 1, 32 << 20)
        );
        let mut runs = vec![arena.alloc_run(2 * SLAB, 64).unwrap()];
        runs.push(arena.alloc_run(2 * SLAB, 64).unwrap());
        assert_eq!(arena.stats().reservations, 1);
        // The first reservation is full: the next run is cut from a second one.
        runs.push(arena.alloc_run(SLAB, 64).unwrap());
        let s = arena.stats();
        assert_eq!(
            (s.reserved_bytes, s.reservations),
            (16 << 20, 2),
            "{registration:?}"
        );
        // A run of three chunks (its own region) starts in the second reservation and ends in
        // a third; a run of two chunks takes the fourth.
        runs.push(arena.alloc_run(12 << 20, 64).unwrap());
        assert_eq!(arena.stats().reservations, 3);
        runs.push(arena.alloc_run(8 << 20, 64).unwrap());
        assert_eq!(arena.stats().reservations, 4);
        let e = arena.alloc_run(4 << 20, 64).unwrap_err();
        assert!(
            matches!(e, Error::ReservationFull { reserved } if reserved == 32 << 20),
            "{e}"
        );
        // Every run has the keys of one registration covering it, and no two runs overlap.
        let base = runs[0].as_ptr() as usize;
        for (i, r) in runs.iter().enumerate() {
            let keys = arena
                .keys_of(r.as_ptr())
                .expect("a run in an added reservation");
            assert!(keys.contains(r.as_ptr() as usize, r.len()), "run {i}");
            assert!(arena.contains(r.as_ptr()));
            assert!((r.as_ptr() as usize + r.len()) - base <= 32 << 20);
            for o in &runs[..i] {
                let (a, b) = (r.as_ptr() as usize, o.as_ptr() as usize);
                assert!(a + r.len() <= b || b + o.len() <= a, "runs {i} overlap");
            }
            // SAFETY: the run is ours while the arena lives.
            unsafe { r.as_ptr().write_bytes(i as u8, r.len()) };
        }
        assert!(arena.validate());
    }
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

/// Under an address-space limit (`RLIMIT_AS`) the window and its metadata take at most half
/// of what the process has left: reservations are dropped first, then the reservation shrinks.
#[test]
fn a_window_the_address_space_limit_refuses_is_halved() {
    const MARK: &str = "RDMA_POOL_TEST_WINDOW_CHILD";
    if std::env::var_os(MARK).is_none() {
        return run_alone(
            "errors::a_window_the_address_space_limit_refuses_is_halved",
            MARK,
        );
    }
    let bed = default_bed();
    // Room for what the process maps now and `more` bytes.
    let limit_to = |more: u64| {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let vm_kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmSize:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            .unwrap();
        let limit = vm_kib * 1024 + more;
        let lim = libc::rlimit {
            rlim_cur: limit,
            rlim_max: limit,
        };
        // SAFETY: lowering this process's own limit (a child running this test alone).
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) }, 0);
    };
    let arena = |reserve: usize, chunk: usize| {
        Arena::new(
            &bed.a.pd,
            ArenaConfig {
                reserve,
                reservations: 16,
                chunk,
                hugepages: Hugepages::Off,
                ..Default::default()
            },
        )
        .unwrap()
    };
    // Half of 40 GiB: two reservations of 8 GiB (and their alignment and metadata) fit.
    limit_to(40 << 30);
    let a = arena(8 << 30, 1 << 30);
    let s = a.stats();
    assert_eq!(
        (s.window_bytes, s.reserved_bytes, s.reservations),
        (16 << 30, 8 << 30, 1)
    );
    let run = a.alloc_run(SLAB, 64).unwrap();
    assert!(a.keys_of(run.as_ptr()).is_some());
    drop(a);
    // Half of 4 GiB: not even one reservation of 8 GiB; it shrinks to 1 GiB.
    limit_to(4 << 30);
    let b = arena(8 << 30, 256 << 20);
    let s = b.stats();
    assert_eq!(
        (s.window_bytes, s.reserved_bytes, s.reservations),
        (1 << 30, 1 << 30, 1)
    );
    let run = b.alloc_run(SLAB, 64).unwrap();
    assert!(b.keys_of(run.as_ptr()).is_some());
}

#[test]
fn chunks_skipped_for_alignment_serve_later_runs() {
    let _g = serial();
    let bed = default_bed();
    let arena = Arena::new(
        &bed.a.pd,
        ArenaConfig {
            reserve: 64 << 20,
            reservations: 4,
            chunk: 16 << 20,
            hugepages: Hugepages::Off,
            ..Default::default()
        },
    )
    .unwrap();
    // Runs aligned beyond a chunk skip the chunks before their alignment.
    let mut runs = vec![arena.alloc_run(SLAB, 64).unwrap()];
    for align in [32usize << 20, 64 << 20, 128 << 20] {
        let r = arena.alloc_run(SLAB, align).unwrap();
        assert_eq!(r.as_ptr() as usize % align, 0);
        runs.push(r);
    }
    // Whole chunks then fill every chunk nothing took, skipped ones included.
    let mut whole = 0;
    while let Ok(r) = arena.alloc_run(16 << 20, 64) {
        runs.push(r);
        whole += 1;
    }
    let chunks_taken = 1 + 3; // the first run's chunk and one per aligned run
    assert_eq!(
        whole,
        16 - chunks_taken,
        "whole chunks in a 256 MiB window of 16 MiB chunks"
    );
    for (i, r) in runs.iter().enumerate() {
        assert!(
            arena
                .keys_of(r.as_ptr())
                .is_some_and(|k| k.contains(r.as_ptr() as usize, r.len()))
        );
        for o in &runs[..i] {
            let (a, b) = (r.as_ptr() as usize, o.as_ptr() as usize);
            assert!(a + r.len() <= b || b + o.len() <= a, "runs {i} overlap");
        }
    }
    assert!(arena.validate());
}
