//! The NIC boundary: owned RAII handles over one narrow [`backend`](self) trait with two
//! implementations, the in-process [`soft`] NIC and real libibverbs (`verbs`, feature `verbs`).
//!
//! Contract:
//! - every handle owns an `Arc` of its parent's inner (`Mr → Pd → Nic`, `Qp → Cq`), so a parent
//!   is destroyed only after its last child, and every handle tears down in `Drop` without
//!   panicking (a failure there is logged with `tracing`);
//! - argument errors that lose nothing are caught here, before the backend, and reported as
//!   [`Error::InvalidArgument`] / [`ReregErrorKind::Input`]; device limits (`max_mr_size`,
//!   `max_sge`, the `advise_mr` list bound [`MAX_ADVISE_SGES`]) are checked here too and
//!   reported as [`Error::Limit`], as the backends report `max_mr` / `max_mw` (rxe's `EINVAL`
//!   and mlx5's `ENOMEM` alike);
//! - a region whose re-registration ended in `ERR_CMD` is *poisoned*: it can only be dropped.
//!
//! Invariant: `mr.lkey()/rkey()/addr()/len()` always equal what the backend last reported for
//! that region.
//!
//! Public surface: the handles, the plain data of `types.rs`, the errors, [`quirks`], the soft
//! NIC's configuration, counters and fault injection ([`soft`]), and of the verbs backend only
//! [`VerbsNic`] (through [`Nic::as_verbs`]), [`device_names`], [`mlx5_load_error`] and the raw
//! attach points ([`Nic::from_raw_context`], [`Nic::raw_context`], [`Pd::from_raw`]). The
//! backend trait and rdma-sys types stay inside the crate.
//!
//! # Allocation
//! A future arena registers memory from inside `GlobalAlloc`, so it must know which calls may
//! allocate (and so re-enter it) and guard them with a re-entrancy flag. The calls it makes
//! there, and what they allocate:
//! - [`Pd::reg_mr`]: the `Arc` of the new [`Mr`] on every backend. Verbs: on rxe only, an ODP
//!   region's lkey goes into the ODP guard's `HashSet` (which grows now and then); the kernel
//!   verb itself allocates only in the kernel and in the provider (`malloc` of the `ibv_mr`).
//!   Soft NIC: an ODP region's residency bitmaps (a bit per page); for a pinned region, the
//!   text of `/proc/self/maps` (its rights check) and the identities of its pages (8 bytes a
//!   page), and in the mlx5 re-registration model the text of `/proc/self/smaps`.
//! - [`Mr::rereg`]: nothing in this layer. Verbs: nothing (the provider may). Soft NIC: as
//!   `reg_mr` for the new translation.
//! - [`Mr::dereg`] and dropping a [`Mr`]: frees only (the provider frees the `ibv_mr`; the soft
//!   NIC returns the key to a free list whose capacity is reserved up front).
//! - [`Pd::advise_mr`]: verbs converts up to 16 scatter/gather entries on the stack and
//!   allocates a list for more; the soft NIC grows an implicit ODP region's page map and lists
//!   the pages it faults in.
//! - Failures on any backend build an [`Error`]: fixed texts are `&'static str` and allocate
//!   nothing, but [`Error::DeviceNotFound`], the rxe ODP guard's `Unsupported` detail and an
//!   `io::Error` with a custom message do; a failure in `Drop` is logged with `tracing`, whose
//!   subscriber may allocate.
//!
//! Setup calls (opening a NIC, PDs, CQs, QPs) allocate freely and are not made from inside the
//! allocator; they hold the one-time work: [`Nic::open_default`] reads `RDMA_POOL_NIC` once per
//! process, and a soft NIC starts its prefetch thread and reads `CAP_IPC_LOCK` when created.

#[cfg(feature = "tokio")]
mod async_cq;
mod backend;
mod buffer;
mod channel;
mod error;
mod foreign;
mod owned;
mod post;
pub mod quirks;
mod registered;
pub mod soft;
mod srq;
mod types;
#[cfg(feature = "verbs")]
mod verbs;

#[cfg(feature = "tokio")]
pub use async_cq::AsyncCq;
pub use buffer::{Buffer, huge_page_size};
pub use channel::CompChannel;
pub use error::{Error, ReregError, ReregErrorKind, Result, Verb};
pub use owned::{Done, NicBuf, NicBufMut, PostError, Posted, WaitError, is_reserved_wr_id};
pub(crate) use owned::{GRANT_TAG, set_grant_sink};
pub use post::BatchError;
pub use registered::Registered;
pub use srq::{RecvRing, Srq};
pub use types::*;
#[cfg(feature = "verbs")]
pub use verbs::VerbsNic;
#[cfg(feature = "verbs")]
pub(crate) use verbs::set_nonblocking;

use backend::{Backend, RawBind, RawMr, RawSendOp, RawSendWr};
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Implement `Debug` for a handle as a struct named after it with the listed fields.
macro_rules! debug_fields {
    ($ty:ident, |$s:ident| { $($name:literal: $value:expr),* $(,)? }) => {
        impl std::fmt::Debug for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                let $s = self;
                f.debug_struct(stringify!($ty))$(.field($name, &$value))*.finish()
            }
        }
    };
}

/// Finish a handle's destroy verb in `Drop`: never panics; a failure is logged with `tracing`
/// and the object is leaked (the device still holds it).
fn leak_on_error(object: &'static str, handle: u64, result: Result<()>) {
    if let Err(e) = result {
        tracing::error!(error = %e, object, handle, "destroy failed in drop; the object is leaked");
    }
}

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
    backend: Arc<dyn Backend>,
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

    fn create_cq_in(&self, depth: u32, channel: Option<&CompChannel>) -> Result<Cq> {
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
                inflight: owned::Inflight::default(),
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

/// A protection domain. Regions, windows and QPs belong to one.
#[derive(Clone)]
pub struct Pd {
    inner: Arc<PdInner>,
}

struct PdInner {
    nic: Nic,
    handle: u64,
    /// False for a PD adopted with [`Pd::from_raw`]: its owner deallocates it.
    owned: bool,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        if self.owned {
            leak_on_error("PD", self.handle, self.nic.backend.dealloc_pd(self.handle));
        }
    }
}

debug_fields!(Pd, |s| { "handle": s.inner.handle });

