//! Rule: a DEVX UMEM's page-size bitmap must fit its buffer, and UMEMs need DEVX.

use crate::common::*;
use rdma_pool::nic::soft::SoftConfig;
use rdma_pool::nic::*;

#[test]
fn umem_page_size_bitmap_must_fit_the_buffer() {
    let nic = Nic::soft();
    let mut a = buf(1 << 16, 0);
    // SAFETY (all calls): `a` outlives the UMEMs.
    let e =
        unsafe { nic.umem_reg(a.as_mut_ptr(), a.len(), Access::LOCAL_WRITE, 1 << 11) }.unwrap_err();
    assert_eq!(e.errno(), Some(libc::EINVAL), "below the base page");
    let e =
        unsafe { nic.umem_reg(a.as_mut_ptr(), a.len(), Access::LOCAL_WRITE, 1 << 21) }.unwrap_err();
    assert_eq!(e.errno(), Some(libc::EINVAL), "2 MiB pages on 4 KiB memory");
    let u = unsafe {
        nic.umem_reg(
            a.as_mut_ptr(),
            a.len(),
            Access::LOCAL_WRITE,
            (1 << 12) | (1 << 21),
        )
    }
    .unwrap();
    let v = unsafe { nic.umem_reg(a.as_mut_ptr(), a.len(), Access::LOCAL_WRITE, 1 << 12) }.unwrap();
    assert_ne!(u.id(), v.id());
    if let Ok(mut h) = Buffer::huge(2 << 21) {
        let p = h.as_mut_ptr();
        unsafe { nic.umem_reg(p, h.len(), Access::LOCAL_WRITE, 1 << 21) }
            .expect("2 MiB pages fit aligned hugetlb memory");
        let e = unsafe { nic.umem_reg(p.add(4096), 1 << 21, Access::LOCAL_WRITE, 1 << 21) }
            .unwrap_err();
        assert_eq!(
            e.errno(),
            Some(libc::EINVAL),
            "2 MiB pages need a 2 MiB-aligned start"
        );
        unsafe {
            nic.umem_reg(
                p.add(4096),
                1 << 21,
                Access::LOCAL_WRITE,
                (1 << 12) | (1 << 21),
            )
        }
        .expect("4 KiB pages fit any start");
    } else {
        eprintln!("no huge pages reserved: the hugetlb part of the UMEM test is skipped");
    }

    let off = Nic::soft_with(SoftConfig {
        devx: false,
        ..Default::default()
    });
    assert!(
        unsafe { off.umem_reg(a.as_mut_ptr(), a.len(), Access::LOCAL_WRITE, 1 << 12) }
            .unwrap_err()
            .is_unsupported()
    );
}

#[test]
fn umem_needs_memory_the_device_may_use() {
    let nic = Nic::soft();
    let mut a = buf(4 * 4096, 0);
    let p = a.as_mut_ptr();
    // SAFETY (all calls): `a` outlives the UMEMs.
    // Base pages need no alignment: the device maps the buffer's pages from their start.
    unsafe { nic.umem_reg(p.wrapping_add(16), 4096, Access::LOCAL_WRITE, 1 << 12) }.unwrap();
    assert_eq!(protect(&mut a, 0, 4096, libc::PROT_READ), 0);
    let e = unsafe { nic.umem_reg(p, 4096, Access::LOCAL_WRITE, 1 << 12) }.unwrap_err();
    assert_eq!(
        e.errno(),
        Some(libc::EFAULT),
        "writable UMEM on read-only memory"
    );
    unsafe { nic.umem_reg(p, 4096, Access::empty(), 1 << 12) }.unwrap();
    assert_eq!(protect(&mut a, 0, 4096, libc::PROT_NONE), 0);
    let e = unsafe { nic.umem_reg(p, 4096, Access::empty(), 1 << 12) }.unwrap_err();
    assert_eq!(e.errno(), Some(libc::EFAULT), "unreadable memory");
    unprotect(&mut a, 0, 4096);
}
