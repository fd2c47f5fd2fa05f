//! NUMA placement (`ArenaConfig::numa`, `rdma_pool::arena::numa`) on the soft NIC: the policy
//! the kernel reports for the arena's memory (`get_mempolicy(MPOL_F_ADDR)`), the node its pages
//! landed on (`move_pages`), the node recorded per chunk and in the stats — on whatever machine
//! runs them: with one node the bindings to node 0 are still made and checked, with several
//! every online node is asked for in turn and a thread's `Local` chunks follow its CPU.

use rdma_pool::Pool;
use rdma_pool::arena::numa::{
    MPOL_DEFAULT, MPOL_PREFERRED, current_node, is_available, node_of_page, online_nodes, policy_of,
};
use rdma_pool::arena::{
    Arena, ArenaConfig, Error, Hugepages, NumaPlacement, NumaPolicy, Run, SLAB,
};
use rdma_pool::nic::Nic;
use rdma_pool::nic::soft::SoftConfig;

const CHUNK: usize = 1 << 24;

fn cfg(numa: NumaPolicy, hugepages: Hugepages) -> ArenaConfig {
    ArenaConfig {
        reserve: 1 << 32,
        chunk: CHUNK,
        hugepages,
        numa,
        ..Default::default()
    }
}

fn arena_on(nic: &Nic, numa: NumaPolicy, hugepages: Hugepages) -> Result<Arena, Error> {
    Arena::new(&nic.alloc_pd().unwrap(), cfg(numa, hugepages))
}

/// Write every page of `run` (so each is present) and return the nodes `move_pages` reports.
fn touch_and_locate(run: &Run) -> Vec<Option<u32>> {
    (0..run.len())
        .step_by(4096)
        .map(|off| {
            let p = run.as_ptr().wrapping_add(off);
            // SAFETY: the run is ours while the arena lives.
            unsafe { p.write_volatile(0xA5) };
            node_of_page(p)
        })
        .collect()
}

/// The online nodes this process may use.
fn available_nodes() -> Vec<u32> {
    (0..1024).filter(|&n| is_available(n)).collect()
}

/// A test bed that promises several nodes (`RDMA_POOL_TEST_NUMA_NODES`, set by
/// `scripts/test.sh` for the 2-node QEMU guest) has them, so the multi-node branches below
/// really ran there.
#[test]
fn the_test_bed_has_the_nodes_it_promises() {
    if let Ok(n) = std::env::var("RDMA_POOL_TEST_NUMA_NODES") {
        let n: usize = n.parse().unwrap();
        assert_eq!(available_nodes().len(), n);
        assert_eq!(online_nodes() as usize, n);
    }
}

/// The first node the machine does not have.
fn missing_node() -> u32 {
    (0..).find(|&n| !is_available(n)).unwrap()
}

/// Everything `Node(n)` promises, checked on `arena`'s runs (one in a chunk, one larger than a
/// chunk).
fn assert_bound_to(arena: &Arena, n: u32) {
    let small = arena.alloc_run(3 * SLAB, 4096).unwrap();
    let big = arena.alloc_run(CHUNK + SLAB, 4096).unwrap();
    for run in [&small, &big] {
        for off in [0, run.len() - 4096] {
            assert_eq!(
                policy_of(run.as_ptr().wrapping_add(off)),
                Some((MPOL_PREFERRED, Some(n))),
                "policy of a run at offset {off}"
            );
        }
        assert!(touch_and_locate(run).iter().all(|&p| p == Some(n)));
        assert_eq!(arena.chunk_node(run.as_ptr()), Some(n));
    }
    let s = arena.stats();
    assert_eq!(s.numa, NumaPlacement::Node(n));
    assert_eq!(s.numa_bind_failures, 0);
    assert_eq!(s.chunks, 3); // one for the small run, two for the big one
    let expect = 3 * CHUNK as u64;
    for (i, &b) in s.node_chunk_bytes.iter().enumerate() {
        assert_eq!(b, if i == n as usize { expect } else { 0 }, "node {i}");
    }
    assert!(arena.validate());
}

#[test]
fn node_0_binds_every_chunk_whatever_the_page_kind() {
    for hp in [Hugepages::Off, Hugepages::Prefer] {
        let arena = arena_on(&Nic::soft(), NumaPolicy::Node(0), hp).unwrap();
        assert_eq!(arena.numa_placement(), NumaPlacement::Node(0));
        assert_bound_to(&arena, 0);
    }
}

