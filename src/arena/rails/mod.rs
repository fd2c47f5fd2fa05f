//! Rails: the arena registered on more than one device at once (multi-rail), with keys per
//! device.
//!
//! Contract:
//! - besides the arena's own PD, up to [`MAX_RAILS`] PDs (of other devices, or other PDs of
//!   the same device) are *attached*; each rail keeps a slab → registration table of its own
//!   (`table.rs`), so [`Arena::keys_of_on`] is O(1), lock-free and allocation-free like
//!   [`Arena::keys_of`], and no key of one device ever depends on another;
//! - each rail registers in its own mode, by its own device's caps and quirks under the
//!   arena's [`Registration`](super::Registration) (`register.rs`): ODP, one region per chunk
//!   (and per run larger than a chunk), or pinned, **one region per run** — every run the arena
//!   hands out lies inside one registration on every rail, so any block is one SGE on every
//!   device; a refused pinned registration falls back to the rail's ODP region where ODP is
//!   usable there, else the run is unregistered *on that rail* (`keys_of_on` → `None`,
//!   counted in [`RailStats`]); a rail never fails a run (the arena's own device decides that);
//! - attaching registers every run already committed and live (runs are found by their head
//!   slab, `purge.rs`'s `RUN_HEAD`); detaching deregisters everything on the rail; neither
//!   touches the keys of any other device;
//! - a purge takes the slabs out of every pinned rail region before their pages are dropped:
//!   a region wholly inside the purged slabs is deregistered; one that also covers live slabs
//!   is split while its keys were never handed out, else the purge of those slabs is refused;
//!   a revival registers them again; ODP rail regions stay, like the arena's own;
//! - pages of the arena are given back (`discard.rs`) only while no rail is attached: a
//!   discard counts itself in `discarding` and then looks for rails, an attach publishes its
//!   rail and then waits for `discarding == 0` before it pins anything (both `SeqCst`: one of
//!   the two sees the other), a detach publishes its rail free only once its regions are gone
//!   (and none ever again if one could not be deregistered), so no pinned rail region ever
//!   holds a page dropped under it;
//! - one mutex serialises every change to the rails (attach, detach, registration, purge); it
//!   is held across NIC calls but never together with the arena's state lock, and nothing here
//!   allocates through the global allocator (tables are mapped from the kernel).
//!
//! Invariant (checked by [`Arena::validate`]): on every attached rail, every slab its table
//! maps lies in a live region of that rail covering it, and no pinned rail region covers a
//! purged slab.
//!
//! Files: the rail slots, their lock and configuration, [`Arena::rail_stats`] and the
//! invariant (`mod.rs`); attach and detach (`attach.rs`); the lookups by device and by rail
//! (`lookup.rs`); registration of runs on every rail as they are committed, purged and revived
//! (`regions.rs`).

mod attach;
mod lookup;
mod regions;

use super::register::{ModeReason, RegMode};
use super::table::Table;
use super::{Arena, SLAB_SHIFT};
use crate::nic::{Access, Pd};
use crate::sys::atfork::{ForkGuard, ForkLock};
use crate::sys::os::MmapArray;
use std::cell::UnsafeCell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Most devices (PDs) an arena is attached to besides its own.
pub const MAX_RAILS: usize = 4;

const R: Ordering = Ordering::Relaxed;

/// What one rail (an attached PD) holds, as [`Arena::rail_stats`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RailStats {
    /// The rail's index (what [`Arena::attach`] returned).
    pub index: usize,
    /// The device's name.
    pub device: String,
    /// Pinned or ODP regions on this device.
    pub mode: RegMode,
    /// Why that mode.
    pub mode_reason: ModeReason,
    /// Bytes covered by this rail's live regions.
    pub registered_bytes: u64,
    /// Bytes in use that this rail could not register (`keys_of_on` is `None` for them).
    pub unregistered_bytes: u64,
    /// Live regions on this rail.
    pub mrs: u64,
    /// Registrations refused on this rail (fell back to ODP, or left unregistered there).
    pub degradations: u64,
    /// Purges refused because a region of this rail whose keys were handed out also covers
    /// live memory.
    pub purges_refused: u64,
}

/// What is set under the rails' lock only.
#[derive(Default)]
struct Conf {
    pd: Option<Pd>,
    mode: RegMode,
    reason: ModeReason,
    odp_usable: bool,
    access: Access,
}

#[derive(Default)]
struct Counters {
    registered_bytes: AtomicU64,
    unregistered_bytes: AtomicU64,
    mrs: AtomicU64,
    degradations: AtomicU64,
    purges_refused: AtomicU64,
}

/// A rail's tables, mapped on first attach and kept (reused) until the arena is dropped.
struct Tables {
    table: Table,
    /// `id + 1` of the rail's ODP region per chunk, 0 for none.
    chunk_odp: MmapArray<AtomicU32>,
}

#[derive(Default)]
struct Rail {
    /// `Nic::device_id` of the attached device, 0 while the slot is free.
    device: AtomicUsize,
    /// `Pd::id` of the attached PD, 0 while the slot is free.
    pd: AtomicUsize,
    conf: UnsafeCell<Conf>,
    tables: OnceLock<Tables>,
    c: Counters,
}

/// The rails of an arena (see the module contract).
#[derive(Default)]
pub(crate) struct Rails {
    lock: ForkLock<()>,
    slots: [Rail; MAX_RAILS],
    /// Threads giving pages of the arena back right now ([`Rails::without_rails`]).
    discarding: AtomicUsize,
    /// A rail region the device refused to deregister was dropped (leaked, maybe still
    /// pinning its pages): no page of the arena is given back from then on.
    pinned_leak: std::sync::atomic::AtomicBool,
}

