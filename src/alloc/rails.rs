//! The pool on several devices at once (multi-rail): attach and detach PDs, keys per device.
//!
//! Contract: a thin front end over the arena's rails (`arena/rails/`): every block of the
//! pool is registered on every attached device, `keys_of_on` answers per device in O(1)
//! without a lock, and [`Core::keys_of`] keeps meaning the pool's own device. A grant names
//! its device through its QP's PD; a PD with open grants is not detached.

use super::Core;
use crate::arena::{Error, Keys};
use crate::nic::{Nic, Pd, Sge};

impl Core {
    /// Register the whole pool on `pd` too (a PD of another NIC, for a second rail): what is
    /// already committed now, everything later as it is committed. Returns the rail's index.
    ///
    /// # Errors
    /// As [`Arena::attach`](crate::arena::Arena::attach).
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::Pool;
    /// use rdma_pool::nic::Nic;
    /// let (rail0, rail1) = (Nic::soft(), Nic::soft());
    /// let pool = Pool::new(&rail0.alloc_pd()?)?;
    /// pool.attach(&rail1.alloc_pd()?)?;
    /// let v = allocator_api2::vec![in &pool; 7u8; 4096];
    /// let k0 = pool.keys_of_on(v.as_ptr(), &rail0).unwrap(); // each device's own keys
    /// let k1 = pool.keys_of_on(v.as_ptr(), &rail1).unwrap();
    /// assert!(k1.contains(v.as_ptr() as usize, v.len()));
    /// assert_eq!(Some(k0), pool.keys_of(v.as_ptr()));
    /// assert_eq!(pool.stats().rails[0].mrs, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn attach(&self, pd: &Pd) -> Result<usize, Error> {
        self.arena().attach(pd)
    }
    /// The keys of the registration covering `p` on `nic` (the pool's own device or an
    /// attached one); `None` where the pool is not registered on `nic`. O(1), no lock.
    ///
    /// # Examples
    /// ```
    /// # use rdma_pool::Pool;
    /// # use rdma_pool::nic::Nic;
    /// let nic = Nic::soft();
    /// let pool = Pool::new(&nic.alloc_pd()?)?;
    /// let b = allocator_api2::boxed::Box::new_in(1u64, &pool);
    /// let p = &*b as *const u64 as *const u8;
    /// assert_eq!(pool.keys_of_on(p, &nic), pool.keys_of(p));
    /// assert_eq!(pool.keys_of_on(p, &Nic::soft()), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn keys_of_on(&self, p: *const u8, nic: &Nic) -> Option<Keys> {
        self.arena().keys_of_on(p, nic)
    }

    /// One SGE for `buf` on `nic`.
    ///
    /// # Errors
    /// As [`Arena::sge_of_on`](crate::arena::Arena::sge_of_on).
    ///
    /// # Examples
    /// ```
    /// # use rdma_pool::Pool;
    /// # use rdma_pool::nic::Nic;
    /// # let (rail0, rail1) = (Nic::soft(), Nic::soft());
    /// # let pool = Pool::new(&rail0.alloc_pd()?)?;
    /// pool.attach(&rail1.alloc_pd()?)?;
    /// let v = allocator_api2::vec![in &pool; 1u8; 100];
    /// assert_eq!(pool.sge_of_on(&v, &rail1)?.length, 100);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sge_of_on(&self, buf: &[u8], nic: &Nic) -> Result<Sge, Error> {
        self.arena().sge_of_on(buf, nic)
    }

    /// Read the pool's device events (see
    /// [`Arena::poll_device_events`](crate::arena::Arena::poll_device_events)): after a fatal
    /// one the pool calls the device no more and serves memory unregistered. The pool also
    /// reads them whenever it grows. Returns how many were read.
    ///
    /// # Examples
    /// ```
    /// # use rdma_pool::Pool;
    /// use rdma_pool::nic::{AsyncEvent, Nic};
    /// let nic = Nic::soft();
    /// let pool = Pool::new(&nic.alloc_pd()?)?;
    /// nic.as_soft().unwrap().inject_event(AsyncEvent::PortError { port: 1 });
    /// assert_eq!(pool.poll_device_events(), 1);
    /// assert_eq!(pool.stats().alloc.arena.port_errors, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn poll_device_events(&self) -> usize {
        self.arena().poll_device_events()
    }
}
