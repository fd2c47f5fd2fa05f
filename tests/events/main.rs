//! Device events: the pool reads its device's asynchronous events; a port going down and up
//! is counted and changes nothing else; after a fatal event it stops calling the device,
//! keeps serving memory (unregistered, counted, with the cause), keeps what was handed out
//! intact, and refuses grants. Injected on the soft NIC (which then fails every verb with
//! `EIO`, as a dead device does); on the verbs devices of the QEMU guest, reading the event
//! channel of a healthy device returns nothing, without blocking.

#[path = "../common/mod.rs"]
mod common;

use common::*;
use rdma_pool::Pool;
use rdma_pool::arena::{ArenaConfig, DegradeCause, Registration, RegistrationPolicy};
use rdma_pool::grant::GrantError;
use rdma_pool::nic::*;
use std::alloc::Layout;

fn cfg() -> ArenaConfig {
    small_arena()
}

#[test]
fn a_healthy_device_has_no_pending_events_and_polling_does_not_block() {
    let _g = serial();
    let (n0, _n1) = nics();
    let t = std::time::Instant::now();
    assert_eq!(n0.poll_async_event().unwrap(), None);
    let pool = Pool::with_config(&n0.alloc_pd().unwrap(), cfg()).unwrap();
    let v = allocator_api2::vec![in &pool; 1u8; 3 << 20]; // a growth: the pool polls too
    assert_eq!(pool.poll_device_events(), 0);
    assert!(!pool.stats().alloc.arena.device_dead);
    assert!(pool.keys_of(v.as_ptr()).is_some());
    assert!(t.elapsed() < std::time::Duration::from_secs(5));
}

#[test]
fn a_port_going_down_and_up_is_counted_and_changes_nothing_else() {
    let _g = serial();
    let nic = Nic::soft();
    let pool = Pool::with_config(&nic.alloc_pd().unwrap(), cfg()).unwrap();
    let soft = nic.as_soft().unwrap();
    soft.inject_event(AsyncEvent::PortError { port: 1 });
    soft.inject_event(AsyncEvent::PortActive { port: 1 });
    assert_eq!(pool.poll_device_events(), 2);
    let s = pool.stats().alloc.arena;
    assert_eq!(
        (s.device_events, s.port_errors, s.device_dead),
        (2, 1, false)
    );
    let v = allocator_api2::vec![in &pool; 1u8; 3 << 20];
    assert!(pool.keys_of(v.as_ptr()).is_some());
}

#[test]
fn after_a_fatal_event_the_pool_serves_memory_unregistered_and_calls_the_device_no_more() {
    let _g = serial();
    let (server, client) = (Side::new(Nic::soft()), Side::new(Nic::soft()));
    let (qs, _qc) = connect(&server, &client);
    let pool = Pool::with_config(&server.pd, cfg()).unwrap();
    let before = allocator_api2::vec![in &pool; 7u8; 100_000];
    let big = allocator_api2::vec![in &pool; 8u8; 5 << 20];
    assert!(pool.keys_of(before.as_ptr()).is_some());
    let soft = server.nic.as_soft().unwrap();
    soft.inject_event(AsyncEvent::DeviceFatal);
    // The next growth reads the event itself.
    let regs = soft.counters().registrations;
    let after = allocator_api2::vec![in &pool; 9u8; 20 << 20];
    let s = pool.stats().alloc.arena;
    assert!(s.device_dead && s.device_events == 1, "{s:?}");
    assert_eq!(
        pool.keys_of(after.as_ptr()),
        None,
        "no keys from a dead device"
    );
    assert_eq!(s.last_degradation.unwrap().cause, DegradeCause::DeviceDead);
    assert!(s.unregistered_runs >= 1);
    assert_eq!(
        soft.counters().registrations,
        regs,
        "the dead device was not called"
    );
    // Memory keeps being served, of every size; what was handed out is intact.
    for n in [16usize, 5000, 200_000, 3 << 20] {
        let p = pool.alloc(Layout::from_size_align(n, 8).unwrap());
        assert!(!p.is_null());
        // SAFETY: a fresh block of `n` bytes, freed at once.
        unsafe {
            std::ptr::write_bytes(p, 1, n);
            pool.free(p);
        }
    }
    assert!(before.iter().all(|&b| b == 7) && big.iter().all(|&b| b == 8));
    assert!(after.iter().all(|&b| b == 9));
    // No grant is started on a dead device.
    assert!(matches!(
        pool.grant(&before, &qs),
        Err(GrantError::Unavailable)
    ));
    // Purge and reuse go on without the device.
    drop(after);
    pool.purge();
    let again = allocator_api2::vec![in &pool; 3u8; 20 << 20];
    assert!(again.iter().all(|&b| b == 3));
    assert!(pool.validate());

    // Under RegistrationPolicy::Required, growth after the device died fails (null, counted).
    let nic = Nic::soft();
    let strict = Pool::with_config(
        &nic.alloc_pd().unwrap(),
        ArenaConfig {
            policy: RegistrationPolicy::Required,
            registration: Registration::Pinned,
            ..cfg()
        },
    )
    .unwrap();
    nic.as_soft().unwrap().inject_event(AsyncEvent::DeviceFatal);
    assert_eq!(strict.poll_device_events(), 1);
    assert!(
        strict
            .alloc(Layout::from_size_align(20 << 20, 8).unwrap())
            .is_null()
    );
    assert!(strict.stats().alloc.failed_allocations >= 1);
}