impl PartialEq for Pd {
    fn eq(&self, other: &Pd) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Pd {
    /// A PD for a `struct ibv_pd *` the caller allocated on `nic`'s context (see
    /// [`Nic::from_raw_context`]). Non-owning: dropping it does not deallocate the PD.
    ///
    /// # Errors
    /// [`Error::NoDevice`] without the `verbs` feature; `InvalidArgument` for a null `pd`, a
    /// soft NIC, or a PD of another context.
    ///
    /// # Safety
    /// `pd` is null or a live `struct ibv_pd *` that stays allocated until the returned `Pd` and
    /// every handle made from it are dropped.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Error, Nic, Pd};
    /// let nic = Nic::soft();
    /// // SAFETY: null is refused before anything is read.
    /// let e = unsafe { Pd::from_raw(&nic, std::ptr::null_mut()) }.unwrap_err();
    /// assert!(matches!(e, Error::InvalidArgument { verb: None, .. } | Error::NoDevice));
    /// ```
    pub unsafe fn from_raw(nic: &Nic, pd: *mut c_void) -> Result<Pd> {
        #[cfg(feature = "verbs")]
        {
            if pd.is_null() {
                return Err(Error::invalid_arg("null ibv_pd"));
            }
            let verbs = nic
                .as_verbs()
                .ok_or_else(|| Error::invalid_arg("Pd::from_raw needs a verbs NIC"))?;
            // SAFETY: forwarded from the caller.
            let handle = unsafe { verbs.adopt_pd(pd) }?;
            Ok(Pd {
                inner: Arc::new(PdInner {
                    nic: nic.clone(),
                    handle,
                    owned: false,
                }),
            })
        }
        #[cfg(not(feature = "verbs"))]
        {
            let _ = (nic, pd);
            Err(Error::NoDevice)
        }
    }

    /// The NIC this PD belongs to.
    pub fn nic(&self) -> &Nic {
        &self.inner.nic
    }

    /// A number that identifies this PD while any handle to it lives (what `==` compares),
    /// for lock-free lookups.
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// The backend's handle (`struct ibv_pd *` on verbs, a table index on the soft NIC).
    pub fn as_raw(&self) -> u64 {
        self.inner.handle
    }

    fn backend(&self) -> &dyn Backend {
        &*self.inner.nic.backend
    }

    /// Register `[addr, addr + len)` with `access` (`ibv_reg_mr`). With
    /// [`Access::ON_DEMAND`] the region is an explicit ODP region: nothing is pinned, pages are
    /// faulted in by the NIC or by [`Pd::advise_mr`].
    ///
    /// # Errors
    /// `InvalidArgument` for an empty range or `REMOTE_WRITE`/`REMOTE_ATOMIC` without
    /// `LOCAL_WRITE`; `Limit` above `max_mr_size`; `Unsupported` for ODP on a device without it;
    /// otherwise the verb's errno (`ENOMEM` past the memlock limit or `max_mr`, `EFAULT` for
    /// unmapped memory).
    ///
    /// # Safety
    /// The range must stay mapped while the region (and any window bound to it) lives, and the
    /// caller must tolerate the NIC reading and writing it as the access flags allow, at any
    /// time, outside Rust's aliasing rules.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Access, Nic};
    /// let pd = Nic::soft().alloc_pd().unwrap();
    /// let mut buf = vec![0u8; 4096];
    /// // SAFETY: `buf` outlives `mr`.
    /// let mr = unsafe { pd.reg_mr(buf.as_mut_ptr(), buf.len(), Access::LOCAL_WRITE) }.unwrap();
    /// assert_eq!(mr.len(), 4096);
    /// ```
    pub unsafe fn reg_mr(&self, addr: *mut u8, len: usize, access: Access) -> Result<Mr> {
        if len == 0 {
            return Err(Error::invalid(Verb::RegMr, "zero-length region"));
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.reg_mr_unchecked_len(addr, len, access) }
    }

    /// Register an implicit ODP region over the whole address space (`ibv_reg_mr(pd, NULL,
    /// SIZE_MAX, access | ON_DEMAND)`).
    ///
    /// # Errors
    /// `Unsupported` when the device lacks implicit ODP (kernel rxe, most devices).
    ///
    /// # Safety
    /// Every mapped page of the process becomes reachable by the NIC with `access`.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Access, Nic};
    /// let pd = Nic::soft().alloc_pd().unwrap();
    /// // SAFETY: the test accepts NIC access to its address space.
    /// let mr = unsafe { pd.reg_mr_implicit_odp(Access::LOCAL_WRITE) }.unwrap();
    /// assert_eq!(mr.len(), usize::MAX);
    /// ```
    pub unsafe fn reg_mr_implicit_odp(&self, access: Access) -> Result<Mr> {
        if !self.nic().caps().odp.implicit {
            return Err(Error::unsupported(
                Verb::RegMr,
                "implicit ODP is not supported by this device",
            ));
        }
        // SAFETY: forwarded from the caller.
        unsafe {
            self.reg_mr_unchecked_len(std::ptr::null_mut(), usize::MAX, access | Access::ON_DEMAND)
        }
    }

    unsafe fn reg_mr_unchecked_len(&self, addr: *mut u8, len: usize, access: Access) -> Result<Mr> {
        check_mr_access(Verb::RegMr, access)?;
        let caps = self.nic().caps();
        if access.contains(Access::ON_DEMAND) && !caps.odp.explicit {
            return Err(Error::unsupported(
                Verb::RegMr,
                "on-demand paging is not supported by this device",
            ));
        }
        if len != usize::MAX && len as u64 > caps.max_mr_size {
            return Err(Error::Limit {
                verb: Verb::RegMr,
                limit: "max_mr_size",
                max: caps.max_mr_size,
            });
        }
        let raw = self
            .backend()
            .reg_mr(self.inner.handle, addr as usize, len, access)?;
        Ok(Mr {
            inner: Arc::new(MrInner::new(self.clone(), raw, access)),
        })
    }

    /// Give the kernel advice about ranges of ODP regions of this PD (`ibv_advise_mr`).
    ///
    /// # Errors
    /// As `ibv_advise_mr(3)`: `EINVAL` for an empty list, bad flags, a window's key or a non-ODP
    /// region; `EFAULT` out of the region's bounds, for pages outside the process address space
    /// (with `FLUSH`) or for an lkey naming nothing; `ENOENT` for a stale lkey; `EPERM` for
    /// `PrefetchWrite` on a non-writable region or a region of another PD; `Unsupported` on a
    /// device without the verb; `Limit` above [`MAX_ADVISE_SGES`] entries (the kernel's bound;
    /// `max_sge` does not apply). Without `FLUSH` the prefetch
    /// itself is postponed and best-effort: its page errors are not reported.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Access, AdviseFlags, Advice, Nic};
    /// let pd = Nic::soft().alloc_pd().unwrap();
    /// let mut buf = memmap2::MmapMut::map_anon(1 << 16).unwrap();
    /// // SAFETY: `buf` outlives `mr`.
    /// let mr = unsafe {
    ///     pd.reg_mr(buf.as_mut_ptr(), buf.len(), Access::LOCAL_WRITE | Access::ON_DEMAND)
    /// }.unwrap();
    /// pd.advise_mr(Advice::PrefetchWrite, AdviseFlags::FLUSH, &[mr.sge(0, 1 << 16).unwrap()])
    ///     .unwrap();
    /// ```
    pub fn advise_mr(&self, advice: Advice, flags: AdviseFlags, sges: &[Sge]) -> Result<()> {
        if sges.is_empty() {
            return Err(Error::from_errno(Verb::AdviseMr, libc::EINVAL));
        }
        if sges.len() > MAX_ADVISE_SGES {
            return Err(Error::Limit {
                verb: Verb::AdviseMr,
                limit: "advise_mr list length",
                max: MAX_ADVISE_SGES as u64,
            });
        }
        self.backend()
            .advise_mr(self.inner.handle, advice, flags, sges)
    }

    /// Allocate a memory window of type `ty` (`ibv_alloc_mw`).
    ///
    /// # Errors
    /// `Unsupported` when the device lacks that window type; `ENOMEM` past `max_mw`.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{MwType, Nic};
    /// let pd = Nic::soft().alloc_pd().unwrap();
    /// let mw = pd.alloc_mw(MwType::Type2).unwrap();
    /// assert_eq!(mw.mw_type(), MwType::Type2);
    /// ```
    pub fn alloc_mw(&self, ty: MwType) -> Result<Mw> {
        let caps = self.nic().caps();
        let (supported, missing) = match ty {
            MwType::Type1 => (caps.mw_type1, "type 1 memory windows are not supported"),
            MwType::Type2 => (caps.mw_type2, "type 2 memory windows are not supported"),
        };
        if !supported {
            return Err(Error::unsupported(Verb::AllocMw, missing));
        }
        let (handle, rkey) = self.backend().alloc_mw(self.inner.handle, ty)?;
        Ok(Mw {
            pd: self.clone(),
            handle,
            ty,
            cur: MwState {
                rkey,
                ..Default::default()
            },
            before_bind: None,
        })
    }

    /// Create an RC queue pair using `send_cq` and `recv_cq`.
    ///
    /// # Errors
    /// `Limit` above `max_qp_wr`/`max_sge`, or the `ibv_create_qp` failure.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Nic, QpCaps};
    /// let nic = Nic::soft();
    /// let pd = nic.alloc_pd().unwrap();
    /// let cq = nic.create_cq(16).unwrap();
    /// let qp = pd.create_qp(&cq, &cq, QpCaps::default()).unwrap();
    /// assert!(qp.qpn() > 0);
    /// ```
    pub fn create_qp(&self, send_cq: &Cq, recv_cq: &Cq, caps: QpCaps) -> Result<Qp> {
        self.create_qp_in(send_cq, recv_cq, None, caps)
    }

    fn create_qp_in(
        &self,
        send_cq: &Cq,
        recv_cq: &Cq,
        srq: Option<&Srq>,
        caps: QpCaps,
    ) -> Result<Qp> {
        if !self.nic().same_device(&send_cq.inner.nic)
            || !self.nic().same_device(&recv_cq.inner.nic)
        {
            return Err(Error::invalid(
                Verb::CreateQp,
                "completion queue of another device",
            ));
        }
        let dev = self.nic().caps();
        if caps.max_send_wr.max(caps.max_recv_wr) > dev.max_qp_wr {
            return Err(Error::Limit {
                verb: Verb::CreateQp,
                limit: "max_qp_wr",
                max: dev.max_qp_wr as u64,
            });
        }
        if caps.max_send_sge.max(caps.max_recv_sge) > dev.max_sge {
            return Err(Error::Limit {
                verb: Verb::CreateQp,
                limit: "max_sge",
                max: dev.max_sge as u64,
            });
        }
        let (handle, qpn, caps) = self.backend().create_qp(
            self.inner.handle,
            send_cq.inner.handle,
            recv_cq.inner.handle,
            srq.map(|s| s.handle()),
            &caps,
        )?;
        Ok(Qp {
            inner: Arc::new(QpInner {
                pd: self.clone(),
                _send_cq: send_cq.clone(),
                _recv_cq: recv_cq.clone(),
                _srq: srq.cloned(),
                handle,
                qpn,
                caps,
                owned: true,
            }),
        })
    }
}

fn check_mr_access(verb: Verb, access: Access) -> Result<()> {
    if !access.is_valid_for_mr() {
        return Err(Error::invalid(
            verb,
            "REMOTE_WRITE/REMOTE_ATOMIC need LOCAL_WRITE",
        ));
    }
    if access.contains(Access::ZERO_BASED) {
        return Err(Error::invalid(
            verb,
            "ZERO_BASED applies to memory windows only",
        ));
    }
    Ok(())
}

/// A registered memory region. Dropping it deregisters it (once no window bound to it holds it).
pub struct Mr {
    inner: Arc<MrInner>,
}

struct MrInner {
    pd: Pd,
    raw: RawMr,
    access: Access,
    poisoned: bool,
    registered: std::sync::atomic::AtomicBool,
}

impl MrInner {
    fn new(pd: Pd, raw: RawMr, access: Access) -> MrInner {
        MrInner {
            pd,
            raw,
            access,
            poisoned: false,
            registered: true.into(),
        }
    }

