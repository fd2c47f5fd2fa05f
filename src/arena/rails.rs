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
//! - one mutex serialises every change to the rails (attach, detach, registration, purge); it
//!   is held across NIC calls but never together with the arena's state lock, and nothing here
//!   allocates through the global allocator (tables are mapped from the kernel).
//!
//! Invariant (checked by [`Arena::validate`]): on every attached rail, every slab its table
//! maps lies in a live region of that rail covering it, and no pinned rail region covers a
//! purged slab.

use super::register::{self, ModeReason, RegMode};
use super::table::{Keys, Table};
use super::{Arena, Error, SLAB_SHIFT};
use crate::nic::{Access, Mr, Nic, Pd, Sge};
use crate::sys::atfork::{ForkGuard, ForkLock};
use crate::sys::os::MmapArray;
use crate::sys::provision;
use std::cell::UnsafeCell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering, fence};

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
    /// the arena's own provisioning. Registrations the device refuses are not errors: they are
    /// counted in [`RailStats`].
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
    /// # Ok::<(), rdma_pool::arena::Error>(())
    /// ```
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
            let table = Table::new(self.base, self.window).map_err(os)?;
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
    /// # Examples
    /// ```
    /// # use rdma_pool::arena::{Arena, ArenaConfig, Hugepages};
    /// # use rdma_pool::nic::Nic;
    /// # let (a, b) = (Nic::soft(), Nic::soft());
    /// # let cfg = ArenaConfig { reserve: 1 << 30, chunk: 1 << 26, hugepages: Hugepages::Off, ..Default::default() };
    /// # let arena = Arena::new(&a.alloc_pd()?, cfg)?;
    /// let pd_b = b.alloc_pd()?;
    /// arena.attach(&pd_b)?;
    /// let run = arena.alloc_run(4096, 64)?;
    /// let on_a = arena.keys_of(run.as_ptr());
    /// arena.detach(&pd_b)?;
    /// assert_eq!(arena.keys_of_on(run.as_ptr(), &b), None);
    /// assert_eq!(arena.keys_of(run.as_ptr()), on_a);
    /// assert!(arena.detach(&pd_b).is_err());
    /// # Ok::<(), rdma_pool::arena::Error>(())
    /// ```
    pub fn detach(&self, pd: &Pd) -> Result<(), Error> {
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
        slot.pd.store(0, Ordering::Release);
        let mut first_err = None;
        if let Some(t) = slot.tables.get() {
            // SAFETY: the rails' lock excludes every other writer; grants on this rail hold
            // no region reference past their own call (the pool refuses to detach a PD with
            // open grants).
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

    /// The keys of the registration covering `ptr` on `nic` (the arena's own device, or an
    /// attached one), and its range; `None` for a device the arena is not registered on, a
    /// pointer outside the arena, or memory that device could not register. O(1), lock-free
    /// and allocation-free. Handing out keys freezes them, as [`Arena::keys_of`] does.
    ///
    /// # Examples
    /// ```
    /// # use rdma_pool::arena::{Arena, ArenaConfig, Hugepages};
    /// # use rdma_pool::nic::Nic;
    /// # let (a, b) = (Nic::soft(), Nic::soft());
    /// # let cfg = ArenaConfig { reserve: 1 << 30, chunk: 1 << 26, hugepages: Hugepages::Off, ..Default::default() };
    /// # let arena = Arena::new(&a.alloc_pd()?, cfg)?;
    /// let run = arena.alloc_run(4096, 64)?;
    /// assert_eq!(arena.keys_of_on(run.as_ptr(), &a), arena.keys_of(run.as_ptr()));
    /// assert_eq!(arena.keys_of_on(run.as_ptr(), &b), None); // not attached
    /// # Ok::<(), rdma_pool::arena::Error>(())
    /// ```
    #[inline]
    pub fn keys_of_on(&self, ptr: *const u8, nic: &Nic) -> Option<Keys> {
        let dev = nic.device_id();
        if dev == self.device {
            return self.keys_of(ptr);
        }
        self.keys_of_rail(ptr, self.rail_of_device(dev)?)
    }

    /// One SGE for `buf` on `nic` (its lkey there).
    ///
    /// # Errors
    /// As [`Arena::sge_of`]: [`Error::NotRegistered`] also when the arena is not registered
    /// on `nic`.
    ///
    /// # Examples
    /// ```
    /// # use rdma_pool::arena::{Arena, ArenaConfig, Hugepages};
    /// # use rdma_pool::nic::Nic;
    /// # let (a, b) = (Nic::soft(), Nic::soft());
    /// # let cfg = ArenaConfig { reserve: 1 << 30, chunk: 1 << 26, hugepages: Hugepages::Off, ..Default::default() };
    /// # let arena = Arena::new(&a.alloc_pd()?, cfg)?;
    /// arena.attach(&b.alloc_pd()?)?;
    /// let run = arena.alloc_run(4096, 64)?;
    /// // SAFETY: the run is ours while the arena lives.
    /// let buf = unsafe { std::slice::from_raw_parts(run.as_ptr(), 512) };
    /// assert_eq!(arena.sge_of_on(buf, &b)?.lkey, arena.keys_of_on(run.as_ptr(), &b).unwrap().lkey);
    /// # Ok::<(), rdma_pool::arena::Error>(())
    /// ```
    pub fn sge_of_on(&self, buf: &[u8], nic: &Nic) -> Result<Sge, Error> {
        let keys = self
            .keys_of_on(buf.as_ptr(), nic)
            .ok_or(Error::NotRegistered)?;
        super::sge_in(&keys, buf)
    }

    /// The rail whose device is `dev`, if one is attached.
    fn rail_of_device(&self, dev: usize) -> Option<usize> {
        (0..MAX_RAILS).find(|&r| self.rails.slots[r].device.load(Ordering::Acquire) == dev)
    }

    /// The rail `pd` is attached as (`None` for the arena's own PD or a foreign one).
    pub(crate) fn rail_of_pd(&self, pd: &Pd) -> Option<usize> {
        let id = pd.id();
        (0..MAX_RAILS).find(|&r| self.rails.slots[r].pd.load(Ordering::Acquire) == id)
    }

    /// The keys covering `ptr` on rail `r` (`None` for the arena's own device: use
    /// [`Arena::keys_of`]).
    pub(crate) fn keys_of_rail(&self, ptr: *const u8, r: usize) -> Option<Keys> {
        self.rails.table(r)?.keys_of(ptr as usize)
    }

    /// The region covering `ptr` on rail `r`, exposed (what grants bind windows to).
    pub(crate) fn exposed_region_on(&self, ptr: usize, r: Option<usize>) -> Option<&Mr> {
        match r {
            None => self.exposed_region(ptr),
            Some(r) => self.rails.table(r)?.exposed_region(ptr),
        }
    }

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
    /// # Ok::<(), rdma_pool::arena::Error>(())
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

    /// Register the run `[addr, addr + len)` just committed (clearing its `PENDING` mark) or
    /// revived on every rail.
    pub(crate) fn rails_register(&self, addr: usize, len: usize) {
        let (s, e) = (self.slab_index(addr), self.slab_index(addr + len));
        self.unpend(s, e - s);
        // Pairs with the fence in `attach`: either the attach sees the run in use (and
        // registers it), or this thread sees the rail (and registers it, after the walk).
        fence(Ordering::SeqCst);
        if !self.rails.any() {
            return;
        }
        let held = self.rails.hold();
        for r in held.attached() {
            self.rail_cover(&held, r, s, e);
        }
    }

    /// Take slabs `[s, e)`, about to be purged, out of every pinned rail region. `false`:
    /// refused (a region whose keys were handed out also covers live slabs, or a device
    /// refused a deregistration); whatever was taken out is registered again then.
    pub(crate) fn rails_unregister(&self, s: usize, e: usize) -> bool {
        // Pairs with the fence in `attach` (the slabs are BUSY by now).
        fence(Ordering::SeqCst);
        if !self.rails.any() {
            return true;
        }
        let held = self.rails.hold();
        // First look, change nothing: a shared, exposed pinned region refuses the purge.
        for r in held.attached() {
            let Some(t) = self.rails.table(r) else {
                continue;
            };
            let mut i = s;
            while i < e {
                let Some(id) = t.reg_at(i) else {
                    i += 1;
                    continue;
                };
                let reg = t.reg(id);
                let (rs, re) = self.reg_slabs(reg.range());
                if !reg.is_odp() && reg.is_exposed() && (rs < s || re > e) {
                    self.rails.slots[r].c.purges_refused.fetch_add(1, R);
                    return false;
                }
                i = re.max(i + 1);
            }
        }
        for r in held.attached() {
            if !self.rail_unregister(&held, r, s, e) {
                for r in held.attached() {
                    self.rail_cover(&held, r, s, e);
                }
                return false;
            }
        }
        true
    }

    /// Register slabs `[s, e)` on every rail again after the arena refused their purge.
    pub(crate) fn rails_recover(&self, s: usize, e: usize) {
        if !self.rails.any() {
            return;
        }
        let held = self.rails.hold();
        for r in held.attached() {
            self.rail_cover(&held, r, s, e);
        }
    }

    fn reg_slabs(&self, (start, len): (usize, usize)) -> (usize, usize) {
        let rs = self.slab_index(start);
        (rs, rs + (len >> SLAB_SHIFT))
    }

    /// Register every maximal group of slabs in `[s, e)` that rail `r` does not cover.
    fn rail_cover(&self, held: &Held<'_>, r: usize, s: usize, e: usize) {
        let Some(t) = self.rails.table(r) else {
            return;
        };
        let mut i = s;
        while i < e {
            if t.reg_at(i).is_some() {
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < e && t.reg_at(j).is_none() {
                j += 1;
            }
            self.rail_register(held, r, i, j);
            i = j;
        }
    }

    /// Register slabs `[s, e)` (one run, or a part of one) on rail `r` as its mode says.
    fn rail_register(&self, held: &Held<'_>, r: usize, s: usize, e: usize) {
        let Some(tables) = self.rails.slots[r].tables.get() else {
            return;
        };
        let conf = held.conf(r);
        let c = &self.rails.slots[r].c;
        let Some(pd) = conf.pd.as_ref() else { return };
        let addr = self.base + (s << SLAB_SHIFT);
        let len = (e - s) << SLAB_SHIFT;
        let chunk = self.chunk_of(addr as *const u8).unwrap_or(0);
        let dedicated = self.chunk_of((addr + len - 1) as *const u8) != Some(chunk);
        let odp = || -> Result<u32, Error> {
            if !dedicated {
                if let Some(id) = tables
                    .chunk_odp
                    .get(chunk)
                    .and_then(|v| v.load(R).checked_sub(1))
                {
                    return Ok(id);
                }
            }
            let (oa, ol) = if dedicated {
                (addr, len)
            } else {
                (self.chunk_base(chunk), self.chunk_size())
            };
            // SAFETY: the range is the arena's own mapping (opened chunks), which outlives
            // every region over it; ODP needs no pages present.
            let mr = unsafe { pd.reg_mr(oa as *mut u8, ol, conf.access | Access::ON_DEMAND) }?;
            let id = Self::rail_install(&tables.table, mr)?;
            c.mrs.fetch_add(1, R);
            if !dedicated {
                if let Some(v) = tables.chunk_odp.get(chunk) {
                    v.store(id + 1, R);
                }
            }
            Ok(id)
        };
        let pinned = || -> Result<u32, Error> {
            // SAFETY: committed arena memory, mapped until the arena (which owns every
            // region of every rail) is dropped.
            let mr = unsafe { pd.reg_mr(addr as *mut u8, len, conf.access) }?;
            let id = Self::rail_install(&tables.table, mr)?;
            c.mrs.fetch_add(1, R);
            Ok(id)
        };
        let got = match conf.mode {
            RegMode::Odp => odp(),
            RegMode::Pinned => pinned().or_else(|e| {
                c.degradations.fetch_add(1, R);
                if conf.odp_usable { odp() } else { Err(e) }
            }),
        };
        match got {
            Ok(id) => {
                tables.table.publish(s, e - s, Some(id));
                c.registered_bytes.fetch_add(len as u64, R);
            }
            Err(err) => {
                if conf.mode == RegMode::Odp {
                    c.degradations.fetch_add(1, R);
                }
                c.unregistered_bytes.fetch_add(len as u64, R);
                tracing::warn!(
                    target: "rdma_pool::arena",
                    rail = r as u64,
                    error = %err,
                    bytes = len as u64,
                    "a rail refused a registration: the memory has no keys on that device"
                );
            }
        }
    }

    fn rail_install(table: &Table, mr: Mr) -> Result<u32, Error> {
        let Some(id) = table.new_reg() else {
            return Err(Error::Config("rail registration table full"));
        };
        // SAFETY: an id not in use: not live, and only this thread (under the rails' lock)
        // knows it.
        unsafe { table.reg(id).install(mr, false) };
        Ok(id)
    }

    /// Take slabs `[s, e)` out of rail `r`'s pinned regions (checked beforehand: no exposed
    /// region is split). `false` when the device refused a deregistration.
    fn rail_unregister(&self, held: &Held<'_>, r: usize, s: usize, e: usize) -> bool {
        let Some(t) = self.rails.table(r) else {
            return true;
        };
        let c = &self.rails.slots[r].c;
        let mut i = s;
        while i < e {
            let Some(id) = t.reg_at(i) else {
                // Unregistered on this rail: no longer counted once purged.
                let mut j = i + 1;
                while j < e && t.reg_at(j).is_none() {
                    j += 1;
                }
                let bytes = ((j - i) << SLAB_SHIFT) as u64;
                let _ = c
                    .unregistered_bytes
                    .fetch_update(R, R, |v| Some(v.saturating_sub(bytes)));
                i = j;
                continue;
            };
            let reg = t.reg(id);
            let (rs, re) = self.reg_slabs(reg.range());
            if reg.is_odp() {
                i = re.min(e).max(i + 1);
                continue;
            }
            t.publish(rs, re - rs, None);
            // SAFETY: no slot points at the region any more and the rails' lock excludes
            // every other writer; no grant holds it (grants keep their memory live, and live
            // memory is never purged).
            let mr = unsafe { reg.take() };
            if let Err(refused) = mr.dereg() {
                // SAFETY: taken out above; not live.
                unsafe { reg.install(refused.mr, false) };
                t.publish(rs, re - rs, Some(id));
                return false;
            }
            t.release(id);
            c.mrs.fetch_sub(1, R);
            c.registered_bytes
                .fetch_sub(((re - rs) << SLAB_SHIFT) as u64, R);
            // The live parts of a split region: registered anew (checked: never exposed).
            for (a, b) in [(rs, s), (e, re)] {
                if a < b {
                    self.rail_register(held, r, a, b);
                }
            }
            i = re.max(i + 1);
        }
        true
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
