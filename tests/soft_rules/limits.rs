//! Rules: device and process limits — the memlock budget, max_mr, max_mw, max_mr_size, max_sge,
//! messages of at most 2 GiB, the send queue depth.

use crate::common::*;
use rdma_pool::nic::soft::{MemlockLimit, ReregMode, SoftConfig};
use rdma_pool::nic::*;

#[test]
fn memlock_budget_limits_pinned_bytes() {
    let (nic, pd) = soft_pd(SoftConfig {
        memlock: MemlockLimit::Bytes(16 * 4096),
        ..Default::default()
    });
    let soft = nic.as_soft().unwrap();
    let mut a = buf(12 * 4096, 0);
    let mut b = buf(8 * 4096, 0);
    let mr = reg_in(&pd, &mut a, Access::LOCAL_WRITE).unwrap();
    assert_eq!(soft.pinned_bytes(), 12 * 4096);
    let e = reg_in(&pd, &mut b, Access::LOCAL_WRITE).unwrap_err();
    assert_eq!(e.errno(), Some(libc::ENOMEM));
    let _odp = reg_in(&pd, &mut b, Access::LOCAL_WRITE | Access::ON_DEMAND).unwrap();
    drop(mr);
    assert_eq!(soft.pinned_bytes(), 0);
    reg_in(&pd, &mut b, Access::LOCAL_WRITE).expect("budget freed by dereg");
}

#[test]
fn max_mr_and_max_mw_are_enforced() {
    let (_nic, pd) = soft_pd(SoftConfig {
        max_mr: 2,
        max_mw: 1,
        ..Default::default()
    });
    let mut a = buf(4096, 0);
    let r: Vec<_> = (0..3)
        .map(|_| reg_in(&pd, &mut a, Access::empty()))
        .collect();
    assert!(r[0].is_ok() && r[1].is_ok());
    assert!(matches!(
        r[2],
        Err(Error::Limit {
            limit: "max_mr",
            ..
        })
    ));
    let _w = pd.alloc_mw(MwType::Type1).unwrap();
    assert!(matches!(
        pd.alloc_mw(MwType::Type2),
        Err(Error::Limit {
            limit: "max_mw",
            ..
        })
    ));
}