    fn dereg(&self) -> Result<()> {
        use std::sync::atomic::Ordering;
        if !self.registered.load(Ordering::Acquire) {
            return Ok(());
        }
        self.pd.backend().dereg_mr(self.raw.handle)?;
        self.registered.store(false, Ordering::Release);
        Ok(())
    }
}

impl Drop for MrInner {
    fn drop(&mut self) {
        leak_on_error("MR", self.raw.handle, self.dereg());
    }
}

debug_fields!(Mr, |s| {
    "addr": format_args!("{:#x}", s.inner.raw.addr),
    "len": s.inner.raw.len,
    "lkey": s.inner.raw.lkey,
    "rkey": s.inner.raw.rkey,
    "access": s.inner.access,
    "poisoned": s.inner.poisoned,
});

/// A failed [`Mr::dereg`]: the region, still registered, and why.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct DeregError {
    /// The region, unchanged.
    pub mr: Mr,
    /// What the verb said (`EBUSY`/`EINVAL` while a window is bound).
    #[source]
    pub error: Error,
}

impl Mr {
    /// Local key.
    pub fn lkey(&self) -> Lkey {
        self.inner.raw.lkey
    }
    /// Remote key.
    pub fn rkey(&self) -> Rkey {
        self.inner.raw.rkey
    }
    /// Start address.
    pub fn addr(&self) -> usize {
        self.inner.raw.addr
    }
    /// Length in bytes (`usize::MAX` for implicit ODP).
    pub fn len(&self) -> usize {
        self.inner.raw.len
    }
    /// True for a zero-length region (never: registration refuses them).
    pub fn is_empty(&self) -> bool {
        self.inner.raw.len == 0
    }
    /// Access flags.
    pub fn access(&self) -> Access {
        self.inner.access
    }
    /// True for an ODP region.
    pub fn is_odp(&self) -> bool {
        self.inner.access.contains(Access::ON_DEMAND)
    }
    /// True after a re-registration failed with `ERR_CMD`: the region must not be used.
    pub fn is_poisoned(&self) -> bool {
        self.inner.poisoned
    }
    /// The PD the region belongs to.
    pub fn pd(&self) -> &Pd {
        &self.inner.pd
    }
    /// The backend's handle (`struct ibv_mr *` on verbs).
    pub fn as_raw(&self) -> u64 {
        self.inner.raw.handle
    }

    /// A scatter/gather entry for `[addr() + offset, addr() + offset + len)`.
    ///
    /// # Errors
    /// `InvalidArgument` (with no verb: nothing is posted here) when the range leaves the
    /// region, `len` exceeds `u32::MAX`, or the region is poisoned.
    ///
    /// # Examples
    /// ```
    /// # use rdma_pool::nic::{Access, Nic};
    /// # let pd = Nic::soft().alloc_pd().unwrap();
    /// # let mut buf = vec![0u8; 64];
    /// # // SAFETY: `buf` outlives `mr`.
    /// # let mr = unsafe { pd.reg_mr(buf.as_mut_ptr(), 64, Access::LOCAL_WRITE) }.unwrap();
    /// let sge = mr.sge(8, 16).unwrap();
    /// assert_eq!(sge.addr, mr.addr() as u64 + 8);
    /// assert!(matches!(
    ///     mr.sge(60, 16),
    ///     Err(rdma_pool::nic::Error::InvalidArgument { verb: None, .. })
    /// ));
    /// ```
    pub fn sge(&self, offset: usize, len: usize) -> Result<Sge> {
        if self.inner.poisoned {
            return Err(Error::invalid_arg("region is poisoned by a failed rereg"));
        }
        let end = offset.checked_add(len);
        if end.is_none_or(|e| e > self.len()) || len > u32::MAX as usize {
            return Err(Error::invalid_arg("range outside the region"));
        }
        Ok(Sge {
            addr: (self.addr() + offset) as u64,
            length: len as u32,
            lkey: self.lkey(),
        })
    }

