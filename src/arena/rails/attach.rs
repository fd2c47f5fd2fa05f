//! Attaching the arena to another device's PD, and detaching it: [`Arena::attach`] and
//! `Arena::detach` (crate-private: `Pool::detach` is the public way).
//!
//! Contract (see the module contract in `mod.rs`):
//! - attaching takes a free rail slot, chooses the rail's registration mode by its own device's
//!   caps under the arena's `Registration`, maps the rail's tables on first use (kept until the
//!   arena is dropped), then registers every run already committed and live, walking runs by
//!   their head slab; a run still `PENDING` is left to its committing thread (`regions.rs`);
//! - detaching deregisters everything on the rail and frees its slot; a region the device
//!   refuses to deregister is dropped anyway and the first error returned;
//! - neither touches the keys of any other device, both run under the rails' lock and refuse
//!   to run inside the arena's own provisioning.

use super::{Conf, MAX_RAILS, R, Tables};
use crate::arena::register;
use crate::arena::table::{Budget, Table};
use crate::arena::{Arena, Error, SLAB_SHIFT};
use crate::nic::{Access, Pd};
use crate::sys::os::MmapArray;
use crate::sys::provision;
use std::sync::atomic::{Ordering, fence};

impl Arena {
    /// Register the arena on `pd` too (a PD of another device, for multi-rail, or another PD
    /// of the same device): every run already handed out is registered there now, every later
    /// one when it is committed. Returns the rail's index. Keys on the arena's own device (and
    /// on other rails) do not change.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for the arena's own PD or a PD already attached;
    /// [`Error::Config`] when [`MAX_RAILS`] rails are attached, or the arena asks for ODP
    /// registration and this device has no ODP for the operations the pool needs;
    /// [`Error::Os`] when the rail's tables cannot be mapped; [`Error::Reentrant`] from inside
    /// the arena's own provisioning; [`Error::Busy`] when pages being given back (an ODP
    /// arena's purge) were still being dropped 2 s after the rail was published (only after a
    /// `fork` that did not drain the pool): nothing was attached. Registrations the device
    /// refuses are not errors: they are counted in [`RailStats`].
    ///
    /// # Examples
    /// ```
    /// # use rdma_pool::arena::{Arena, ArenaConfig, Hugepages};
    /// use rdma_pool::nic::Nic;
    /// let (a, b) = (Nic::soft(), Nic::soft());
    /// # let cfg = ArenaConfig { reserve: 1 << 30, chunk: 1 << 26, hugepages: Hugepages::Off, ..Default::default() };
    /// let arena = Arena::new(&a.alloc_pd()?, cfg)?;
    /// let run = arena.alloc_run(4096, 64)?;
    /// let rail = arena.attach(&b.alloc_pd()?)?; // registers `run` on `b` too
    /// assert_eq!(rail, 0);
    /// let on_b = arena.keys_of_on(run.as_ptr(), &b).unwrap(); // `b`'s own keys
    /// assert!(on_b.contains(run.as_ptr() as usize, run.len()));
    /// assert_eq!(arena.rail_stats()[0].registered_bytes, run.len() as u64);
    /// # Ok::<(), rdma_pool::PoolError>(())
    /// ```
    ///
    /// [`RailStats`]: super::RailStats
    pub fn attach(&self, pd: &Pd) -> Result<usize, Error> {
        if provision::active() {
            return Err(Error::Reentrant);
        }
        let _mark = provision::Provisioning::enter();
        let _inside = crate::sys::atfork::inside();
        if pd == &self.pd {
            return Err(Error::InvalidArgument("the arena's own PD is not a rail"));
        }
        let held = self.rails.hold();
        if held
            .attached()
            .any(|r| held.conf(r).pd.as_ref() == Some(pd))
        {
            return Err(Error::InvalidArgument("PD already attached"));
        }
        let r = (0..MAX_RAILS)
            .find(|&r| self.rails.slots[r].pd.load(R) == 0)
            .ok_or(Error::Config("every rail slot is taken (MAX_RAILS)"))?;
        let caps = pd.nic().caps();
        let (mode, reason, odp_usable) = register::choose_mode(self.asked, caps, self.remote)?;
        let slot = &self.rails.slots[r];
        if slot.tables.get().is_none() {
            let os = |errno| Error::Os {
                what: "mmap of a rail's tables",
                errno,
            };
            let table = Table::new(self.base, self.window, 0, Budget::none()).map_err(os)?;
            // SAFETY: an all-zero AtomicU32 is a valid "no ODP region".
            let chunk_odp = unsafe { MmapArray::zeroed(self.window_chunks()) }.map_err(os)?;
            let _ = slot.tables.set(Tables { table, chunk_odp });
        }
        let mut access = Access::LOCAL_WRITE | self.remote;
        if caps.mw_type1 || caps.mw_type2 {
            access |= Access::MW_BIND;
        }
        *held.conf_mut(r) = Conf {
            pd: Some(pd.clone()),
            mode,
            reason,
            odp_usable,
            access,
        };
        // Visible to committing threads before the walk (see `rails_register`): a run still
        // `PENDING`, or being purged or revived, is left to its thread, which waits for the
        // lock and registers it on this rail too.
        slot.pd.store(pd.id(), Ordering::SeqCst);
        fence(Ordering::SeqCst);
        // No page is being given back under what this rail is about to pin (see the module
        // contract): a discard that missed the rail finishes first.
        if !self.rails.discards_drained() {
            slot.pd.store(0, Ordering::SeqCst);
            *held.conf_mut(r) = Conf::default();
            return Err(Error::Busy(
                "pages of the arena were being given back for over 2 s",
            ));
        }
        // Register what is in use: units are runs (broken at run heads and at slabs not in
        // use), so every block lies in one region.
        let n = self.span() >> SLAB_SHIFT;
        let mut i = 0;
        while i < n {
            if !self.slab_in_use(i) {
                i += 1;
                continue;
            }
            let mut e = i + 1;
            while e < n && self.slab_in_use(e) && !self.is_run_head(e) {
                e += 1;
            }
            self.rail_register(&held, r, i, e);
            i = e;
        }
        slot.device.store(pd.nic().device_id(), Ordering::Release);
        tracing::info!(
            target: "rdma_pool::arena",
            rail = r as u64,
            device = %caps.name,
            mode = ?mode,
            reason = reason.as_str(),
            "arena attached to another device"
        );
        Ok(r)
    }

