//! Rules: fault injection fails exactly the calls asked for; rejected accesses are counted.

use crate::common::*;
use rdma_pool::nic::soft::SoftConfig;
use rdma_pool::nic::*;

#[test]
fn fault_injection_fails_exactly_n_calls() {
    let (nic, pd) = soft_pd(SoftConfig::default());
    let soft = nic.as_soft().unwrap();
    let mut a = buf(4096, 0);
    soft.fail_next(Verb::RegMr, 2, libc::EAGAIN);
    for _ in 0..2 {
        let e = reg_in(&pd, &mut a, Access::empty()).unwrap_err();
        assert_eq!(e.errno(), Some(libc::EAGAIN));
    }
    reg_in(&pd, &mut a, Access::empty()).unwrap();
    soft.fail_next(Verb::AllocMw, 1, libc::EOPNOTSUPP);
    assert!(pd.alloc_mw(MwType::Type1).unwrap_err().is_unsupported());
    assert_eq!(soft.counters().injected_faults, 3);
}

#[test]
fn rejected_accesses_are_counted() {
    let bed = default_bed();
    let (_dst, mr) = bed
        .b
        .reg_buf(4096, 0, Access::LOCAL_WRITE | Access::REMOTE_READ);
    let (_src, src_mr) = bed.a.reg_buf(4096, 1, Access::LOCAL_WRITE);
    assert_eq!(
        write(&bed, &src_mr, 8, mr.addr() as u64, mr.rkey()),
        WcStatus::RemAccessErr
    );
    assert_eq!(bed.b.nic.as_soft().unwrap().counters().rejected_accesses, 1);
}