    /// Re-register the region (`ibv_rereg_mr`): new translation, PD and/or access.
    ///
    /// On success the region's keys are those the device reports; they may or may not have
    /// changed (mlx5 keeps them on an in-place update). On failure, `ReregError::kind` says
    /// whether the old region is still valid; after `Cmd` the region is poisoned.
    ///
    /// # Errors
    /// `Input` (nothing changed) for empty flags, unknown flags, an empty new range, invalid
    /// access, a PD of another device, or while windows are bound; `Cmd` (with `EOPNOTSUPP`)
    /// where the provider has no re-registration (kernel rxe).
    ///
    /// # Safety
    /// With `CHANGE_TRANSLATION`, as for [`Pd::reg_mr`] for the new range.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Access, Nic, ReregFlags};
    /// let pd = Nic::soft().alloc_pd().unwrap();
    /// let mut a = vec![0u8; 4096];
    /// let mut b = vec![0u8; 8192];
    /// // SAFETY: `a` and `b` outlive `mr`.
    /// let mut mr = unsafe { pd.reg_mr(a.as_mut_ptr(), a.len(), Access::LOCAL_WRITE) }.unwrap();
    /// unsafe { mr.rereg(ReregFlags::CHANGE_TRANSLATION, None, b.as_mut_ptr(), b.len(), Access::empty()) }
    ///     .unwrap();
    /// assert_eq!(mr.len(), 8192);
    /// ```
    pub unsafe fn rereg(
        &mut self,
        flags: ReregFlags,
        pd: Option<&Pd>,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<(), ReregError> {
        let input = |errno| Err(ReregError::new(ReregErrorKind::Input, errno));
        if flags.is_empty() || self.inner.poisoned {
            return input(libc::EINVAL);
        }
        if flags.contains(ReregFlags::CHANGE_TRANSLATION) && (len == 0 || addr.is_null()) {
            return input(libc::EINVAL);
        }
        if !access.is_empty() && !flags.contains(ReregFlags::CHANGE_ACCESS) {
            return input(libc::EINVAL);
        }
        if flags.contains(ReregFlags::CHANGE_ACCESS)
            && check_mr_access(Verb::ReregMr, access).is_err()
        {
            return input(libc::EINVAL);
        }
        if flags.contains(ReregFlags::CHANGE_PD)
            && !pd.is_some_and(|pd| pd.nic().same_device(self.inner.pd.nic()))
        {
            return input(libc::EINVAL);
        }
        let cur = &self.inner;
        let new = flags.resolve(
            MrAttrs {
                pd: &cur.pd,
                addr: cur.raw.addr,
                len: cur.raw.len,
                access: cur.access,
            },
            MrAttrs {
                pd: pd.unwrap_or(&cur.pd),
                addr: addr as usize,
                len,
                access,
            },
        );
        let (new_pd, new_addr, new_len, new_access) =
            (new.pd.clone(), new.addr, new.len, new.access);
        let Some(inner) = Arc::get_mut(&mut self.inner) else {
            // Windows bound to the region hold it; the pool never re-registers under them.
            return input(libc::EBUSY);
        };
        let backend = &*new_pd.inner.nic.backend;
        match backend.rereg_mr(
            inner.raw.handle,
            flags,
            new_pd.inner.handle,
            new_addr,
            new_len,
            new_access,
        ) {
            Ok(raw) => {
                inner.raw = raw;
                inner.pd = new_pd;
                inner.access = new_access;
                Ok(())
            }
            Err(e) => {
                if let Some(raw) = e.replaced {
                    // DO_FORK_OLD: the new registration is in force.
                    inner.raw = raw;
                    inner.pd = new_pd;
                    inner.access = new_access;
                } else if !e.kind.mr_usable() {
                    inner.poisoned = true;
                }
                Err(e)
            }
        }
    }

    /// Deregister now (`ibv_dereg_mr`), getting the region back when that fails.
    ///
    /// # Errors
    /// While a memory window is bound to the region the verb refuses (`EBUSY` on the soft NIC,
    /// `EINVAL` on rxe) and the region is returned unchanged in [`DeregError`].
    ///
    /// # Examples
    /// ```
    /// # use rdma_pool::nic::{Access, Nic};
    /// # let pd = Nic::soft().alloc_pd().unwrap();
    /// # let mut buf = vec![0u8; 64];
    /// # // SAFETY: `buf` outlives `mr`.
    /// # let mr = unsafe { pd.reg_mr(buf.as_mut_ptr(), 64, Access::LOCAL_WRITE) }.unwrap();
    /// mr.dereg().unwrap();
    /// ```
    pub fn dereg(self) -> Result<(), DeregError> {
        match self.inner.dereg() {
            Ok(()) => Ok(()),
            Err(error) => Err(DeregError { mr: self, error }),
        }
    }
}

/// A memory window: a sub-range of a region with its own rkey and rights.
pub struct Mw {
    pd: Pd,
    handle: u64,
    ty: MwType,
    cur: MwState,
    /// The state before the last bind, for [`Mw::bind_failed`].
    before_bind: Option<MwState>,
}

/// A window's key and what its binding holds alive (the region; for type 2, the QP).
#[derive(Default)]
struct MwState {
    rkey: Rkey,
    /// Held so the region outlives the binding (dereg waits for the window).
    _mr: Option<Arc<MrInner>>,
    /// Held so a type 2 window is deallocated before its QP is destroyed.
    _qp: Option<Arc<QpInner>>,
}

debug_fields!(Mw, |s| { "type": s.ty, "rkey": s.cur.rkey });

impl Mw {
    /// The window's type.
    pub fn mw_type(&self) -> MwType {
        self.ty
    }
    /// The window's current rkey (updated by every bind this handle made).
    pub fn rkey(&self) -> Rkey {
        self.cur.rkey
    }
    /// The backend's handle (`struct ibv_mw *` on verbs).
    pub fn as_raw(&self) -> u64 {
        self.handle
    }
    /// The PD.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// `self`, if it is a window of type `ty` (type 1 binds with `ibv_bind_mw`, type 2 with a
    /// BIND_MW work request).
    fn of_type(&self, ty: MwType) -> Result<&Mw> {
        if self.ty != ty {
            let why = match ty {
                MwType::Type1 => "ibv_bind_mw binds type 1 windows only",
                MwType::Type2 => "BIND_MW work requests bind type 2 windows only",
            };
            return Err(Error::invalid(Verb::BindMw, why));
        }
        Ok(self)
    }

    /// Record a bind (or invalidation) that was posted: the new key and what it binds. The
    /// previous state stays alive until [`Mw::settle`].
    fn bound(&mut self, rkey: Rkey, mr: Option<Arc<MrInner>>, qp: Option<Arc<QpInner>>) {
        let before = std::mem::replace(
            &mut self.cur,
            MwState {
                rkey,
                _mr: mr,
                _qp: qp,
            },
        );
        self.before_bind = Some(before);
    }

    /// Tell the window how its last bind or invalidation completed (pass the completion's
    /// status). On success, what the previous binding held alive (its region, its QP) is
    /// released; on failure, the previous key and binding are restored, as `ibv_bind_mw(3)` tells
    /// the caller to do. Until then both are kept, since the device may still use either.
    /// Returns false when nothing was pending.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{Access, MwType, Nic, QpCaps, WcStatus};
    /// let nic = Nic::soft();
    /// let pd = nic.alloc_pd().unwrap();
    /// let cq = nic.create_cq(8).unwrap();
    /// let (q1, q2) = (pd.create_qp(&cq, &cq, QpCaps::default()).unwrap(), pd.create_qp(&cq, &cq, QpCaps::default()).unwrap());
    /// q1.connect(&q2.endpoint().unwrap()).unwrap();
    /// let mut buf = vec![0u8; 64];
    /// // SAFETY: `buf` outlives the region. (No MW_BIND right: the bind will fail.)
    /// let mr = unsafe { pd.reg_mr(buf.as_mut_ptr(), 64, Access::LOCAL_WRITE) }.unwrap();
    /// let mut mw = pd.alloc_mw(MwType::Type1).unwrap();
    /// let old = mw.rkey();
    /// // SAFETY: `buf` outlives the window (the bind fails anyway).
    /// unsafe { q1.bind_mw(1, &mut mw, &mr, 0, 64, Access::REMOTE_READ) }.unwrap();
    /// let wc = cq.poll_one().unwrap().unwrap();
    /// assert_ne!(wc.status, WcStatus::Success);
    /// assert!(mw.settle(wc.status));
    /// assert_eq!(mw.rkey(), old);
    /// ```
    pub fn settle(&mut self, status: WcStatus) -> bool {
        match self.before_bind.take() {
            Some(before) if status != WcStatus::Success => {
                self.cur = before;
                true
            }
            Some(_) => true,
            None => false,
        }
    }

