//! The opened device: [`Nic`], the handle every other handle descends from (a PD, a CQ or a
//! UMEM holds a clone of it), and the two device queries that need no handle,
//! [`device_names`] and [`mlx5_load_error`].
//!
//! Contract: a `Nic` is one `Arc` of its backend, so clones are cheap and [`Nic::same_device`]
//! compares identities; the device is closed when the last clone, and the last handle made
//! from it, is dropped (a context attached with [`Nic::from_raw_context`] never is).

use super::backend::Backend;
use super::cq::CqInner;
use super::error::{Error, Result, Verb};
use super::inflight::Inflight;
use super::pd::PdInner;
use super::{Access, AsyncEvent, Caps, CompChannel, Cq, ForkStatus, NicKind, Pd, Umem, soft};
#[cfg(feature = "verbs")]
use super::{VerbsNic, verbs};
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

/// The names of the RDMA devices present (empty when there are none, no RDMA subsystem, or the
/// crate was built without the `verbs` feature).
///
/// # Examples
/// ```
/// for name in rdma_pool::nic::device_names() {
///     println!("RDMA device {name}");
/// }
/// ```
pub fn device_names() -> Vec<String> {
    #[cfg(feature = "verbs")]
    {
        verbs::device_names()
    }
    #[cfg(not(feature = "verbs"))]
    {
        Vec::new()
    }
}

/// Why `libmlx5.so.1` (mlx5 DEVX, needed for [`Nic::umem_reg`] on verbs devices) is unusable in
/// this process, or `None` when it loaded with the symbols rdma-pool needs.
///
/// # Examples
/// ```
/// match rdma_pool::nic::mlx5_load_error() {
///     None => println!("libmlx5 is available"),
///     Some(why) => println!("no DEVX: {why}"),
/// }
/// ```
pub fn mlx5_load_error() -> Option<&'static str> {
    #[cfg(feature = "verbs")]
    {
        verbs::mlx5dv::load_error()
    }
    #[cfg(not(feature = "verbs"))]
    {
        Some("rdma-pool was built without the `verbs` feature")
    }
}

/// An opened RDMA device: the soft NIC or a verbs device. Cheap to clone.
///
/// # Examples
/// ```
/// use rdma_pool::nic::{Nic, NicKind};
/// let nic = Nic::soft();
/// assert_eq!(nic.kind(), NicKind::Soft);
/// assert!(nic.caps().odp.explicit);
/// ```
#[derive(Clone)]
pub struct Nic {
    pub(super) backend: Arc<dyn Backend>,
}

debug_fields!(Nic, |s| { "name": s.caps().name, "kind": s.kind() });

impl Nic {
    /// A new software NIC with the default configuration.
    ///
    /// # Examples
    /// ```
    /// let nic = rdma_pool::nic::Nic::soft();
    /// assert_eq!(nic.caps().driver, "soft");
    /// ```
    pub fn soft() -> Nic {
        Nic::soft_with(soft::SoftConfig::default())
    }

    /// A new software NIC with `config`.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Nic, soft::{SoftConfig, ReregMode}};
    /// let nic = Nic::soft_with(SoftConfig { rereg: ReregMode::Unsupported, ..Default::default() });
    /// assert!(!nic.caps().rereg_mr);
    /// ```
    pub fn soft_with(config: soft::SoftConfig) -> Nic {
        Nic {
            backend: Arc::new(soft::SoftNic::new(config)),
        }
    }

    /// Open the verbs device called `name`.
    ///
    /// # Errors
    /// [`Error::DeviceNotFound`] when there is no such device (or none at all, or the crate was
    /// built without the `verbs` feature), or the failing verb's error.
    ///
    /// # Examples
    /// ```
    /// // There is no device of that name on any machine.
    /// assert!(rdma_pool::nic::Nic::open("no-such-device").is_err());
    /// ```
    pub fn open(name: &str) -> Result<Nic> {
        #[cfg(feature = "verbs")]
        {
            Ok(Nic {
                backend: Arc::new(verbs::VerbsNic::open(Some(name))?),
            })
        }
        #[cfg(not(feature = "verbs"))]
        {
            Err(Error::DeviceNotFound(name.to_owned()))
        }
    }

