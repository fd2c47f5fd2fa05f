//! Retiring a revoked region grant's key: the key dies, and its index stays held — by the
//! region itself, without remote rights and pointed at one dummy page, or by a placeholder
//! region on that page — so that the device does not hand it to a later registration.
//!
//! Contract: [`Grants::retire_region`] kills the key first, then holds the index:
//! - `ibv_rereg_mr(CHANGE_ACCESS | CHANGE_TRANSLATION)` onto [`DUMMY`] with `LOCAL_WRITE`
//!   only (an ODP region keeps its translation: moving it would change its keys on mlx5, and
//!   it pins nothing). A remote access with the old key is then refused (no remote right, and
//!   on the dummy page nothing of the pool's). The region itself holds the index.
//! - Where the device has no `rereg_mr` (`Quirk::ReregUnsupported`, kernel rxe), refuses it,
//!   or answers with an index of its own (it rebuilt the region), the region is deregistered,
//!   which kills the key, and a placeholder region (`LOCAL_WRITE`, the dummy page) takes the
//!   index straight back where the device hands it out again at once (the soft NIC recycles
//!   lowest first, and an mkey cache hands the same key to the next registration of its
//!   size; rxe allocates indices cyclically over `max_mr`, so it does not).
//! - A deregistration the device refuses leaves the key possibly alive: the region comes back
//!   to the caller, which keeps the grant open (fail closed).
//!
//! The bound itself is the key book's (`keybook.rs`): every region key given to a peer stays
//! refused for the key horizon, on every device, whatever happens to the index. Holding the
//! index is what keeps the device from handing the key to a registration that is *not* a
//! grant (the book only checks grants): on a device whose deregistered keys go to a cache
//! with the same key (`Caps::mkey_cache`: mlx5), only holding works. So:
//! - a held index takes a *slot* of its device: at most `max_mr / 4` per device in the
//!   process ([`SLOTS`], [`retired_max`]), so held regions never use up the device's regions,
//!   whatever the number of pools;
//! - where the device has no mkey cache, a revoked region whose device has no slot free is not
//!   held (the book keeps its key refused), held ones are released after the horizon, and a
//!   dropped pool's with it;
//! - where it has one, every region grant takes its slot when issued, kept while its key is
//!   live and while its index is held, and region grants are refused beyond the bound
//!   ([`GrantError::Limit`] `retired regions`), so a held index is never released early; a
//!   dropped pool's held indices stay in the process's [`GRAVES`] until their horizon (the
//!   process's grant clock), with their slots.
//!
//! Invariants: `held` is ordered by the grant count each entry retired at, and
//! `|held| <= retired_max(max_mr)`; `SLOTS[device] == held indices of its pools + its graves
//! (+ live region grants on an mkey-cache device) <= retired_max(max_mr)`.

use super::{GrantError, Grants, keybook};
use crate::nic::quirks::{self, Quirk};
use crate::nic::{Access, Mr, Nic, ReregFlags};
use crate::sys::atfork::ForkLock;
use std::cell::UnsafeCell;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;

/// The page retired regions point at: never read or written through them (no remote rights,
/// and their lkeys are never posted).
#[repr(C, align(4096))]
struct DummyPage(UnsafeCell<[u8; 4096]>);

// SAFETY: nothing reads or writes the page through Rust; it is only an address to register.
unsafe impl Sync for DummyPage {}

static DUMMY: DummyPage = DummyPage(UnsafeCell::new([0; 4096]));

/// What holds a revoked region grant's index: the region moved onto the dummy page, or a
/// placeholder registered there after the region was deregistered.
struct Held {
    mr: Mr,
    placeholder: bool,
}

/// A held index and the grant count it retired at.
struct Entry {
    held: Held,
    at: u64,
}

/// The held indices of a pool's revoked region grants, oldest first, with the grant count
/// they retired at.
#[derive(Default)]
pub(super) struct Retired {
    held: VecDeque<Entry>,
    placeholders: usize,
}

/// A held index whose pool is gone, on a device with an mkey cache: kept until the process's
/// grant clock reaches `until`.
struct Grave {
    mr: Mr,
    until: u64,
}

/// The held indices of dropped pools, on devices with an mkey cache (see the module contract).
static GRAVES: ForkLock<Vec<Grave>> = ForkLock::new(Vec::new());

/// Region slots taken per device (by name): see the module contract.
static SLOTS: ForkLock<BTreeMap<String, usize>> = ForkLock::new(BTreeMap::new());