#[test]
fn every_online_node_gets_the_memory_asked_of_it() {
    let nodes = available_nodes();
    assert!(!nodes.is_empty() && nodes.len() as u32 <= online_nodes());
    if nodes.len() == 1 {
        // A single-node machine: binding to it is still made and verifiable, and the next
        // node is refused.
        assert_eq!(online_nodes(), 1);
        assert!(matches!(
            arena_on(&Nic::soft(), NumaPolicy::Node(nodes[0] + 1), Hugepages::Off),
            Err(Error::Config(_))
        ));
    }
    for &n in &nodes {
        let arena = arena_on(&Nic::soft(), NumaPolicy::Node(n), Hugepages::Off).unwrap();
        assert_bound_to(&arena, n);
    }
}

#[test]
fn device_node_follows_the_soft_nics_node() {
    for &n in &available_nodes() {
        let nic = Nic::soft_with(SoftConfig {
            numa_node: Some(n),
            ..Default::default()
        });
        assert_eq!(nic.numa_node(), Some(n));
        let arena = arena_on(&nic, NumaPolicy::DeviceNode, Hugepages::Off).unwrap();
        assert_bound_to(&arena, n);
    }
}

#[test]
fn a_device_without_a_node_and_any_leave_memory_unbound() {
    let no_node = arena_on(&Nic::soft(), NumaPolicy::DeviceNode, Hugepages::Off).unwrap();
    let any = arena_on(&Nic::soft(), NumaPolicy::Any, Hugepages::Off).unwrap();
    for (arena, placement) in [
        (&no_node, NumaPlacement::DeviceHasNoNode),
        (&any, NumaPlacement::Unbound),
    ] {
        let run = arena.alloc_run(SLAB, 4096).unwrap();
        assert_eq!(policy_of(run.as_ptr()), Some((MPOL_DEFAULT, None)));
        assert!(touch_and_locate(&run).iter().all(Option::is_some));
        assert_eq!(arena.chunk_node(run.as_ptr()), None);
        let s = arena.stats();
        assert_eq!(s.numa, placement);
        assert!(!s.numa.is_bound());
        assert_eq!(s.node_chunk_bytes, [0; rdma_pool::arena::MAX_STAT_NODES]);
        assert_eq!(s.numa_bind_failures, 0);
    }
}