    /// Open the first verbs device.
    ///
    /// # Errors
    /// [`Error::NoDevice`] when no RDMA device is present.
    ///
    /// # Examples
    /// ```
    /// match rdma_pool::nic::Nic::open_first() {
    ///     Ok(nic) => println!("opened {}", nic.caps().name),
    ///     Err(rdma_pool::nic::Error::NoDevice) => println!("no RDMA device here"),
    ///     Err(e) => println!("device present but failed: {e}"),
    /// }
    /// ```
    pub fn open_first() -> Result<Nic> {
        #[cfg(feature = "verbs")]
        {
            Ok(Nic {
                backend: Arc::new(verbs::VerbsNic::open(None)?),
            })
        }
        #[cfg(not(feature = "verbs"))]
        {
            Err(Error::NoDevice)
        }
    }

    /// The embedded default: a verbs device when one is present, else the soft NIC. The
    /// environment variable `RDMA_POOL_NIC` overrides: `soft`, `verbs` (first device, an error
    /// if none) or a device name. The variable is read on the first call only; later calls
    /// reuse that value. Logs which NIC it picked.
    ///
    /// # Errors
    /// Only when `RDMA_POOL_NIC` is `verbs` or names a device, and that cannot be opened:
    /// [`Error::Env`], naming the variable, its value and why.
    ///
    /// # Examples
    /// ```
    /// let nic = rdma_pool::nic::Nic::open_default().unwrap();
    /// println!("using {:?} {}", nic.kind(), nic.caps().name);
    /// ```
    pub fn open_default() -> Result<Nic> {
        static CHOICE: OnceLock<String> = OnceLock::new();
        let choice = CHOICE.get_or_init(|| std::env::var("RDMA_POOL_NIC").unwrap_or_default());
        let env = |e: Error| Error::Env {
            var: "RDMA_POOL_NIC",
            value: choice.clone(),
            source: Box::new(e),
        };
        let nic = match choice.as_str() {
            "soft" => Nic::soft(),
            "verbs" => Nic::open_first().map_err(env)?,
            "" => match Nic::open_first() {
                Ok(nic) => nic,
                Err(e) => {
                    tracing::info!(reason = %e, "no usable verbs device, using the soft NIC");
                    Nic::soft()
                }
            },
            name => Nic::open(name).map_err(env)?,
        };
        tracing::info!(kind = ?nic.kind(), name = %nic.caps().name, "rdma-pool NIC opened");
        Ok(nic)
    }

    /// True when `other` is a handle to the same opened device.
    ///
    /// # Examples
    /// ```
    /// let (a, b) = (rdma_pool::nic::Nic::soft(), rdma_pool::nic::Nic::soft());
    /// assert!(a.same_device(&a.clone()) && !a.same_device(&b));
    /// ```
    pub fn same_device(&self, other: &Nic) -> bool {
        Arc::ptr_eq(&self.backend, &other.backend)
    }

    /// A number that identifies the opened device while any handle to it lives (what
    /// [`Nic::same_device`] compares), for lock-free lookups.
    pub(crate) fn device_id(&self) -> usize {
        Arc::as_ptr(&self.backend) as *const () as usize
    }

    /// Which backend this is.
    pub fn kind(&self) -> NicKind {
        self.backend.kind()
    }

    /// Whether `fork()` needs care next to this NIC's registered memory
    /// (`ibv_is_fork_initialized(3)`; a soft NIC reports [`soft::SoftConfig::fork`]).
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{ForkStatus, Nic};
    /// assert_eq!(Nic::soft().fork_status(), ForkStatus::Unneeded);
    /// ```
    pub fn fork_status(&self) -> ForkStatus {
        self.backend.fork_status()
    }