/// Take a slot of `nic`: for a region grant's key on an mkey-cache device, or to hold an index.
fn take_slot(nic: &Nic) -> bool {
    let caps = nic.caps();
    let mut slots = SLOTS.lock();
    let n = slots.entry(caps.name.clone()).or_insert(0);
    if *n >= retired_max(caps.max_mr) {
        return false;
    }
    *n += 1;
    true
}

/// Give a slot of `nic` back (its key's index is released, or was never held).
fn give_slot(nic: &Nic) {
    if let Some(n) = SLOTS.lock().get_mut(&nic.caps().name) {
        *n = n.saturating_sub(1);
    }
}

/// Give back the slot a region grant not issued took ([`Grants::region_room`]: only on an
/// mkey-cache device).
pub(super) fn give_issue_slot(nic: &Nic) {
    if nic.caps().mkey_cache {
        give_slot(nic);
    }
}

impl Retired {
    /// `(revoked regions still registered on the dummy page, placeholder regions)`.
    pub(super) fn counts(&self) -> (usize, usize) {
        (self.held.len() - self.placeholders, self.placeholders)
    }

    /// The pool is going (its grant clock at `now`): its held indices are released, or kept
    /// in [`GRAVES`] for the rest of their horizon where the device has an mkey cache.
    pub(super) fn bury(&mut self, now: u64, horizon: u64) {
        let clock = keybook::CLOCK.load(Relaxed);
        for e in self.held.drain(..) {
            let left = horizon.saturating_sub(now.saturating_sub(e.at));
            let nic = e.held.mr.pd().nic().clone();
            if !nic.caps().mkey_cache || left == 0 {
                release(e.held.mr);
                give_slot(&nic);
                continue;
            }
            GRAVES.lock().push(Grave {
                mr: e.held.mr,
                until: clock.saturating_add(left),
            });
        }
        self.placeholders = 0;
        sweep_graves();
    }
}

/// Release the graves whose horizon passed.
fn sweep_graves() {
    let now = keybook::CLOCK.load(Relaxed);
    let mut graves = GRAVES.lock();
    if graves.iter().all(|g| g.until > now) {
        return;
    }
    let (gone, kept): (Vec<Grave>, Vec<Grave>) = graves.drain(..).partition(|g| g.until <= now);
    *graves = kept;
    drop(graves);
    for g in gone {
        let nic = g.mr.pd().nic().clone();
        release(g.mr);
        give_slot(&nic);
    }
}

/// Most retired region indices held on any device.
const RETIRED_MAX: usize = 1 << 16;

/// Most retired region indices held per pool on a device with `max_mr` regions.
pub(super) fn retired_max(max_mr: u32) -> usize {
    (max_mr as usize / 4).clamp(1, RETIRED_MAX)
}

impl Grants {
    /// Take a slot of `nic` for a region grant, or refuse it where the device has an mkey
    /// cache and its slots are taken (see the module contract). The caller gives the slot
    /// back ([`give_slot`]) if the grant is not issued.
    pub(super) fn region_room(&self, nic: &Nic) -> Result<(), GrantError> {
        if !nic.caps().mkey_cache || take_slot(nic) {
            return Ok(());
        }
        Err(self.refuse(GrantError::Limit {
            what: "retired regions",
            max: retired_max(nic.caps().max_mr) as u64,
            hint: "on a device with an mkey cache revoked region keys stay held until the key \
                   horizon passes (a quarter of max_mr per device): later grants of any kind \
                   advance it; lower GrantLimits::key_horizon, or use windows (GrantKind::Auto)",
        }))
    }