#[test]
fn max_mr_size_and_max_sge_are_enforced() {
    let (nic, pd) = soft_pd(SoftConfig {
        max_mr_size: 8192,
        max_sge: 2,
        ..Default::default()
    });
    let mut a = buf(4 * 4096, 0);
    let e = reg_in(&pd, &mut a, Access::empty()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Limit {
                limit: "max_mr_size",
                ..
            }
        ),
        "{e}"
    );
    let cq = nic.create_cq(4).unwrap();
    let e = pd
        .create_qp(
            &cq,
            &cq,
            QpCaps {
                max_send_sge: 3,
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Limit {
                limit: "max_sge",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn max_mw_is_enforced_while_key_slots_are_free() {
    // Kills: mod.rs alloc_mw, the `max_mw` count check removed (the existing limits test is
    // saved by the full key table).
    let (_nic, pd) = soft_pd(SoftConfig {
        max_mr: 8,
        max_mw: 1,
        ..Default::default()
    });
    let _w = pd.alloc_mw(MwType::Type1).unwrap();
    assert_eq!(
        pd.alloc_mw(MwType::Type2).unwrap_err().errno(),
        Some(libc::ENOMEM)
    );
}

#[test]
fn messages_beyond_2gib_are_length_errors_without_allocating() {
    let bed = default_bed();
    let (_src, src_mr) = bed.a.reg_buf(4096, 0, Access::LOCAL_WRITE);
    let (_dst, dst_mr) = bed.b.reg_buf(4096, 0, RW);
    let huge = sge(src_mr.addr() as u64, u32::MAX, src_mr.lkey());
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe {
        bed.qa
            .post_write(1, &[huge], dst_mr.addr() as u64, dst_mr.rkey())
    }
    .unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::LocLenErr);
}

#[test]
fn a_bogus_huge_sge_is_a_protection_error_before_any_buffer_is_made() {
    let bed = default_bed();
    let (_dst, dst_mr) = bed.b.reg_buf(4096, 0, RW);
    let bogus = sge(0x1000, 1 << 30, Lkey(0));
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe {
        bed.qa
            .post_write(1, &[bogus], dst_mr.addr() as u64, dst_mr.rkey())
    }
    .unwrap();
    assert_eq!(bed.a.wait().status, WcStatus::LocProtErr);
}

#[test]
fn the_send_queue_depth_is_enforced_behind_a_waiting_send() {
    let (a, b) = (Side::new(Nic::soft()), Side::new(Nic::soft()));
    let caps = QpCaps {
        max_send_wr: 2,
        ..Default::default()
    };
    let qa = a.pd.create_qp(&a.cq, &a.cq, caps).unwrap();
    let qb = b.qp();
    link(&qa, &qb);
    let (_s, smr) = a.reg_buf(4096, 7, Access::LOCAL_WRITE);
    // SAFETY: the sent memory stays allocated and unwritten until its completion is polled.
    unsafe { qa.post_send(1, &[smr.sge(0, 8).unwrap()]) }.unwrap();
    // SAFETY: the sent memory stays allocated and unwritten until its completion is polled.
    unsafe { qa.post_send(2, &[smr.sge(0, 8).unwrap()]) }.unwrap();
    // SAFETY: the sent memory stays allocated and unwritten until its completion is polled.
    let e = unsafe { qa.post_send(3, &[smr.sge(0, 8).unwrap()]) }.unwrap_err();
    assert_eq!(e.errno(), Some(libc::ENOMEM));
}

#[test]
fn keys_past_the_first_chunks_of_the_table_work_and_are_recycled() {
    // The key table allocates its slots a chunk of 1024 at a time: regions past the first
    // chunks get distinct keys, move data, and their keys are handed out again once freed.
    // (A device without the mlx5 mkey cache: with it, a freed key comes back as it was.)
    let bed = soft_bed(SoftConfig {
        rereg: ReregMode::KeepKeys,
        ..Default::default()
    });
    let mut a = buf(4096, 7);
    let mrs: Vec<Mr> = (0..2500)
        .map(|_| reg_in(&bed.a.pd, &mut a, Access::LOCAL_WRITE).unwrap())
        .collect();
    let keys: std::collections::HashSet<u32> = mrs.iter().map(|m| m.lkey().0).collect();
    assert_eq!(keys.len(), 2500);
    let (_dst, dst_mr) = bed
        .b
        .reg_buf(4096, 0, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let last = mrs.last().unwrap();
    assert_eq!(
        write(&bed, last, 4096, dst_mr.addr() as u64, dst_mr.rkey()),
        WcStatus::Success
    );
    let soft = bed.a.nic.as_soft().unwrap();
    soft.validate().unwrap();
    drop(mrs);
    soft.validate().unwrap();
    let again = reg_in(&bed.a.pd, &mut a, Access::LOCAL_WRITE).unwrap();
    // A recycled index (1..=2500), not the next fresh one, under a new variant.
    assert!((again.lkey().0 >> 8) <= 2500 && !keys.contains(&again.lkey().0));
    soft.validate().unwrap();
}

#[test]
fn the_mlx5_model_gives_a_deregistered_regions_key_to_the_next_registration_of_its_size() {
    // mlx5's mkey cache (6.x): a deregistered region's mkey waits in the cache entry of its
    // size with the same key, and the next registration of that entry gets it back as it was;
    // another size, or a device without the cache, gets another key.
    let bed = soft_bed(SoftConfig::default());
    assert!(bed.a.nic.caps().mkey_cache);
    let soft = bed.a.nic.as_soft().unwrap();
    let mut a = buf(1 << 16, 7);
    let mut b = buf(4096, 9);
    let mr = reg_in(
        &bed.a.pd,
        &mut b,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    )
    .unwrap();
    let key = mr.rkey();
    mr.dereg().unwrap();
    soft.validate().unwrap();
    // A registration of another cache entry (16 pages vs 1) does not get it.
    let big = reg_in(&bed.a.pd, &mut a, Access::LOCAL_WRITE).unwrap();
    assert_ne!(big.rkey(), key);
    // One of the same size does: the stale key names the new region.
    let again = reg_in(
        &bed.a.pd,
        &mut b,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    )
    .unwrap();
    assert_eq!(again.rkey(), key, "the cached mkey, key and all");
    soft.validate().unwrap();
    drop((big, again));
    soft.validate().unwrap();
    // Without the cache, the slot moves to another variant.
    let bed = soft_bed(SoftConfig {
        rereg: ReregMode::KeepKeys,
        ..Default::default()
    });
    assert!(!bed.a.nic.caps().mkey_cache);
    let mr = reg_in(&bed.a.pd, &mut b, Access::LOCAL_WRITE).unwrap();
    let key = mr.rkey();
    mr.dereg().unwrap();
    let again = reg_in(&bed.a.pd, &mut b, Access::LOCAL_WRITE).unwrap();
    assert_eq!(again.rkey().index(), key.index());
    assert_ne!(again.rkey(), key);
}