    /// Shorthand for [`Mw::settle`] with a failed status.
    pub fn bind_failed(&mut self) -> bool {
        self.settle(WcStatus::MwBindErr)
    }

    /// Deallocate now (`ibv_dealloc_mw`), which kills every key of the window, and say how it
    /// went (dropping deallocates too, logging a failure).
    ///
    /// # Errors
    /// The verb's failure, with the window back unchanged: its key may still work.
    ///
    /// # Examples
    /// ```
    /// let pd = rdma_pool::nic::Nic::soft().alloc_pd().unwrap();
    /// let mw = pd.alloc_mw(rdma_pool::nic::MwType::Type1).unwrap();
    /// assert!(mw.dealloc().is_ok());
    /// ```
    #[allow(clippy::result_large_err)] // the window comes back on the rare failure
    pub fn dealloc(self) -> std::result::Result<(), (Mw, Error)> {
        if let Err(e) = self.pd.backend().dealloc_mw(self.handle) {
            return Err((self, e));
        }
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never used or dropped again; each field is moved out once, and
        // dropped after the window is gone (its QP and region may go now).
        drop(unsafe {
            (
                std::ptr::read(&me.cur),
                std::ptr::read(&me.before_bind),
                std::ptr::read(&me.pd),
            )
        });
        Ok(())
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        leak_on_error("MW", self.handle, self.pd.backend().dealloc_mw(self.handle));
        // The bound QP and MR (fields) are released after the window: type 2 windows must be
        // deallocated before their QP is destroyed (rxe stalls otherwise).
    }
}

/// A completion queue.
#[derive(Clone)]
pub struct Cq {
    inner: Arc<CqInner>,
}

struct CqInner {
    nic: Nic,
    handle: u64,
    /// The owned requests completing here (`owned.rs`).
    inflight: owned::Inflight,
    /// The channel it signals when armed (kept alive until the CQ is destroyed).
    channel: Option<CompChannel>,
    /// False for a CQ adopted with [`Cq::from_raw`]: its owner destroys it.
    owned: bool,
}

impl Drop for CqInner {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let destroyed = self.nic.backend.destroy_cq(self.handle);
        if destroyed.is_err() {
            // A QP whose destruction failed may still write the buffers of its requests.
            self.inflight.leak();
        }
        leak_on_error("CQ", self.handle, destroyed);
    }
}

debug_fields!(Cq, |s| { "handle": s.inner.handle });

impl Cq {
    /// The backend's handle (`struct ibv_cq *` on verbs).
    pub fn as_raw(&self) -> u64 {
        self.inner.handle
    }

    /// The device.
    pub fn nic(&self) -> &Nic {
        &self.inner.nic
    }

    /// Poll up to `out.len()` of the application's completions; returns how many were
    /// written. Completions of owned requests ([`Qp::post_recv_owned`] and siblings) go to
    /// their [`Posted`] handles instead; the application's completions read while a handle
    /// waited come first.
    ///
    /// # Errors
    /// The `ibv_poll_cq` failure.
    pub fn poll(&self, out: &mut [Completion]) -> Result<usize> {
        let (mut n, _order) = self.take_backlog(out);
        while n < out.len() {
            let room = out.len() - n;
            let (got, kept) = match self.poll_routed(&mut out[n..]) {
                Ok(r) => r,
                Err(_) if n > 0 => break,
                Err(e) => return Err(e),
            };
            n += kept;
            // Fewer than asked: the queue is empty. Else poll again for the room the owned
            // requests' completions left.
            if got < room {
                break;
            }
        }
        Ok(n)
    }

    /// Poll one completion, if there is one.
    ///
    /// # Errors
    /// The `ibv_poll_cq` failure.
    pub fn poll_one(&self) -> Result<Option<Completion>> {
        let mut wc = [Completion::default()];
        Ok((self.poll(&mut wc)? == 1).then_some(wc[0]))
    }

    /// Wait for one completion for at most `timeout`: on a CQ with a completion channel by
    /// sleeping on it ([`Cq::req_notify`]), else spinning, then yielding.
    ///
    /// # Errors
    /// [`Error::Timeout`] when none arrives in time.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// let cq = rdma_pool::nic::Nic::soft().create_cq(4).unwrap();
    /// assert!(cq.wait_one(Duration::from_millis(1)).is_err());
    /// ```
    pub fn wait_one(&self, timeout: Duration) -> Result<Completion> {
        if self.inner.channel.is_some() {
            return self.wait_notified(timeout);
        }
        let start = Instant::now();
        loop {
            if let Some(wc) = self.poll_one()? {
                return Ok(wc);
            }
            if start.elapsed() > timeout {
                return Err(Error::Timeout(timeout));
            }
            std::thread::yield_now();
        }
    }
}

/// A reliable-connected queue pair.
///
/// # Examples
/// The raw verbs (the owned posts, [`Qp::post_send_owned`] and siblings, need no `unsafe`):
/// SEND into a posted receive, then a grant through a type 2 window and its revocation.
/// ```
/// use rdma_pool::nic::{Access, Buffer, MwType, Nic, QpCaps, WcStatus};
/// use std::time::Duration;
/// let (nic, peer) = (Nic::soft(), Nic::soft());
/// let (pd, ppd) = (nic.alloc_pd()?, peer.alloc_pd()?);
/// let (cq, pcq) = (nic.create_cq(16)?, peer.create_cq(16)?);
/// let qp = pd.create_qp(&cq, &cq, QpCaps::default())?;
/// let pqp = ppd.create_qp(&pcq, &pcq, QpCaps::default())?;
/// qp.connect(&pqp.endpoint()?)?;
/// pqp.connect(&qp.endpoint()?)?;
/// let t = Duration::from_secs(5);
///
/// let (mut a, mut b) = (Buffer::new(4096)?, Buffer::new(4096)?);
/// a.as_mut_slice()[..4].copy_from_slice(b"ping");
/// // SAFETY: the buffers outlive their regions.
/// let amr = unsafe { pd.reg_mr(a.as_mut_ptr(), 4096, Access::LOCAL_WRITE) }?;
/// let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::MW_BIND;
/// // SAFETY: as above.
/// let bmr = unsafe { ppd.reg_mr(b.as_mut_ptr(), 4096, rw) }?;
/// // SAFETY: `a` and `b` are not touched until the completions are polled below.
/// unsafe {
///     pqp.post_recv(1, &[bmr.sge(0, 4096)?])?;
///     qp.post_send(2, &[amr.sge(0, 4)?])?;
/// }
/// assert_eq!(cq.wait_one(t)?.status, WcStatus::Success);
/// assert_eq!(pcq.wait_one(t)?.byte_len, 4);
///
/// // Grant the first 64 bytes of `b` to this QP's peer only, then revoke.
/// let mut mw = ppd.alloc_mw(MwType::Type2)?;
/// // SAFETY: `b` outlives the window, and the peer only reads it.
/// let rkey = unsafe { pqp.post_bind_mw(3, &mut mw, &bmr, 0, 64, Access::REMOTE_READ) }?;
/// assert_eq!(pcq.wait_one(t)?.status, WcStatus::Success);
/// // SAFETY: `a` is not touched until the completion is polled.
/// unsafe { qp.post_read(4, &[amr.sge(0, 64)?], bmr.addr() as u64, rkey) }?;
/// assert_eq!(cq.wait_one(t)?.status, WcStatus::Success);
/// assert_eq!(&a.as_slice()[..4], b"ping");
/// pqp.post_local_inv(5, rkey)?;
/// assert_eq!(pcq.wait_one(t)?.status, WcStatus::Success);
/// // SAFETY: as above.
/// unsafe { qp.post_read(6, &[amr.sge(0, 64)?], bmr.addr() as u64, rkey) }?;
/// assert_eq!(cq.wait_one(t)?.status, WcStatus::RemAccessErr);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Qp {
    inner: Arc<QpInner>,
}