    /// Kill a revoked region grant's key and hold its index (see the module contract); `slot`:
    /// whether the region has a slot of its device (a region grant's on an mkey-cache
    /// device), else one is taken to hold it, and without one it is not held. `Err` gives the
    /// region back when its key may still work (the slot stays taken).
    pub(super) fn retire_region(&self, mut mr: Mr, slot: bool) -> Result<(), Mr> {
        let (now, horizon) = self.clock();
        let (pd, old) = (mr.pd().clone(), mr.rkey());
        let caps = pd.nic().caps();
        let moved = !quirks::applies(caps, Quirk::ReregUnsupported) && horizon > 0 && {
            let odp = mr.is_odp();
            let (flags, access) = if odp {
                (
                    ReregFlags::CHANGE_ACCESS,
                    Access::LOCAL_WRITE | Access::ON_DEMAND,
                )
            } else {
                (
                    ReregFlags::CHANGE_ACCESS | ReregFlags::CHANGE_TRANSLATION,
                    Access::LOCAL_WRITE,
                )
            };
            // SAFETY: the dummy page is static and writable; no lkey of a retired region is
            // ever posted, and without remote rights no peer reaches it.
            unsafe { mr.rereg(flags, None, DUMMY.0.get().cast(), 4096, access) }.is_ok()
        };
        let nic = pd.nic().clone();
        // No slot to hold it with (a spoiled region on a full mkey-cache device): given back.
        let took = !slot && take_slot(&nic);
        let slot = slot || took;
        let held = if moved && mr.rkey().index() == old.index() && slot {
            Some(Held {
                mr,
                placeholder: false,
            })
        } else {
            // Deregistered (or rebuilt by the driver): the old index went back to the device.
            if let Err(e) = mr.dereg() {
                tracing::warn!(error = %e.error, "rdma_pool: a revoked region grant refused dereg");
                if took {
                    give_slot(&nic);
                }
                return Err(e.mr);
            }
            (horizon > 0 && slot)
                .then(|| placeholder(&pd, old))
                .flatten()
                .map(|mr| Held {
                    mr,
                    placeholder: true,
                })
        };
        let mut r = super::lock(&self.retired);
        match held {
            Some(held) => {
                r.placeholders += held.placeholder as usize;
                r.held.push_back(Entry { held, at: now });
            }
            None if slot => give_slot(&nic),
            None => {}
        }
        // Beyond the bound the oldest goes early (the key book keeps its key refused; on a
        // device with an mkey cache `region_room` refused the grants that would get here);
        // past the horizon, all that passed it.
        let early = r.held.len().saturating_sub(retired_max(caps.max_mr));
        let late = r
            .held
            .iter()
            .skip(early)
            .take_while(|e| now.saturating_sub(e.at) >= horizon)
            .count();
        let released: Vec<Entry> = r.held.drain(..early + late).collect();
        r.placeholders -= released.iter().filter(|e| e.held.placeholder).count();
        drop(r);
        for e in released {
            let of = e.held.mr.pd().nic().clone();
            release(e.held.mr);
            give_slot(&of);
        }
        sweep_graves();
        Ok(())
    }
}

/// Take a fresh region's remote rights at once (its key is one a peer may still hold): moved
/// onto the dummy page where the device can, else deregistered and its index taken back by a
/// placeholder where the device hands it out again at once. What is returned keeps the index
/// out of the device's hands until the caller releases it.
///
/// # Errors
/// [`GrantError::Unavailable`] when it can be neither (the region is dropped: it logs).
pub(super) fn spoil(mut mr: Mr) -> Result<Option<Mr>, GrantError> {
    let caps = mr.pd().nic().caps();
    if !quirks::applies(caps, Quirk::ReregUnsupported) && !mr.is_odp() {
        let flags = ReregFlags::CHANGE_ACCESS | ReregFlags::CHANGE_TRANSLATION;
        // SAFETY: as in `retire_region`: the dummy page is static and writable, and the
        // region, without remote rights, is never posted.
        let to_dummy =
            unsafe { mr.rereg(flags, None, DUMMY.0.get().cast(), 4096, Access::LOCAL_WRITE) };
        if to_dummy.is_ok() {
            return Ok(Some(mr));
        }
    }
    let (pd, key) = (mr.pd().clone(), mr.rkey());
    match mr.dereg() {
        // A placeholder takes the index back where the device hands it out at once.
        Ok(()) => Ok(placeholder(&pd, key)),
        Err(e) => {
            tracing::warn!(error = %e.error, "rdma_pool: a region with a stale key refused dereg");
            drop(e.mr);
            Err(GrantError::Unavailable)
        }
    }
}

/// A region on the dummy page, without remote rights, registered to take `key`'s index back
/// from the device: `Some` when it landed there (the caller holds it).
fn placeholder(pd: &crate::nic::Pd, key: crate::nic::Rkey) -> Option<Mr> {
    // SAFETY: the dummy page is static and writable; the placeholder's lkey is never posted
    // and it has no remote right.
    let mr = unsafe { pd.reg_mr(DUMMY.0.get().cast(), 4096, Access::LOCAL_WRITE) }.ok()?;
    if mr.rkey().index() == key.index() {
        return Some(mr);
    }
    release(mr);
    None
}

/// Give a held index back to the device (a refusal only logs: the region stays registered,
/// and its key, without remote rights, reaches nothing).
pub(super) fn release(mr: Mr) {
    if let Err(e) = mr.dereg() {
        tracing::warn!(error = %e.error, "rdma_pool: a retired region's index could not be released");
    }
}
