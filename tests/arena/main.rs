//! The arena (`rdma_pool::arena`): growth that never breaks a key, page kinds, VMAs, keys_of,
//! fork, error paths, ODP and the choice of mode, degradation, purge. Runs on two soft NICs, and on `rxe0`/`rxe1` in the QEMU guest
//! (`RDMA_POOL_TEST_NIC=verbs`); tests that need a soft NIC's configuration build their own.

#[path = "../common/mod.rs"]
mod common;

mod degrade;
mod errors;
mod fork;
mod growth;
mod keys;
mod odp;
mod pages;
mod purge;

use common::*;
use rdma_pool::arena::{Arena, ArenaConfig, Hugepages, Keys, Run, SLAB};
use rdma_pool::nic::*;

/// An arena on side `a` of `bed`: 16 GiB reserved, `chunk` bytes per chunk.
pub fn arena(bed: &Bed, chunk: usize, hugepages: Hugepages, remote: Access) -> Arena {
    // SAFETY: the tests give the arena's key only to their own peer, which touches only the
    // runs a test hands it, and the test reads those after the peer's access completed.
    unsafe {
        Arena::with_remote_rights(
            &bed.a.pd,
            ArenaConfig {
                reserve: 1 << 34,
                chunk,
                hugepages,
                remote,
                ..Default::default()
            },
        )
    }
    .unwrap()
}

/// The small layout the registration tests use: 16 GiB reserved, 8 MiB chunks (4 slabs),
/// 4 KiB pages.
pub fn small_cfg() -> ArenaConfig {
    ArenaConfig {
        reserve: 1 << 34,
        chunk: 8 << 20,
        hugepages: Hugepages::Off,
        ..Default::default()
    }
}

/// Fill the first `len` bytes of `run` with `byte`.
pub fn fill(run: Run, len: usize, byte: u8) {
    // SAFETY: the run is committed arena memory owned by the test.
    unsafe { std::ptr::write_bytes(run.as_ptr(), byte, len) };
}

/// The first `len` bytes of `run`.
pub fn bytes(run: Run, len: usize) -> Vec<u8> {
    // SAFETY: as `fill`.
    unsafe { std::slice::from_raw_parts(run.as_ptr(), len) }.to_vec()
}

/// RDMA WRITE `len` bytes at `addr` (local SGE by `keys.lkey`) from side a into `dst`.
pub fn write_out(bed: &Bed, keys: Keys, addr: usize, len: usize, dst: &Mr) -> WcStatus {
    let sge = sge(addr as u64, len as u32, keys.lkey);
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe { bed.qa.post_write(1, &[sge], dst.addr() as u64, dst.rkey()) }.unwrap();
    bed.a.wait().status
}

/// The peer (side b) READs `len` bytes at `addr` with `keys.rkey` into `dst`.
pub fn peer_read(bed: &Bed, keys: Keys, addr: usize, len: usize, dst: &Mr) -> WcStatus {
    // SAFETY: the read's memory stays allocated and unread until its completion is polled.
    unsafe {
        bed.qb
            .post_read(2, &[dst.sge(0, len).unwrap()], addr as u64, keys.rkey)
    }
    .unwrap();
    bed.b.wait().status
}

/// The peer (side b) WRITEs `len` bytes of `src` to `addr` with `keys.rkey`.
pub fn peer_write(bed: &Bed, keys: Keys, addr: usize, len: usize, src: &Mr) -> WcStatus {
    // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
    unsafe {
        bed.qb
            .post_write(3, &[src.sge(0, len).unwrap()], addr as u64, keys.rkey)
    }
    .unwrap();
    bed.b.wait().status
}

/// Lines of `/proc/self/maps`: the process's VMAs.
pub fn vma_count() -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .count()
}

/// Free 2 MiB hugetlb pages.
pub fn free_hugepages() -> usize {
    let s = std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages");
    s.ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

#[test]
fn slab_is_two_mib() {
    assert_eq!(SLAB, 2 << 20);
}
