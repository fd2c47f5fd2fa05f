//! Growth across many slabs and chunks: every key handed out before growth still works after.

use super::*;
use rdma_pool::arena::ArenaStats;
use rdma_pool::nic::soft::ReregMode;

/// Grow an arena on side a over many slabs and chunks, handing out the keys of every other
/// run, then check that each key still moves data: lkeys as local sources of RDMA WRITEs, and
/// with `remote` the rkeys for the peer's READ and WRITE.
fn grow_and_check(bed: &Bed, remote: Access) -> ArenaStats {
    let arena = arena(bed, 8 << 20, Hugepages::Prefer, remote);
    let mut handed = Vec::new();
    let mut quiet = Vec::new();
    for i in 0..16u8 {
        let slabs = 1 + (i as usize % 2);
        let run = arena.alloc_run(slabs * SLAB - 100, 4096).unwrap();
        assert!(run.len() >= slabs * SLAB - 100);
        fill(run, 4096, i + 1);
        if i % 2 == 0 {
            let keys = arena.keys_of(run.as_ptr()).unwrap();
            assert!(keys.contains(run.as_ptr() as usize, run.len()), "{keys:?}");
            handed.push((run, keys, i + 1));
        } else {
            quiet.push((run, i + 1));
        }
    }
    assert!(arena.validate());
    let (dst_mem, dst) = bed.b.reg_buf(4096, 0, RW);
    for &(run, keys, byte) in &handed {
        assert_eq!(
            arena.keys_of(run.as_ptr()),
            Some(keys),
            "keys changed after growth"
        );
        let end = run.as_ptr().wrapping_add(run.len() - 1);
        assert_eq!(
            arena.keys_of(end),
            Some(keys),
            "a run lies in one registration"
        );
        assert_eq!(
            write_out(bed, keys, run.as_ptr() as usize, 4096, &dst),
            WcStatus::Success
        );
        assert!(dst_mem.as_slice().iter().all(|&b| b == byte));
    }
    for &(run, byte) in &quiet {
        let keys = arena.keys_of(run.as_ptr()).unwrap();
        assert!(keys.contains(run.as_ptr() as usize, run.len()));
        let sge = arena
            .sge_of(unsafe { std::slice::from_raw_parts(run.as_ptr(), run.len()) })
            .unwrap();
        assert_eq!(sge.lkey, keys.lkey);
        assert_eq!(
            write_out(bed, keys, run.as_ptr() as usize, 4096, &dst),
            WcStatus::Success
        );
        assert!(dst_mem.as_slice().iter().all(|&b| b == byte));
    }
    if !remote.is_empty() {
        let (src_mem, src) = bed.b.reg_buf(4096, 0xEE, RW);
        for &(run, keys, byte) in &handed {
            let (back_mem, back) = bed.b.reg_buf(4096, 0, RW);
            assert_eq!(
                peer_read(bed, keys, run.as_ptr() as usize, 4096, &back),
                WcStatus::Success
            );
            assert!(back_mem.as_slice().iter().all(|&b| b == byte));
            assert_eq!(
                peer_write(bed, keys, run.as_ptr() as usize, 4096, &src),
                WcStatus::Success
            );
            assert_eq!(bytes(run, 4096), src_mem.as_slice());
        }
    }
    let stats = arena.stats();
    assert_eq!(stats.runs, 16);
    assert!(stats.chunks >= 3, "{stats:?}");
    assert_eq!(stats.committed_bytes, 24 * SLAB as u64);
    assert_eq!(stats.registered_bytes, stats.committed_bytes);
    assert_eq!(stats.mrs, stats.regs - stats.rereg_cmd_errors);
    stats
}

#[test]
fn growth_keeps_keys_on_the_test_nic() {
    let _g = serial();
    let bed = bed();
    let stats = grow_and_check(&bed, Access::empty());
    if bed.a.nic.caps().rereg_mr {
        assert!(stats.reregs > 0, "{stats:?}");
    } else {
        assert_eq!(stats.reregs, 0);
        assert!(stats.fallbacks_to_new_mr > 0, "{stats:?}");
    }
}

