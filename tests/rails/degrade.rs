//! Each rail by its own device's caps: modes per device, refusals on one rail only.
//! (Soft NICs configured for the case, in either place.)

use super::*;
use rdma_pool::arena::{ModeReason, Registration};
use rdma_pool::nic::soft::SoftConfig;

pub fn no_odp() -> SoftConfig {
    SoftConfig {
        odp: false,
        implicit_odp: false,
        ..Default::default()
    }
}

#[test]
fn each_rail_registers_in_its_own_devices_mode() {
    let _s = serial();
    let cfg = ArenaConfig {
        registration: Registration::Auto,
        ..config()
    };
    let t = TwoRails::on(Nic::soft(), Nic::soft_with(no_odp()), cfg, true);
    assert_eq!(t.pool.stats().alloc.arena.mode, RegMode::Odp);
    let mut b = allocator_api2::vec![in &t.pool; 0u8; 3 << 20];
    let rail = &t.pool.stats().rails[0];
    assert_eq!(
        (rail.mode, rail.mode_reason),
        (RegMode::Pinned, ModeReason::NoOdp)
    );
    covered(&t.pool, b.as_ptr(), b.len(), &t.s1.nic);
    t.round_trip(0, &mut b, 1);
    t.round_trip(1, &mut b, 2);
    // Asking for ODP on a device without it is a typed refusal, not a silent downgrade.
    let strict = ArenaConfig {
        registration: Registration::Odp,
        ..config()
    };
    let pool = Pool::with_config(&Nic::soft().alloc_pd().unwrap(), strict).unwrap();
    let pd = Nic::soft_with(no_odp()).alloc_pd().unwrap();
    assert!(matches!(pool.attach(&pd), Err(Error::Config(_))));
    assert!(pool.stats().rails.is_empty());
}

#[test]
fn a_refusal_on_one_rail_leaves_the_other_alone() {
    let _s = serial();
    let t = TwoRails::on(Nic::soft(), Nic::soft_with(no_odp()), config(), true);
    let soft1 = t.s1.nic.as_soft().unwrap();
    soft1.fail_next(Verb::RegMr, 1, libc::ENOMEM);
    let mut refused = allocator_api2::vec![in &t.pool; 0u8; 3 << 20];
    // Registered on rail 0, not on rail 1 (no ODP there to fall back to): counted.
    covered(&t.pool, refused.as_ptr(), refused.len(), &t.s0.nic);
    assert_eq!(t.pool.keys_of_on(refused.as_ptr(), &t.s1.nic), None);
    let rail = t.pool.stats().rails[0].clone();
    assert_eq!((rail.degradations, rail.unregistered_bytes), (1, 4 << 20));
    t.round_trip(0, &mut refused, 3);
    // The next run registers on rail 1 again.
    let mut next = allocator_api2::vec![in &t.pool; 0u8; 3 << 20];
    covered(&t.pool, next.as_ptr(), next.len(), &t.s1.nic);
    t.round_trip(1, &mut next, 4);
    // With ODP on the rail, a refused pinned registration falls back to its ODP region.
    let t2 = TwoRails::on(Nic::soft(), Nic::soft(), config(), true);
    t2.s1
        .nic
        .as_soft()
        .unwrap()
        .fail_next(Verb::RegMr, 1, libc::ENOMEM);
    let mut b = allocator_api2::vec![in &t2.pool; 0u8; 3 << 20];
    let k = covered(&t2.pool, b.as_ptr(), b.len(), &t2.s1.nic);
    assert_eq!(k.len, 1 << 24, "the chunk's ODP region on rail 1");
    assert_eq!(t2.pool.stats().rails[0].degradations, 1);
    t2.round_trip(1, &mut b, 5);
    // Purging the refused run forgets it on rail 1 too.
    drop(refused);
    t.pool.purge();
    assert_eq!(t.pool.stats().rails[0].unregistered_bytes, 0);
    assert!(t.pool.validate() && t2.pool.validate());
}

#[test]
fn rails_are_bounded_and_a_pool_drops_cleanly_with_rails_attached() {
    let _s = serial();
    let pool = Pool::with_config(&Nic::soft().alloc_pd().unwrap(), config()).unwrap();
    let b = allocator_api2::vec![in &pool; 0u8; 4096];
    let extra: Vec<(Nic, Pd)> = (0..rdma_pool::arena::MAX_RAILS)
        .map(|_| {
            let n = Nic::soft();
            let pd = n.alloc_pd().unwrap();
            (n, pd)
        })
        .collect();
    for (i, (_, pd)) in extra.iter().enumerate() {
        assert_eq!(pool.attach(pd).unwrap(), i);
    }
    let one_more = Nic::soft().alloc_pd().unwrap();
    assert!(matches!(pool.attach(&one_more), Err(Error::Config(_))));
    for (n, _) in &extra {
        covered(&pool, b.as_ptr(), b.len(), n);
    }
    drop(b);
    let counts: Vec<u64> = extra
        .iter()
        .map(|(n, _)| n.as_soft().unwrap().counters().registrations)
        .collect();
    assert!(counts.iter().all(|&c| c >= 1));
    drop(pool);
    for (n, _) in &extra {
        n.as_soft().unwrap().validate().unwrap();
        assert_eq!(
            n.as_soft().unwrap().pinned_bytes(),
            0,
            "every rail region is gone"
        );
    }
}