struct QpInner {
    pd: Pd,
    _send_cq: Cq,
    _recv_cq: Cq,
    /// The shared receive queue it receives through (destroyed after the QP).
    _srq: Option<Srq>,
    handle: u64,
    qpn: u32,
    caps: QpCaps,
    /// False for a QP adopted with [`Qp::from_raw`]: its owner destroys it.
    owned: bool,
}

impl Drop for QpInner {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let destroyed = self.pd.backend().destroy_qp(self.handle);
        // Owned requests: the device can no longer touch their buffers, so they come back
        // flushed (a completion made before the destruction replaces the flush when a poll
        // finds it first) and the parked ones are dropped; their slots stay tombstones while
        // such a completion may be left (`owned.rs`). If the QP could not be destroyed, its
        // requests stay as they are: their completions may still come, the buffers with them.
        if destroyed.is_ok() {
            for cq in [&self._send_cq, &self._recv_cq] {
                cq.inner.inflight.qp_gone(self.qpn);
            }
        }
        leak_on_error("QP", self.handle, destroyed);
    }
}

debug_fields!(Qp, |s| { "qpn": s.inner.qpn });

impl Qp {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.inner.qpn
    }
    /// The PD.
    pub fn pd(&self) -> &Pd {
        &self.inner.pd
    }
    /// The backend's handle (`struct ibv_qp *` on verbs).
    pub fn as_raw(&self) -> u64 {
        self.inner.handle
    }
    fn backend(&self) -> &dyn Backend {
        self.inner.pd.backend()
    }

    /// What the peer needs to connect to this QP.
    ///
    /// # Errors
    /// The port/GID query failure.
    pub fn endpoint(&self) -> Result<Endpoint> {
        self.endpoint_with(0)
    }

    /// What the peer needs to connect to this QP, with the GID at `gid_index` (RoCE v2 over
    /// IPv4: the index of the address's GID).
    ///
    /// # Errors
    /// The port/GID query failure (`ENODATA` for an empty GID; the soft NIC has index 0
    /// only).
    pub fn endpoint_with(&self, gid_index: u8) -> Result<Endpoint> {
        self.backend().endpoint(self.inner.handle, gid_index)
    }

    /// Connect to `remote` (INIT → RTR → RTS) with the default [`ConnectOptions`].
    ///
    /// # Errors
    /// The `ibv_modify_qp` failure; on the soft NIC, `EINVAL` when no such peer QP exists.
    pub fn connect(&self, remote: &Endpoint) -> Result<()> {
        self.connect_with(remote, &ConnectOptions::default())
    }

    /// Connect to `remote` with `opts`: GID index, path MTU (capped at the port's), ACK
    /// timeout, retry and RNR counts.
    ///
    /// # Errors
    /// `InvalidArgument` for an option out of range ([`ConnectOptions::check`]) or an
    /// endpoint whose numbers are ([`Endpoint::check`]); as [`Qp::connect`].
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::{ConnectOptions, Nic, QpCaps};
    /// let (a, b) = (Nic::soft(), Nic::soft());
    /// let (ca, cb) = (a.create_cq(4)?, b.create_cq(4)?);
    /// let qa = a.alloc_pd()?.create_qp(&ca, &ca, QpCaps::default())?;
    /// let qb = b.alloc_pd()?.create_qp(&cb, &cb, QpCaps::default())?;
    /// let opts = ConnectOptions { path_mtu: Some(1024), retry_cnt: 3, rnr_retry: 0, ..ConnectOptions::default() };
    /// qa.connect_with(&qb.endpoint()?, &opts)?;
    /// qb.connect_with(&qa.endpoint()?, &opts)?;
    /// # Ok::<(), rdma_pool::nic::Error>(())
    /// ```
    pub fn connect_with(&self, remote: &Endpoint, opts: &ConnectOptions) -> Result<()> {
        opts.check()?;
        remote
            .check()
            .map_err(|detail| Error::invalid(Verb::ModifyQp, detail))?;
        self.backend().connect_qp(self.inner.handle, remote, opts)
    }

    /// The QP's state.
    ///
    /// # Errors
    /// The `ibv_query_qp` failure.
    pub fn state(&self) -> Result<QpState> {
        self.backend().qp_state(self.inner.handle)
    }

    /// Post a send-queue request (any `wr_id`: the crate's own posts come here too).
    pub(crate) fn post(&self, wr_id: u64, sges: &[Sge], op: RawSendOp) -> Result<()> {
        if sges.len() > self.inner.caps.max_send_sge as usize {
            return Err(Error::Limit {
                verb: Verb::PostSend,
                limit: "max_send_sge",
                max: self.inner.caps.max_send_sge as u64,
            });
        }
        self.backend().post_send(
            self.inner.handle,
            &RawSendWr {
                wr_id,
                signaled: true,
                inline: false,
                solicited: false,
                sges,
                op,
            },
        )
    }

    /// The shared receive queue it receives through, if any.
    pub fn srq(&self) -> Option<&Srq> {
        self.inner._srq.as_ref()
    }

    /// Post a receive (any `wr_id`).
    fn post_recv_any(&self, wr_id: u64, sges: &[Sge]) -> Result<()> {
        if self.inner._srq.is_some() {
            return Err(Error::invalid(
                Verb::PostRecv,
                "the QP receives through its SRQ: post to the SRQ",
            ));
        }
        if sges.len() > self.inner.caps.max_recv_sge as usize {
            return Err(Error::Limit {
                verb: Verb::PostRecv,
                limit: "max_recv_sge",
                max: self.inner.caps.max_recv_sge as u64,
            });
        }
        self.backend().post_recv(self.inner.handle, wr_id, sges)
    }

    /// Refuse an application `wr_id` in the range the crate reserves ([`is_reserved_wr_id`]).
    fn app_wr_id(wr_id: u64, verb: Verb) -> Result<()> {
        if is_reserved_wr_id(wr_id) {
            return Err(Error::invalid(
                verb,
                "wr_id in the range rdma-pool reserves (top 16 bits 0x5250/0x5251)",
            ));
        }
        Ok(())
    }

    /// Post a SEND of `sges` (the raw verb; [`Qp::post_send_owned`] is the safe one).
    ///
    /// # Errors
    /// A reserved `wr_id` ([`is_reserved_wr_id`]), `Limit` above `max_send_sge`, or the
    /// `ibv_post_send` failure (the outcome of the transfer arrives as a completion).
    ///
    /// # Safety
    /// The NIC reads the memory of `sges` until the request's completion is polled: it must
    /// stay allocated and registered, and not be written, until then.
    pub unsafe fn post_send(&self, wr_id: u64, sges: &[Sge]) -> Result<()> {
        Self::app_wr_id(wr_id, Verb::PostSend)?;
        self.post(wr_id, sges, RawSendOp::Send)
    }

    /// Post a SEND that also invalidates `rkey` at the responder (SEND_WITH_INV).
    ///
    /// # Errors
    /// As [`Qp::post_send`].
    ///
    /// # Safety
    /// As [`Qp::post_send`].
    pub unsafe fn post_send_with_inv(&self, wr_id: u64, sges: &[Sge], rkey: Rkey) -> Result<()> {
        Self::app_wr_id(wr_id, Verb::PostSend)?;
        self.post(wr_id, sges, RawSendOp::SendWithInv(rkey))
    }

    /// Post an RDMA WRITE of `sges` to `remote_addr` under `rkey` (the raw verb;
    /// [`Qp::post_write_owned`] is the safe one).
    ///
    /// # Errors
    /// As [`Qp::post_send`].
    ///
    /// # Safety
    /// As [`Qp::post_send`]: the NIC reads `sges` until the completion is polled.
    pub unsafe fn post_write(
        &self,
        wr_id: u64,
        sges: &[Sge],
        remote_addr: u64,
        rkey: Rkey,
    ) -> Result<()> {
        Self::app_wr_id(wr_id, Verb::PostSend)?;
        self.post(wr_id, sges, RawSendOp::Write { remote_addr, rkey })
    }

    /// Post an RDMA READ from `remote_addr` under `rkey` into `sges` (the raw verb;
    /// [`Qp::post_read_owned`] is the safe one).
    ///
    /// # Errors
    /// As [`Qp::post_send`].
    ///
    /// # Safety
    /// The NIC writes the memory of `sges` until the request's completion is polled: it must
    /// stay allocated and registered, and be neither read nor written by anything else, until
    /// then.
    pub unsafe fn post_read(
        &self,
        wr_id: u64,
        sges: &[Sge],
        remote_addr: u64,
        rkey: Rkey,
    ) -> Result<()> {
        Self::app_wr_id(wr_id, Verb::PostSend)?;
        self.post(wr_id, sges, RawSendOp::Read { remote_addr, rkey })
    }

    /// Post an RC atomic compare-and-swap (`IBV_WR_ATOMIC_CMP_AND_SWP`): the 8 bytes at
    /// `remote_addr` under `rkey` become `swap` if they equal `compare`; their original value
    /// is written to `local` (8 bytes, `LOCAL_WRITE`). The remote address must be 8-byte
    /// aligned (else the completion is `RemInvReqErr`) and the key must carry
    /// `REMOTE_ATOMIC` (else `RemAccessErr`). The remote address must be 8-byte aligned:
    /// refused at the call (rxe refuses it at post time, hardware NAKs it as an invalid
    /// request; the soft NIC models the NAK, `RemInvReqErr`). The value's byte order is the
    /// device's: host order on the soft NIC and rxe (mlx5 hardware keeps it big-endian).
    ///
    /// # Errors
    /// `Unsupported` where the device has no atomics (`Caps::atomics`); `InvalidArgument` when
    /// `local` is not 8 bytes, `remote_addr` is not 8-byte aligned or `wr_id` is reserved; the
    /// `ibv_post_send` failure.
    ///
    /// # Safety
    /// As [`Qp::post_read`] for `local`: the NIC writes it until the completion is polled.
    ///
    /// # Examples
    /// ```
    /// use rdma_pool::nic::*;
    /// # let (a, b) = (Nic::soft(), Nic::soft());
    /// # let (pa, pb) = (a.alloc_pd()?, b.alloc_pd()?);
    /// # let (ca, cb) = (a.create_cq(16)?, b.create_cq(16)?);
    /// # let qa = pa.create_qp(&ca, &ca, QpCaps::default())?;
    /// # let qb = pb.create_qp(&cb, &cb, QpCaps::default())?;
    /// # qa.connect(&qb.endpoint()?)?;
    /// # qb.connect(&qa.endpoint()?)?;
    /// let mut counter = Box::new(5u64); // the peer's, registered with REMOTE_ATOMIC
    /// let mut old = Box::new(0u64);
    /// let rights = Access::LOCAL_WRITE | Access::REMOTE_ATOMIC;
    /// // SAFETY: both boxes outlive their regions and are read only after the completion.
    /// let theirs = unsafe { pb.reg_mr((&mut *counter as *mut u64).cast(), 8, rights) }?;
    /// let mine = unsafe { pa.reg_mr((&mut *old as *mut u64).cast(), 8, Access::LOCAL_WRITE) }?;
    /// unsafe { qa.post_compare_swap(1, mine.sge(0, 8)?, theirs.addr() as u64, theirs.rkey(), 5, 9) }?;
    /// assert_eq!(ca.wait_one(std::time::Duration::from_secs(5))?.status, WcStatus::Success);
    /// assert_eq!((*old, *counter), (5, 9));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub unsafe fn post_compare_swap(
        &self,
        wr_id: u64,
        local: Sge,
        remote_addr: u64,
        rkey: Rkey,
        compare: u64,
        swap: u64,
    ) -> Result<()> {
        self.atomic_args(wr_id, &local, remote_addr)?;
        let op = RawSendOp::CompareSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        };
        self.post(wr_id, &[local], op)
    }

    /// Post an RC atomic fetch-and-add (`IBV_WR_ATOMIC_FETCH_AND_ADD`): `add` is added
    /// (wrapping) to the 8 bytes at `remote_addr` under `rkey`; their original value is written
    /// to `local`. Alignment, rights and byte order as [`Qp::post_compare_swap`].
    ///
    /// # Errors
    /// As [`Qp::post_compare_swap`].
    ///
    /// # Safety
    /// As [`Qp::post_compare_swap`].
    pub unsafe fn post_fetch_add(
        &self,
        wr_id: u64,
        local: Sge,
        remote_addr: u64,
        rkey: Rkey,
        add: u64,
    ) -> Result<()> {
        self.atomic_args(wr_id, &local, remote_addr)?;
        let op = RawSendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        };
        self.post(wr_id, &[local], op)
    }

    /// The checks every atomic post makes before the device sees it.
    fn atomic_args(&self, wr_id: u64, local: &Sge, remote_addr: u64) -> Result<()> {
        Self::app_wr_id(wr_id, Verb::PostSend)?;
        if !self.pd().nic().caps().atomics {
            return Err(Error::unsupported(
                Verb::PostSend,
                "the device has no RC atomics (atomic_cap IBV_ATOMIC_NONE)",
            ));
        }
        if local.length != 8 {
            return Err(Error::invalid(
                Verb::PostSend,
                "an atomic's local buffer is exactly 8 bytes",
            ));
        }
        if remote_addr % 8 != 0 {
            return Err(Error::invalid(
                Verb::PostSend,
                "an atomic's remote address is 8-byte aligned",
            ));
        }
        Ok(())
    }

    /// Post a LOCAL_INV of `rkey` (a type 2 window bound on this QP). Touches no memory.
    ///
    /// # Errors
    /// A reserved `wr_id`, or the `ibv_post_send` failure.
    pub fn post_local_inv(&self, wr_id: u64, rkey: Rkey) -> Result<()> {
        Self::app_wr_id(wr_id, Verb::PostSend)?;
        self.post(wr_id, &[], RawSendOp::LocalInv(rkey))
    }

    /// Post a LOCAL_INV of the window `mw`, recording it in `mw`: once the completion is passed
    /// to [`Mw::settle`], the window lets go of its region and QP.
    ///
    /// # Errors
    /// A reserved `wr_id`, or the `ibv_post_send` failure (nothing recorded then).
    pub fn post_invalidate(&self, wr_id: u64, mw: &mut Mw) -> Result<()> {
        Self::app_wr_id(wr_id, Verb::PostSend)?;
        self.invalidate(wr_id, mw)
    }

    /// [`Qp::post_invalidate`] with any `wr_id` (the crate's grants).
    pub(crate) fn invalidate(&self, wr_id: u64, mw: &mut Mw) -> Result<()> {
        self.post(wr_id, &[], RawSendOp::LocalInv(mw.cur.rkey))?;
        mw.bound(mw.cur.rkey, None, None);
        Ok(())
    }

    /// Post a receive into `sges` (the raw verb; [`Qp::post_recv_owned`] is the safe one).
    ///
    /// # Errors
    /// A reserved `wr_id`, `Limit` above `max_recv_sge`, or the `ibv_post_recv` failure.
    ///
    /// # Safety
    /// The NIC writes the memory of `sges` until the request's completion is polled (or the
    /// QP is destroyed): it must stay allocated and registered, and be neither read nor
    /// written by anything else, until then.
    pub unsafe fn post_recv(&self, wr_id: u64, sges: &[Sge]) -> Result<()> {
        Self::app_wr_id(wr_id, Verb::PostRecv)?;
        self.post_recv_any(wr_id, sges)
    }

    fn bind_args(
        &self,
        wr_id: u64,
        mw: &Mw,
        mr: &Mr,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<RawBind> {
        if !self.pd().nic().same_device(mw.pd.nic()) || !self.pd().nic().same_device(mr.pd().nic())
        {
            return Err(Error::invalid(
                Verb::BindMw,
                "window or region of another device",
            ));
        }
        if mr.is_poisoned() {
            return Err(Error::invalid(
                Verb::BindMw,
                "region is poisoned by a failed rereg",
            ));
        }
        if offset.checked_add(len).is_none_or(|e| e > mr.len()) {
            return Err(Error::invalid(
                Verb::BindMw,
                "window range outside the region",
            ));
        }
        if access.intersects(!(Access::REMOTE | Access::ZERO_BASED)) {
            return Err(Error::invalid(
                Verb::BindMw,
                "windows take only remote rights and ZERO_BASED",
            ));
        }
        Ok(RawBind {
            wr_id,
            signaled: true,
            mr: mr.as_raw(),
            mr_lkey: mr.lkey(),
            addr: mr.addr() + offset,
            len,
            access,
        })
    }

    /// Bind the type 1 window `mw` to `[offset, offset + len)` of `mr` with `access`
    /// (`ibv_bind_mw`). A zero `len` unbinds. The window gets a new rkey (returned and stored
    /// in `mw`); a completion with `wr_id` follows.
    ///
    /// # Errors
    /// `InvalidArgument` for a type 2 window, a range outside `mr` or a reserved `wr_id`; the
    /// verb's failure.
    ///
    /// # Safety
    /// Whoever holds the key may read or write (as `access` allows) the bound range until the
    /// window is invalidated and that completion polled: the memory must stay allocated, and
    /// not be accessed by the program in a way that conflicts with `access`, until then.
    pub unsafe fn bind_mw(
        &self,
        wr_id: u64,
        mw: &mut Mw,
        mr: &Mr,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Rkey> {
        Self::app_wr_id(wr_id, Verb::BindMw)?;
        self.bind_type1(wr_id, mw, mr, offset, len, access)
    }

    /// [`Qp::bind_mw`] with any `wr_id` (the crate's grants).
    pub(crate) fn bind_type1(
        &self,
        wr_id: u64,
        mw: &mut Mw,
        mr: &Mr,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Rkey> {
        let bind = self.bind_args(wr_id, mw.of_type(MwType::Type1)?, mr, offset, len, access)?;
        let rkey = self
            .backend()
            .bind_mw(self.inner.handle, mw.handle, mw.cur.rkey, &bind)?;
        mw.bound(rkey, (len > 0).then(|| mr.inner.clone()), None);
        Ok(rkey)
    }

    /// Post a BIND_MW work request binding the type 2 window `mw` to `[offset, offset + len)` of
    /// `mr`; the window is then usable only through this QP. Returns the window's new rkey (the
    /// next variant), valid once the completion reports success.
    ///
    /// # Errors
    /// `InvalidArgument` for a type 1 window, a range outside `mr` or a reserved `wr_id`; the
    /// post failure.
    ///
    /// # Safety
    /// As [`Qp::bind_mw`]: the peer may access the range until the window is invalidated.
    pub unsafe fn post_bind_mw(
        &self,
        wr_id: u64,
        mw: &mut Mw,
        mr: &Mr,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<Rkey> {
        Self::app_wr_id(wr_id, Verb::PostSend)?;
        let variant = mw.rkey().next_variant().variant();
        self.bind_type2(wr_id, mw, mr, offset, len, access, variant)
    }

    /// [`Qp::post_bind_mw`] with any `wr_id` and the new key's 8-bit `variant` chosen by the
    /// caller (the crate's grants: an unpredictable one).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn bind_type2(
        &self,
        wr_id: u64,
        mw: &mut Mw,
        mr: &Mr,
        offset: usize,
        len: usize,
        access: Access,
        variant: u8,
    ) -> Result<Rkey> {
        let bind = self.bind_args(wr_id, mw.of_type(MwType::Type2)?, mr, offset, len, access)?;
        let new_rkey = Rkey(mw.cur.rkey.0 & !0xff | variant as u32);
        self.post(
            wr_id,
            &[],
            RawSendOp::BindMw {
                mw: mw.handle,
                mw_rkey: mw.cur.rkey,
                new_rkey,
                bind,
            },
        )?;
        mw.bound(new_rkey, Some(mr.inner.clone()), Some(self.inner.clone()));
        Ok(new_rkey)
    }
}

/// A DEVX UMEM: user memory registered for device queue objects.
pub struct Umem {
    nic: Nic,
    handle: u64,
    id: u32,
    addr: usize,
    len: usize,
}

debug_fields!(Umem, |s| { "id": s.id, "len": s.len });

impl Umem {
    /// The UMEM id the device assigned.
    pub fn id(&self) -> u32 {
        self.id
    }
    /// Start address.
    pub fn addr(&self) -> usize {
        self.addr
    }
    /// Length.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Never true: registration refuses empty ranges.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The backend's handle (`struct mlx5dv_devx_umem *` on verbs).
    pub fn as_raw(&self) -> u64 {
        self.handle
    }

    /// Deregister now and say how it went (dropping deregisters too, logging a failure).
    ///
    /// # Errors
    /// The device's refusal (a UMEM still used by a DEVX object); the UMEM is then left
    /// registered (leaked), as `Drop` would.
    ///
    /// # Examples
    /// ```
    /// let nic = rdma_pool::nic::Nic::soft();
    /// let mut buf = memmap2::MmapMut::map_anon(1 << 16).unwrap();
    /// // SAFETY: `buf` outlives the UMEM.
    /// let umem = unsafe {
    ///     nic.umem_reg(buf.as_mut_ptr(), buf.len(), rdma_pool::nic::Access::LOCAL_WRITE, 1 << 12)
    /// }.unwrap();
    /// umem.dereg().unwrap();
    /// ```
    pub fn dereg(self) -> Result<()> {
        let me = std::mem::ManuallyDrop::new(self);
        let r = me.nic.backend.umem_dereg(me.handle);
        // SAFETY: `me` is not used again; its NIC handle is released once, here.
        drop(unsafe { std::ptr::read(&me.nic) });
        r
    }
}

impl Drop for Umem {
    fn drop(&mut self) {
        leak_on_error(
            "UMEM",
            self.handle,
            self.nic.backend.umem_dereg(self.handle),
        );
    }
}
