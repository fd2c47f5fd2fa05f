//! From an address to its keys on a device: [`Arena::keys_of_on`], [`Arena::sge_of_on`], and
//! the crate's lookups by rail (the rail of a PD, the keys or exposed region on a rail).
//!
//! Contract:
//! - every lookup is O(1), lock-free and allocation-free, like [`Arena::keys_of`]: a compare
//!   with the arena's own device, a scan of [`MAX_RAILS`] slots, one read of the rail's table;
//! - a lookup racing a detach may still return the rail's old keys (which then stop working);
//! - handing out keys freezes them, as on the arena's own device.

use super::MAX_RAILS;
use crate::arena::table::Keys;
use crate::arena::{Arena, Error};
use crate::nic::{Mr, Nic, Pd, Sge};
use std::sync::atomic::Ordering;

impl Arena {
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
    /// # Ok::<(), rdma_pool::PoolError>(())
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
    /// # Ok::<(), rdma_pool::PoolError>(())
    /// ```
    pub fn sge_of_on(&self, buf: &[u8], nic: &Nic) -> Result<Sge, Error> {
        let keys = self
            .keys_of_on(buf.as_ptr(), nic)
            .ok_or(Error::NotRegistered)?;
        crate::arena::lookup::sge_in(&keys, buf)
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
}