    /// Deregister everything the arena registered on `pd` and free its rail. No key of the
    /// arena's own device or of another rail changes. Keys of this rail stop working;
    /// `keys_of_on` racing the detach may still return them.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `pd` is not attached; [`Error::Reentrant`] from inside
    /// the arena's own provisioning. A region the device refuses to deregister (a window
    /// still bound to it) is dropped anyway, which logs it as leaked, and the first such error
    /// is returned after the rail is freed.
    ///
    /// Crate-private: a region of the rail may be borrowed by a grant being issued, so the
    /// one public way is [`Pool::detach`](crate::Pool::detach), which holds every issue off
    /// and refuses while a grant uses the PD.
    pub(crate) fn detach(&self, pd: &Pd) -> Result<(), Error> {
        if provision::active() {
            return Err(Error::Reentrant);
        }
        let _mark = provision::Provisioning::enter();
        let _inside = crate::sys::atfork::inside();
        let held = self.rails.hold();
        let r = held
            .attached()
            .find(|&r| held.conf(r).pd.as_ref() == Some(pd))
            .ok_or(Error::InvalidArgument("PD not attached"))?;
        let slot = &self.rails.slots[r];
        slot.device.store(0, Ordering::Release);
        let mut first_err = None;
        if let Some(t) = slot.tables.get() {
            // SAFETY: the rails' lock excludes every other writer; grants on this rail hold
            // no region reference past their own call, and none is being issued (the only
            // caller, `Pool::detach`, holds the grants' gate and refuses a PD with open
            // grants).
            unsafe {
                t.table.clear(|mr| {
                    if let Err(e) = mr.dereg() {
                        first_err.get_or_insert(e.error);
                    }
                })
            };
            for c in 0..t.chunk_odp.len() {
                if let Some(v) = t.chunk_odp.get(c) {
                    v.store(0, R);
                }
            }
        }
        // Published free only now: pages are given back (`discard.rs`) only while no rail is
        // attached, and this rail's pinned regions held pages until the clear above. A region
        // the device refused to deregister may pin its pages still: none is given back again.
        if first_err.is_some() {
            self.rails.pinned_leak.store(true, Ordering::SeqCst);
        }
        slot.pd.store(0, Ordering::SeqCst);
        for v in [
            &slot.c.registered_bytes,
            &slot.c.unregistered_bytes,
            &slot.c.mrs,
        ] {
            v.store(0, R);
        }
        *held.conf_mut(r) = Conf::default();
        match first_err {
            Some(e) => Err(Error::Nic(e)),
            None => Ok(()),
        }
    }
}