#[test]
fn a_node_the_machine_does_not_have_is_a_config_error() {
    let missing = missing_node();
    assert!(missing >= 1);
    assert!(matches!(
        arena_on(&Nic::soft(), NumaPolicy::Node(missing), Hugepages::Off),
        Err(Error::Config(_))
    ));
    let nic = Nic::soft_with(SoftConfig {
        numa_node: Some(missing),
        ..Default::default()
    });
    assert!(matches!(
        arena_on(&nic, NumaPolicy::DeviceNode, Hugepages::Off),
        Err(Error::Config(_))
    ));
    assert!(matches!(
        Pool::with_config(
            &Nic::soft().alloc_pd().unwrap(),
            cfg(NumaPolicy::Node(missing), Hugepages::Off)
        ),
        Err(rdma_pool::PoolError::Arena(Error::Config(_)))
    ));
}

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is empty; sched_getaffinity fills it for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set),
            0
        );
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Pin the calling thread to `cpu`; false if the machine refuses.
fn pin_to(cpu: usize) -> bool {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET and sched_setaffinity on the caller.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

#[test]
fn local_chunks_follow_the_thread_that_opens_them() {
    let arena = arena_on(&Nic::soft(), NumaPolicy::Local, Hugepages::Off).unwrap();
    assert_eq!(arena.numa_placement(), NumaPlacement::Local);
    // One thread per CPU, each pinned: its run is on its CPU's node.
    let seen: Vec<(u32, usize, usize)> = std::thread::scope(|s| {
        let handles: Vec<_> = allowed_cpus()
            .into_iter()
            .map(|cpu| {
                let arena = &arena;
                s.spawn(move || {
                    assert!(pin_to(cpu), "sched_setaffinity to cpu {cpu}");
                    let node = current_node().unwrap();
                    let run = arena.alloc_run(SLAB, 4096).unwrap();
                    assert_eq!(arena.chunk_node(run.as_ptr()), Some(node));
                    assert_eq!(policy_of(run.as_ptr()), Some((MPOL_PREFERRED, Some(node))));
                    assert!(touch_and_locate(&run).iter().all(|&p| p == Some(node)));
                    (
                        node,
                        arena.chunk_of(run.as_ptr()).unwrap(),
                        run.as_ptr() as usize,
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut nodes: Vec<u32> = seen.iter().map(|s| s.0).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let s = arena.stats();
    // One chunk per node the threads ran on: threads of one node share its open chunk.
    assert_eq!(s.chunks, nodes.len() as u64);
    for (node, chunk, _) in &seen {
        for (other_node, other_chunk, _) in &seen {
            assert_eq!(node == other_node, chunk == other_chunk);
        }
    }
    for &n in &nodes {
        assert_eq!(s.node_chunk_bytes[n as usize], CHUNK as u64);
    }
    if available_nodes().len() > 1 {
        // Several nodes: CPUs of different nodes were used, so chunks on different nodes.
        assert!(nodes.len() > 1, "CPUs on one node only: {nodes:?}");
    } else {
        assert_eq!(nodes, [0]);
    }
    assert!(arena.validate());
}

#[test]
fn a_purged_and_revived_run_keeps_its_node() {
    for hp in [Hugepages::Off, Hugepages::Prefer] {
        let arena = arena_on(&Nic::soft(), NumaPolicy::Node(0), hp).unwrap();
        let run = arena.alloc_run(2 * SLAB, 4096).unwrap();
        touch_and_locate(&run);
        // SAFETY: nothing lives in the run.
        assert_eq!(
            unsafe { arena.purge(run.as_ptr(), run.len()) }.unwrap(),
            run.len()
        );
        arena.revive(run.as_ptr(), run.len()).unwrap();
        assert_eq!(policy_of(run.as_ptr()), Some((MPOL_PREFERRED, Some(0))));
        assert!(touch_and_locate(&run).iter().all(|&p| p == Some(0)));
        assert_eq!(arena.chunk_node(run.as_ptr()), Some(0));
        assert!(arena.validate());
    }
}

#[test]
fn the_pool_reports_the_node_of_its_blocks() {
    let pd = Nic::soft_with(SoftConfig {
        numa_node: Some(0),
        ..Default::default()
    })
    .alloc_pd()
    .unwrap();
    let pool = Pool::with_config(&pd, cfg(NumaPolicy::DeviceNode, Hugepages::Off)).unwrap();
    let small = allocator_api2::vec![in &pool; 1u8; 100];
    let large = allocator_api2::vec![in &pool; 2u8; 8 << 20];
    for p in [small.as_ptr(), large.as_ptr()] {
        assert_eq!(pool.node_of(p), Some(0));
        assert_eq!(node_of_page(p), Some(0));
        assert_eq!(policy_of(p), Some((MPOL_PREFERRED, Some(0))));
    }
    assert_eq!(pool.node_of(&0u8), None);
    assert_eq!(pool.stats().alloc.arena.numa, NumaPlacement::Node(0));
    let unbound = Pool::with_config(
        &Nic::soft().alloc_pd().unwrap(),
        cfg(NumaPolicy::Any, Hugepages::Off),
    )
    .unwrap();
    let v = allocator_api2::vec![in &unbound; 1u8; 100];
    assert_eq!(unbound.node_of(v.as_ptr()), None);
    assert_eq!(policy_of(v.as_ptr()), Some((MPOL_DEFAULT, None)));
}

#[test]
fn local_placement_keeps_no_refill_reserve() {
    let pd = Nic::soft().alloc_pd().unwrap();
    // This test's own thread, pinned so its node cannot change under the check below.
    assert!(pin_to(allowed_cpus()[0]));
    let local = Pool::with_config(&pd, cfg(NumaPolicy::Local, Hugepages::Off)).unwrap();
    local.start_refill(2).unwrap();
    assert_eq!(local.stats().prefetch.reserve_target, 0);
    let v = allocator_api2::vec![in &local; 1u8; 100];
    assert_eq!(local.node_of(v.as_ptr()), current_node());
    let fixed = Pool::with_config(&pd, cfg(NumaPolicy::Node(0), Hugepages::Off)).unwrap();
    fixed.start_refill(2).unwrap();
    assert_eq!(fixed.stats().prefetch.reserve_target, 2);
    fixed.stop_refill();
}
