//! ODP registration and the choice of mode: per-chunk ODP regions whose keys never change,
//! `Auto` (ODP on the soft NIC, pinned on rxe, each with its reason), implicit ODP.

use super::*;
use rdma_pool::arena::{ModeReason, RegMode, Registration};
use rdma_pool::nic::soft::SoftConfig;

/// An arena on side `a` of `bed` registering as `registration`, with `remote` rights.
pub fn arena_as(bed: &Bed, registration: Registration, remote: Access) -> Arena {
    // SAFETY: the tests give the arena's key only to their own peer, which touches only the
    // runs a test hands it, and the test reads those after the peer's access completed.
    unsafe {
        Arena::with_remote_rights(
            &bed.a.pd,
            ArenaConfig {
                remote,
                registration,
                ..small_cfg()
            },
        )
    }
    .unwrap()
}

#[test]
fn odp_keys_never_change_across_growth() {
    let _g = serial();
    let bed = bed();
    if !bed.a.nic.caps().odp.explicit {
        let e = Arena::new(
            &bed.a.pd,
            ArenaConfig {
                registration: Registration::Odp,
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(matches!(e, rdma_pool::arena::Error::Config(_)), "{e}");
        return;
    }
    let arena = arena_as(&bed, Registration::Odp, Access::empty());
    let s = arena.stats();
    assert_eq!(
        (s.mode, s.mode_reason),
        (RegMode::Odp, ModeReason::Requested)
    );
    let mut runs: Vec<(Run, Keys)> = Vec::new();
    // 3 chunks of 4 slabs, grown one slab at a time: one ODP region per chunk, keys fixed.
    for i in 0..12u8 {
        let run = arena.alloc_run(SLAB, 64).unwrap();
        fill(run, 4096, i);
        let keys = arena.keys_of(run.as_ptr()).unwrap();
        assert_eq!(keys.len, 8 << 20, "a chunk-wide region");
        runs.push((run, keys));
        for (r, k) in &runs {
            assert_eq!(arena.keys_of(r.as_ptr()), Some(*k), "keys changed");
        }
    }
    let s = arena.stats();
    assert_eq!((s.odp_mrs, s.mrs, s.reregs), (3, 3, 0), "{s:?}");
    assert_eq!(s.registered_bytes, s.committed_bytes);
    // Local use of the regions: each run's first page goes out by its lkey (page-aligned, as
    // rxe's ODP needs).
    let (_mem, dst) = bed.b.reg_buf(4096, 0, RW);
    for (i, (r, k)) in runs.iter().enumerate() {
        let st = write_out(&bed, *k, r.as_ptr() as usize, 4096, &dst);
        assert_eq!(st, WcStatus::Success);
        assert!(dst_bytes(&dst).iter().all(|&b| b == i as u8));
    }
    assert!(arena.validate());
}

/// The bytes of a test buffer registered as `mr`.
pub fn dst_bytes(mr: &Mr) -> Vec<u8> {
    // SAFETY: the test keeps the buffer behind `mr` alive and idle while reading it.
    unsafe { std::slice::from_raw_parts(mr.addr() as *const u8, mr.len()) }.to_vec()
}

#[test]
fn auto_picks_odp_on_the_soft_nic_and_pinned_on_rxe_with_the_reason() {
    let _g = serial();
    let bed = bed();
    let arena = arena_as(&bed, Registration::Auto, Access::empty());
    let s = arena.stats();
    let caps = bed.a.nic.caps();
    if caps.driver == "rxe" {
        assert_eq!(
            (s.mode, s.mode_reason),
            (RegMode::Pinned, ModeReason::OdpRdmaUnsafe)
        );
    } else if caps.odp.explicit {
        assert_eq!(
            (s.mode, s.mode_reason),
            (RegMode::Odp, ModeReason::OdpSupported)
        );
    } else {
        assert_eq!(
            (s.mode, s.mode_reason),
            (RegMode::Pinned, ModeReason::NoOdp)
        );
    }
    // A soft NIC without ODP: pinned, with that reason.
    let no_odp = soft_bed(SoftConfig {
        odp: false,
        ..Default::default()
    });
    let a = arena_as(&no_odp, Registration::Auto, Access::empty());
    let s = a.stats();
    assert_eq!(
        (s.mode, s.mode_reason),
        (RegMode::Pinned, ModeReason::NoOdp)
    );
    let run = a.alloc_run(SLAB, 64).unwrap();
    assert_eq!(a.stats().odp_mrs, 0);
    assert!(a.keys_of(run.as_ptr()).is_some());
}

#[test]
fn a_peer_writes_into_odp_memory_through_the_remote_opt_in() {
    let _g = serial();
    let bed = bed();
    if !bed.a.nic.caps().odp.explicit {
        return;
    }
    let arena = arena_as(&bed, Registration::Odp, Access::REMOTE_WRITE);
    let run = arena.alloc_run(SLAB, 4096).unwrap();
    let keys = arena.keys_of(run.as_ptr()).unwrap();
    let (_mem, src) = bed.b.reg_buf(8192, 0xC3, RW);
    // Page-aligned, as rxe's ODP needs (quirk OdpRdmaNeedsPageAlignment).
    let at = run.as_ptr() as usize + 4096;
    assert_eq!(peer_write(&bed, keys, at, 8192, &src), WcStatus::Success);
    // SAFETY: arena memory owned by the test.
    let got = unsafe { std::slice::from_raw_parts(at as *const u8, 8192) };
    assert!(got.iter().all(|&b| b == 0xC3));
    assert!(
        bytes(run, 4096).iter().all(|&b| b == 0),
        "outside the write"
    );
}

#[test]
fn implicit_odp_is_one_region_where_offered() {
    let _g = serial();
    let bed = bed();
    let arena = Arena::new(
        &bed.a.pd,
        ArenaConfig {
            registration: Registration::Odp,
            implicit_odp: true,
            ..small_cfg()
        },
    );
    let caps = bed.a.nic.caps();
    let Ok(arena) = arena else {
        assert!(!caps.odp.explicit);
        return;
    };
    let a = arena.alloc_run(SLAB, 64).unwrap();
    let b = arena.alloc_run(3 * SLAB, 64).unwrap(); // the rest of the first chunk
    let c = arena.alloc_run(20 << 20, 64).unwrap(); // a dedicated run over three chunks
    let s = arena.stats();
    let k = arena.keys_of(a.as_ptr()).unwrap();
    assert_eq!(arena.keys_of(b.as_ptr()), Some(k));
    if caps.odp.implicit {
        assert_eq!((s.odp_mrs, s.mrs), (1, 1), "{s:?}");
        assert_eq!(arena.keys_of(c.as_ptr()), Some(k));
    } else {
        // rxe: no implicit ODP; one explicit region per chunk and per dedicated run.
        assert_eq!((s.odp_mrs, s.mrs), (2, 2), "{s:?}");
        assert_eq!(arena.keys_of(c.as_ptr()).unwrap().len, 20 << 20);
    }
    fill(c, 20 << 20, 9);
    assert!(arena.validate());
}