// SAFETY: `conf` is read and written only under `lock`; everything else is atomic or
// `OnceLock`, and `Table` is `Sync`.
unsafe impl Sync for Rails {}
// SAFETY: as above; a `Pd` is `Send`.
unsafe impl Send for Rails {}

/// The rails' lock, held: the only way to reach a rail's configuration.
struct Held<'a> {
    rails: &'a Rails,
    _g: ForkGuard<'a, ()>,
}

impl Held<'_> {
    fn conf(&self, r: usize) -> &Conf {
        // SAFETY: the lock is held: no one writes `conf` meanwhile.
        unsafe { &*self.rails.slots[r].conf.get() }
    }

    #[allow(clippy::mut_from_ref)]
    fn conf_mut(&self, r: usize) -> &mut Conf {
        // SAFETY: the lock is held, and callers hold no other reference to this `conf`.
        unsafe { &mut *self.rails.slots[r].conf.get() }
    }

    /// The attached rails' indices.
    fn attached(&self) -> impl Iterator<Item = usize> + '_ {
        (0..MAX_RAILS).filter(|&r| self.rails.slots[r].pd.load(R) != 0)
    }
}

impl Rails {
    fn hold(&self) -> Held<'_> {
        Held {
            rails: self,
            _g: self.lock.lock(),
        }
    }

    fn table(&self, r: usize) -> Option<&Table> {
        self.slots.get(r)?.tables.get().map(|t| &t.table)
    }

    /// Whether any rail is attached (one load per slot).
    pub(super) fn any(&self) -> bool {
        self.slots.iter().any(|s| s.pd.load(R) != 0)
    }

    /// Run `give_back` (which drops pages of the arena) only while no rail is attached, and
    /// keep any attach from pinning until it returns: false, without running it, when a rail
    /// is attached. See the module contract for the pairing with [`Arena::attach`].
    pub(crate) fn without_rails(&self, give_back: impl FnOnce() -> bool) -> bool {
        struct Out<'a>(&'a AtomicUsize);
        impl Drop for Out<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.discarding.fetch_add(1, Ordering::SeqCst);
        let _out = Out(&self.discarding);
        !self.slots.iter().any(|s| s.pd.load(Ordering::SeqCst) != 0)
            && !self.pinned_leak.load(Ordering::SeqCst)
            && give_back()
    }

    /// Wait, after a rail was published, until no thread is inside [`Rails::without_rails`]:
    /// false after `DISCARD_WAIT` (a thread stopped inside, e.g. by a fork that did not drain).
    fn discards_drained(&self) -> bool {
        const DISCARD_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
        let start = std::time::Instant::now();
        while self.discarding.load(Ordering::SeqCst) != 0 {
            if start.elapsed() > DISCARD_WAIT {
                return false;
            }
            std::thread::yield_now();
        }
        true
    }

    /// Drop every rail's regions (the arena is being dropped).
    pub(crate) fn drop_all(&mut self) {
        for slot in &mut self.slots {
            if let Some(t) = slot.tables.get_mut() {
                t.table.drop_all();
            }
        }
    }
}

impl Arena {
    /// What each attached rail holds.
    ///
    /// # Examples
    /// ```
    /// # use rdma_pool::arena::{Arena, ArenaConfig, Hugepages, RegMode};
    /// # use rdma_pool::nic::Nic;
    /// # let (a, b) = (Nic::soft(), Nic::soft());
    /// # let cfg = ArenaConfig { reserve: 1 << 30, chunk: 1 << 26, hugepages: Hugepages::Off, ..Default::default() };
    /// # let arena = Arena::new(&a.alloc_pd()?, cfg)?;
    /// arena.alloc_run(3 << 20, 64)?;
    /// arena.attach(&b.alloc_pd()?)?;
    /// let rails = arena.rail_stats();
    /// assert_eq!(rails.len(), 1);
    /// assert_eq!((rails[0].mode, rails[0].registered_bytes, rails[0].mrs), (RegMode::Pinned, 4 << 20, 1));
    /// # Ok::<(), rdma_pool::PoolError>(())
    /// ```
    pub fn rail_stats(&self) -> Vec<RailStats> {
        let held = self.rails.hold();
        held.attached()
            .map(|r| {
                let conf = held.conf(r);
                let c = &self.rails.slots[r].c;
                RailStats {
                    index: r,
                    device: conf
                        .pd
                        .as_ref()
                        .map(|pd| pd.nic().caps().name.clone())
                        .unwrap_or_default(),
                    mode: conf.mode,
                    mode_reason: conf.reason,
                    registered_bytes: c.registered_bytes.load(R),
                    unregistered_bytes: c.unregistered_bytes.load(R),
                    mrs: c.mrs.load(R),
                    degradations: c.degradations.load(R),
                    purges_refused: c.purges_refused.load(R),
                }
            })
            .collect()
    }

    /// The invariant of the module contract, for [`Arena::validate`].
    pub(crate) fn rails_valid(&self) -> bool {
        let n = self.span() >> SLAB_SHIFT;
        (0..MAX_RAILS).all(|r| {
            let Some(t) = self.rails.table(r) else {
                return true;
            };
            t.validate()
                && (0..n).all(|i| {
                    !self.is_purged((self.base + (i << SLAB_SHIFT)) as *const u8)
                        || t.reg_at(i).is_none_or(|id| t.reg(id).is_odp())
                })
        })
    }
}