    /// The device's next asynchronous event (`ibv_get_async_event(3)`), without blocking:
    /// `Ok(None)` when none is pending. Each event is returned once (and acknowledged). A soft
    /// NIC returns the events injected with [`soft::SoftNic::inject_event`].
    ///
    /// # Errors
    /// The read of the device's event channel failed.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{AsyncEvent, Nic};
    /// let nic = Nic::soft();
    /// assert_eq!(nic.poll_async_event()?, None);
    /// nic.as_soft().unwrap().inject_event(AsyncEvent::PortError { port: 1 });
    /// assert_eq!(nic.poll_async_event()?, Some(AsyncEvent::PortError { port: 1 }));
    /// # Ok::<(), rdma_pool::nic::Error>(())
    /// ```
    pub fn poll_async_event(&self) -> Result<Option<AsyncEvent>> {
        self.backend.poll_async_event()
    }

    /// The device's capabilities and limits.
    pub fn caps(&self) -> &Caps {
        self.backend.caps()
    }

    /// The NUMA node the device is attached to ([`Caps::numa_node`]): `None` when it reports
    /// none (sysfs `-1`, a single-node machine, a soft NIC without
    /// [`soft::SoftConfig::numa_node`]).
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Nic, soft::SoftConfig};
    /// assert_eq!(Nic::soft().numa_node(), None);
    /// let nic = Nic::soft_with(SoftConfig { numa_node: Some(0), ..Default::default() });
    /// assert_eq!(nic.numa_node(), Some(0));
    /// ```
    pub fn numa_node(&self) -> Option<u32> {
        self.caps().numa_node
    }

    /// The soft NIC behind this handle (its counters and fault injection), if it is one.
    ///
    /// # Examples
    /// ```
    /// let nic = rdma_pool::nic::Nic::soft();
    /// assert_eq!(nic.as_soft().unwrap().counters().registrations, 0);
    /// ```
    pub fn as_soft(&self) -> Option<&soft::SoftNic> {
        self.backend.as_any().downcast_ref::<soft::SoftNic>()
    }

    /// The verbs device behind this handle, if it is one.
    ///
    /// # Examples
    /// ```
    /// assert!(rdma_pool::nic::Nic::soft().as_verbs().is_none());
    /// ```
    #[cfg(feature = "verbs")]
    pub fn as_verbs(&self) -> Option<&VerbsNic> {
        self.backend.as_any().downcast_ref::<VerbsNic>()
    }

    /// A NIC on a `struct ibv_context *` the caller opened (for instance with
    /// `mlx5dv_open_device` and DEVX), so that the pool's regions and UMEMs live on the caller's
    /// context. Non-owning: dropping the NIC does not close the context. On an mlx5 device the
    /// context is assumed to have DEVX; if it has not, [`Nic::umem_reg`] fails with the verb's
    /// errno.
    ///
    /// # Errors
    /// [`Error::NoDevice`] without the `verbs` feature; `InvalidArgument` for a null `ctx`;
    /// the failing `ibv_query_device_ex` / `ibv_query_port`.
    ///
    /// # Safety
    /// `ctx` is null or an open `struct ibv_context *` that stays open until the returned `Nic`,
    /// every clone of it and every handle made from it (PDs, regions, windows, CQs, QPs, UMEMs)
    /// are dropped.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Error, Nic};
    /// // SAFETY: null is refused before anything is read.
    /// let e = unsafe { Nic::from_raw_context(std::ptr::null_mut()) }.unwrap_err();
    /// assert!(matches!(e, Error::InvalidArgument { verb: None, .. } | Error::NoDevice));
    /// ```
    pub unsafe fn from_raw_context(ctx: *mut c_void) -> Result<Nic> {
        #[cfg(feature = "verbs")]
        {
            // SAFETY: forwarded from the caller.
            let nic = unsafe { VerbsNic::attach(ctx) }?;
            Ok(Nic {
                backend: Arc::new(nic),
            })
        }
        #[cfg(not(feature = "verbs"))]
        {
            let _ = ctx;
            Err(Error::NoDevice)
        }
    }

    /// The `struct ibv_context *` of a verbs NIC (opened or attached), for creating DEVX objects
    /// on the same context as the pool's UMEMs; `None` on the soft NIC. It is valid while this
    /// NIC (or a handle made from it) lives.
    ///
    /// # Examples
    /// ```
    /// assert!(rdma_pool::nic::Nic::soft().raw_context().is_none());
    /// ```
    pub fn raw_context(&self) -> Option<*mut c_void> {
        #[cfg(feature = "verbs")]
        {
            self.as_verbs().map(VerbsNic::raw_context)
        }
        #[cfg(not(feature = "verbs"))]
        {
            None
        }
    }

    /// Allocate a protection domain.
    ///
    /// # Errors
    /// The `ibv_alloc_pd` failure.
    ///
    /// # Examples
    /// ```
    /// let pd = rdma_pool::nic::Nic::soft().alloc_pd().unwrap();
    /// # drop(pd);
    /// ```
    pub fn alloc_pd(&self) -> Result<Pd> {
        let handle = self.backend.alloc_pd()?;
        Ok(Pd {
            inner: Arc::new(PdInner {
                nic: self.clone(),
                handle,
                owned: true,
            }),
        })
    }

    /// Create a completion queue with room for `depth` completions.
    ///
    /// # Errors
    /// [`Error::Limit`] above `max_cqe`, or the `ibv_create_cq` failure.
    ///
    /// # Examples
    /// ```
    /// let cq = rdma_pool::nic::Nic::soft().create_cq(16).unwrap();
    /// assert!(cq.poll_one().unwrap().is_none());
    /// ```
    pub fn create_cq(&self, depth: u32) -> Result<Cq> {
        self.create_cq_in(depth, None)
    }

    pub(super) fn create_cq_in(&self, depth: u32, channel: Option<&CompChannel>) -> Result<Cq> {
        if depth == 0 {
            return Err(Error::invalid(Verb::CreateCq, "depth must be at least 1"));
        }
        if depth > self.caps().max_cqe {
            return Err(Error::Limit {
                verb: Verb::CreateCq,
                limit: "max_cqe",
                max: self.caps().max_cqe as u64,
            });
        }
        if let Some(c) = channel
            && !self.same_device(c.nic())
        {
            return Err(Error::invalid(
                Verb::CreateCq,
                "completion channel of another device",
            ));
        }
        let handle = self.backend.create_cq(depth, channel.map(|c| c.handle()))?;
        Ok(Cq {
            inner: Arc::new(CqInner {
                nic: self.clone(),
                handle,
                inflight: Inflight::default(),
                channel: channel.cloned(),
                owned: true,
            }),
        })
    }

    /// Register `len` bytes at `addr` as a DEVX UMEM (`mlx5dv_devx_umem_reg_ex`), allowing only
    /// the page sizes whose bits are set in `pgsz_bitmap` (bit n = 2^n bytes).
    ///
    /// # Errors
    /// [`Error::Unsupported`] on a device without DEVX (every non-mlx5 device); `EINVAL` when
    /// no page size of the bitmap fits the buffer's alignment and length.
    ///
    /// # Safety
    /// The memory must stay mapped until the UMEM is dropped, and the device may write to it.
    ///
    /// # Examples
    /// ```
    /// let nic = rdma_pool::nic::Nic::soft();
    /// let mut buf = memmap2::MmapMut::map_anon(1 << 16).unwrap();
    /// // SAFETY: `buf` outlives the UMEM.
    /// let umem = unsafe {
    ///     nic.umem_reg(buf.as_mut_ptr(), buf.len(), rdma_pool::nic::Access::LOCAL_WRITE, 1 << 12)
    /// }.unwrap();
    /// assert!(umem.id() > 0);
    /// ```
    pub unsafe fn umem_reg(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
        pgsz_bitmap: u64,
    ) -> Result<Umem> {
        if len == 0 || addr.is_null() {
            return Err(Error::invalid(Verb::UmemReg, "empty or null range"));
        }
        let (handle, id) = self
            .backend
            .umem_reg(addr as usize, len, access, pgsz_bitmap)?;
        Ok(Umem {
            nic: self.clone(),
            handle,
            id,
            addr: addr as usize,
            len,
        })
    }
}