#[test]
fn growth_keeps_keys_with_remote_rights_opt_in() {
    let _g = serial();
    grow_and_check(&bed(), Access::REMOTE_READ | Access::REMOTE_WRITE);
}

#[test]
fn growth_keeps_keys_in_every_soft_rereg_mode() {
    let _g = serial();
    for mode in [
        ReregMode::Mlx5,
        ReregMode::KeepKeys,
        ReregMode::ChangeKeys,
        ReregMode::Unsupported,
    ] {
        for remote in [Access::empty(), Access::REMOTE_READ | Access::REMOTE_WRITE] {
            let bed = rereg_bed(mode);
            let s = grow_and_check(&bed, remote);
            match mode {
                ReregMode::KeepKeys => {
                    assert!(s.reregs > 0 && s.rereg_new_keys == 0, "{mode:?} {s:?}")
                }
                ReregMode::ChangeKeys => {
                    assert!(
                        s.reregs > 0 && s.rereg_new_keys == s.reregs,
                        "{mode:?} {s:?}"
                    )
                }
                ReregMode::Mlx5 => assert!(s.reregs > 0, "{mode:?} {s:?}"),
                _ => assert!(s.reregs == 0 && s.fallbacks_to_new_mr > 0, "{mode:?} {s:?}"),
            }
            // Fewer regions than runs where re-registration grows the tail.
            if s.reregs > 0 {
                assert!(s.mrs < s.runs, "{mode:?} {s:?}");
            }
            bed.a.nic.as_soft().unwrap().validate().unwrap();
        }
    }
}

#[test]
fn the_pool_rkey_alone_gives_a_peer_nothing() {
    let _g = serial();
    for op in ["read", "write"] {
        let bed = bed();
        let arena = arena(&bed, 8 << 20, Hugepages::Off, Access::empty());
        assert!(!arena.access().intersects(Access::REMOTE));
        let run = arena.alloc_run(4096, 64).unwrap();
        fill(run, 4096, 0x5A);
        let keys = arena.keys_of(run.as_ptr()).unwrap();
        let (_mem, peer) = bed.b.reg_buf(4096, 0x11, RW);
        let status = if op == "read" {
            peer_read(&bed, keys, run.as_ptr() as usize, 4096, &peer)
        } else {
            peer_write(&bed, keys, run.as_ptr() as usize, 4096, &peer)
        };
        assert_eq!(status, WcStatus::RemAccessErr, "{op}");
        assert!(
            bytes(run, 4096).iter().all(|&b| b == 0x5A),
            "{op} changed pool memory"
        );
    }
}

#[test]
fn a_chunk_left_behind_by_a_run_that_did_not_fit_takes_later_runs() {
    let _g = serial();
    let bed = bed();
    let arena = Arena::new(
        &bed.a.pd,
        ArenaConfig {
            chunk: 16 << 20, // 8 slabs
            ..small_cfg()
        },
    )
    .unwrap();
    let run = |slabs: usize| arena.alloc_run(slabs * SLAB, SLAB).unwrap();
    let a = run(6); // chunk 0: 2 slabs left
    let b = run(6); // does not fit: chunk 1, 2 slabs left
    let c = run(7); // chunk 2, 1 slab left
    assert_eq!(arena.stats().chunks, 3);
    // The open chunk (2) has one slab left: two slabs go to chunk 0, then to chunk 1.
    let d = run(2);
    assert_eq!(
        arena.stats().chunks,
        3,
        "a fresh chunk was opened with room left behind"
    );
    let e = run(2);
    assert_eq!(arena.stats().chunks, 3);
    for r in [&a, &b, &c, &d, &e] {
        let k = arena.keys_of(r.as_ptr()).expect("registered");
        assert!(k.contains(r.as_ptr() as usize, SLAB));
    }
    let starts: Vec<usize> = [&a, &b, &c, &d, &e]
        .iter()
        .map(|r| r.as_ptr() as usize)
        .collect();
    let mut sorted = starts.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 5, "runs overlap: {starts:x?}");
    assert!(arena.validate());
}
