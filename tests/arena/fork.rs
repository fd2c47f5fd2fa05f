//! Fork: a child keeps a copy of the heap where the kernel copies pinned pages, and sees no
//! arena memory (it may only exec) where chunks are `MADV_DONTFORK`.

use super::*;
use rdma_pool::arena::ForkPolicy;
use rdma_pool::nic::soft::SoftConfig;

/// What a forked child found at `addr`: `Some(true)` when the byte there is `expected`,
/// `Some(false)` when it differs, `None` when the page is not mapped in the child.
fn child_sees(addr: *mut u8, expected: u8) -> Option<bool> {
    // SAFETY: the child runs only async-signal-safe calls (madvise, a read, _exit).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let page = (addr as usize & !4095) as *mut libc::c_void;
        // SAFETY: madvise(MADV_NORMAL) changes nothing; ENOMEM says "not mapped".
        let code = if unsafe { libc::madvise(page, 4096, libc::MADV_NORMAL) } != 0 {
            10
        } else if unsafe { *addr } == expected {
            // SAFETY (above): mapped in the child, a private copy of the parent's page.
            11
        } else {
            12
        };
        // SAFETY: leave the child without running the parent's destructors.
        unsafe { libc::_exit(code) }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status),
        "the child crashed: status {status:#x}"
    );
    match libc::WEXITSTATUS(status) {
        10 => None,
        11 => Some(true),
        12 => Some(false),
        other => panic!("unexpected child exit {other}"),
    }
}

fn check_policy(bed: &Bed) {
    let arena = arena(bed, 8 << 20, Hugepages::Prefer, Access::empty());
    let run = arena.alloc_run(SLAB, 64).unwrap();
    fill(run, 4096, 0x42);
    let policy = arena.fork_policy();
    assert_eq!(arena.stats().fork, policy);
    let seen = child_sees(run.as_ptr(), 0x42);
    match policy {
        ForkPolicy::KernelCopies => assert_eq!(seen, Some(true), "the child keeps a copy"),
        ForkPolicy::DontFork => assert_eq!(seen, None, "the child has no arena memory"),
    }
    // The parent's region still works after the fork.
    let keys = arena.keys_of(run.as_ptr()).unwrap();
    let (dst_mem, dst) = bed.b.reg_buf(4096, 0, RW);
    assert_eq!(
        write_out(bed, keys, run.as_ptr() as usize, 4096, &dst),
        WcStatus::Success
    );
    assert!(dst_mem.as_slice().iter().all(|&b| b == 0x42));
}

#[test]
fn fork_follows_the_test_nic() {
    let _g = serial();
    check_policy(&bed());
}

#[test]
fn fork_policy_for_each_soft_fork_status() {
    let _g = serial();
    for (fork, policy) in [
        (ForkStatus::Unneeded, ForkPolicy::KernelCopies),
        (ForkStatus::Disabled, ForkPolicy::DontFork),
        (ForkStatus::Enabled, ForkPolicy::DontFork),
    ] {
        let bed = soft_bed(SoftConfig {
            fork,
            ..Default::default()
        });
        let arena = arena(&bed, 8 << 20, Hugepages::Off, Access::empty());
        assert_eq!(arena.fork_policy(), policy);
        drop(arena);
        check_policy(&bed);
    }
}
