//! The real libibverbs backend: [`VerbsNic`] implements the NIC boundary on a verbs device
//! (hardware such as mlx5, or the kernel's Soft-RoCE, `rxe`).
//!
//! Files: this one holds [`VerbsNic`] (opening, attaching, adopting foreign objects);
//! `backend_impl.rs` its `Backend` impl; `device.rs` finds, opens (or attaches to) a device and
//! queries its caps; `inlines.rs` reimplements the static-inline verbs of `verbs.h`, with the C
//! work requests built in `wr.rs`; `qp_attr.rs` the QP attributes (state, MTU, PSN, INIT);
//! `conv.rs` the shared conversions; `census.rs` counts regions and windows; `rxe_odp.rs`
//! guards rxe's ODP data bug; `mlx5dv.rs` binds DEVX UMEM registration at run time; `tests.rs`
//! tests them without a device, against fake provider structs.
//!
//! Contract:
//! - Every handle is the raw libibverbs object pointer cast to `u64`: `struct ibv_pd *`,
//!   `ibv_mr *`, `ibv_mw *`, `ibv_cq *`, `ibv_qp *`, and `struct mlx5dv_devx_umem *` for UMEMs.
//!   The public layer owns each handle and passes it back only while it is alive (see
//!   `backend.rs`), so the pointers here are always live; a zero handle is refused.
//! - Errors carry the errno the verb reported; `EOPNOTSUPP`/`ENOSYS` become
//!   [`Error::Unsupported`].
//! - Only port 1 and GID index 0 are used (on RoCE, index 0 is the IPv6 link-local GID).
//! - QPs are RC with `sq_sig_all = 0`; they leave `create_qp` in INIT and
//!   `connect_qp` moves them through RTR to RTS. The initial PSN of a QP is its
//!   QP number masked to 24 bits, both in `endpoint` and when the QP is connected.
//! - A `VerbsNic` closes its context on drop only when it opened it ([`VerbsNic::attach`] does
//!   not); objects made through an attached context are still destroyed by their handles.
//!
//! Soft-RoCE (`rxe`) caveats, measured on the QEMU test bed (`tests/rxe/`; the table of them is
//! `quirks::RXE`):
//! - no `ibv_rereg_mr` (the verb returns `IBV_REREG_MR_ERR_CMD` with `EOPNOTSUPP`), no implicit
//!   ODP;
//! - **ODP data corruption**: RDMA READ into / WRITE from a local ODP region moves the wrong bytes
//!   unless every packet starts on a page boundary, i.e. the buffer is page-aligned *and* the
//!   path MTU is 4096 (link MTU 9000). [`VerbsNic::odp_rdma_safe`] reports whether the MTU
//!   condition holds, `reg_mr` logs a warning (once per device) for ODP regions when it does
//!   not, and posts whose ODP entries would be moved wrongly are refused as `Unsupported`
//!   (`rxe_odp.rs`; registering an ODP region on rxe may allocate, on other devices the guard
//!   does nothing);
//! - unbinding a type 1 window with a NULL MR crashes the provider, so the MR is always passed
//!   (with length 0 to unbind);
//! - the provider reads a type 2 window's *current* rkey from `ibv_mw::rkey` when a `BIND_MW` work
//!   request is posted, so the backend keeps that field in step with the public layer.
//!
//! What rdma-sys 0.3 lacks, and how it is handled: its static-inline reimplementations
//! (`ibv_post_send`, `ibv_poll_cq`, `ibv_bind_mw`, …) `unwrap()` provider function pointers and
//! skip checks the C inlines make, so the inlines used here are reimplemented (`inlines.rs`),
//! with missing ops reported as `EOPNOTSUPP`; `IBV_ADVISE_MR_FLAG_FLUSH` and
//! `IBV_LINK_LAYER_ETHERNET` are not generated, so they are defined here and there.

mod backend_impl;
mod census;
mod conv;
mod device;
mod inlines;
pub(crate) mod mlx5dv;
mod qp_attr;
mod rxe_odp;
#[cfg(test)]
mod tests;
mod wr;

pub(crate) use device::device_names;

/// Make `fd` non-blocking (`O_NONBLOCK`): the event descriptors of completion channels and
/// rdma_cm, read until `EAGAIN`.
pub(crate) fn set_nonblocking(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    // SAFETY: fcntl on a descriptor the caller owns; no pointers.
    let rc = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 {
            flags
        } else {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK)
        }
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A `struct ibv_wc` another library polled, as a [`Completion`].
///
/// # Safety
/// `wc` points at a readable `struct ibv_wc`.
pub(crate) unsafe fn completion_from_raw(wc: *const c_void) -> Completion {
    // SAFETY: forwarded from the caller.
    inlines::completion(unsafe { &*wc.cast::<ffi::ibv_wc>() })
}

/// What [`VerbsNic::adopt_qp`] read of a foreign QP.
pub(crate) struct AdoptedQp {
    pub(crate) handle: u64,
    pub(crate) pd: u64,
    pub(crate) send_cq: u64,
    pub(crate) recv_cq: u64,
    pub(crate) qpn: u32,
    pub(crate) caps: QpCaps,
}

use super::error::{Error, Result, Verb, check_rc};
use super::types::{Caps, Completion, QpCaps};
use census::Census;
use device::Context;
use mlx5dv::DevxState;
use rdma_sys as ffi;
use rxe_odp::RxeOdpGuard;
use std::ffi::{c_int, c_void};
// What the tests (`tests.rs`, `tests/fake_provider.rs`) take through `use super::*`: the names
// this file imported before the `Backend` impl moved to `backend_impl.rs`.
#[cfg(test)]
use {
    super::backend::{Backend, RawBind, RawSendWr},
    super::types::{
        Access, Advice, AdviseFlags, Lkey, MrAttrs, NicKind, QpState, ReregFlags, Rkey, Sge,
    },
    conv::obj,
    std::ptr,
};

/// A libibverbs device (hardware or kernel Soft-RoCE) behind the NIC boundary. Dropping it closes
/// the device (`ibv_close_device`) unless it was attached to a context the caller opened.
///
/// Reached through [`Nic::as_verbs`](crate::nic::Nic::as_verbs).
///
/// # Examples
/// ```
/// // `as_verbs` is `None` on the soft NIC, `Some` on a verbs device.
/// let nic = rdma_pool::nic::Nic::open_default()?;
/// if let Some(verbs) = nic.as_verbs() {
///     println!("rxe: {}, ODP RDMA safe: {}", verbs.is_rxe(), verbs.odp_rdma_safe());
/// }
/// # Ok::<(), rdma_pool::nic::Error>(())
/// ```
pub struct VerbsNic {
    ctx: Context,
    caps: Caps,
    devx: DevxState,
    /// Refuses ODP data rxe would corrupt (inactive on other devices).
    rxe_odp: RxeOdpGuard,
    /// Live regions and windows, to report their limits as `Error::Limit`.
    census: Census,
}

// SAFETY: libibverbs and its providers are thread-safe: every verb may be called from any
// thread, and concurrent calls on one object are serialised by the provider's locks (rdma-core
// `libibverbs/man/ibv_*` and the providers' spinlocks; no object here is created with a
// single-threaded thread domain or `IBV_*_SINGLE_THREADED` flags). The context pointer itself is
// never mutated after `open`.
unsafe impl Send for VerbsNic {}
// SAFETY: see `Send`; `&VerbsNic` only ever calls thread-safe verbs.
unsafe impl Sync for VerbsNic {}

impl std::fmt::Debug for VerbsNic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsNic")
            .field("name", &self.caps.name)
            .field("driver", &self.caps.driver)
            .field("devx", &self.devx)
            .finish()
    }
}

impl VerbsNic {
    /// Open the device called `name`, or the first device (see `device::open`).
    ///
    /// # Errors
    /// [`Error::NoDevice`] when there is no device, [`Error::DeviceNotFound`] when none is called
    /// `name`, or the failing `ibv_open_device` / `ibv_query_device_ex` / port query.
    pub(crate) fn open(name: Option<&str>) -> Result<VerbsNic> {
        let (ctx, caps, devx) = device::open(name)?;
        Ok(VerbsNic::new(ctx, caps, devx))
    }

    /// Attach to the open `struct ibv_context *` `ctx` without taking ownership.
    ///
    /// # Errors
    /// `InvalidArgument` for a null `ctx`; the failing device or port query.
    ///
    /// # Safety
    /// `ctx` is null or an open context that stays open while the returned NIC and every object
    /// made through it live.
    pub(crate) unsafe fn attach(ctx: *mut c_void) -> Result<VerbsNic> {
        // SAFETY: forwarded from the caller.
        let (ctx, caps, devx) = unsafe { device::attach(ctx.cast()) }?;
        Ok(VerbsNic::new(ctx, caps, devx))
    }

    fn new(ctx: Context, caps: Caps, devx: DevxState) -> VerbsNic {
        let rxe_odp = RxeOdpGuard::new(caps.driver == "rxe", caps.path_mtu);
        let nic = VerbsNic {
            ctx,
            caps,
            devx,
            rxe_odp,
            census: Census::default(),
        };
        tracing::debug!(?nic, "verbs device ready");
        nic
    }

    fn ctx(&self) -> *mut ffi::ibv_context {
        self.ctx.as_ptr()
    }

    /// The `struct ibv_context *` of this device (opened or attached), for objects the caller
    /// creates on the same context (DEVX).
    pub(crate) fn raw_context(&self) -> *mut c_void {
        self.ctx().cast()
    }

    /// Check that `pd` is a `struct ibv_pd *` of this device's context; returns its handle.
    ///
    /// # Errors
    /// `InvalidArgument` for a null `pd` or one of another context.
    ///
    /// # Safety
    /// `pd` is null or a live `struct ibv_pd *`.
    pub(crate) unsafe fn adopt_pd(&self, pd: *mut c_void) -> Result<u64> {
        let pd = pd.cast::<ffi::ibv_pd>();
        if pd.is_null() {
            return Err(Error::invalid_arg("null ibv_pd"));
        }
        // SAFETY: `pd` is a live PD (caller).
        if unsafe { (*pd).context } != self.ctx() {
            return Err(Error::invalid_arg("ibv_pd of another context"));
        }
        Ok(pd as u64)
    }

    /// Check that `cq` is a `struct ibv_cq *` of this device's context; returns its handle.
    ///
    /// # Errors
    /// `InvalidArgument` for a null `cq` or one of another context.
    ///
    /// # Safety
    /// `cq` is null or a live `struct ibv_cq *`.
    pub(crate) unsafe fn adopt_cq(&self, cq: *mut c_void) -> Result<u64> {
        let cq = cq.cast::<ffi::ibv_cq>();
        if cq.is_null() {
            return Err(Error::invalid_arg("null ibv_cq"));
        }
        // SAFETY: `cq` is a live CQ (caller).
        if unsafe { (*cq).context } != self.ctx() {
            return Err(Error::invalid_arg("ibv_cq of another context"));
        }
        Ok(cq as u64)
    }

    /// Check that `qp` is an RC `struct ibv_qp *` of this device's context and read what the
    /// public layer needs: (handle, PD, send CQ, receive CQ, QP number, sizes).
    ///
    /// # Errors
    /// `InvalidArgument` for a null `qp` or one of another context; `Unsupported` for a QP
    /// that is not RC; the `ibv_query_qp` failure.
    ///
    /// # Safety
    /// `qp` is null or a live `struct ibv_qp *`.
    pub(crate) unsafe fn adopt_qp(&self, qp: *mut c_void) -> Result<AdoptedQp> {
        let qp = qp.cast::<ffi::ibv_qp>();
        if qp.is_null() {
            return Err(Error::invalid_arg("null ibv_qp"));
        }
        // SAFETY: `qp` is a live QP (caller).
        let q = unsafe { &*qp };
        if q.context != self.ctx() {
            return Err(Error::invalid_arg("ibv_qp of another context"));
        }
        if q.qp_type != ffi::ibv_qp_type::IBV_QPT_RC {
            return Err(Error::unsupported(
                Verb::QueryQp,
                "only RC queue pairs carry grants and owned posts",
            ));
        }
        // SAFETY: all-zero is valid for both.
        let (mut attr, mut init): (ffi::ibv_qp_attr, ffi::ibv_qp_init_attr) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_CAP.0 as c_int;
        // SAFETY: `qp` is live; the out structs are ours.
        check_rc(Verb::QueryQp, unsafe {
            ffi::ibv_query_qp(qp, &mut attr, mask, &mut init)
        })?;
        Ok(AdoptedQp {
            handle: qp as u64,
            pd: q.pd as u64,
            send_cq: q.send_cq as u64,
            recv_cq: q.recv_cq as u64,
            qpn: q.qp_num,
            caps: QpCaps {
                max_send_wr: init.cap.max_send_wr,
                max_recv_wr: init.cap.max_recv_wr,
                max_send_sge: init.cap.max_send_sge,
                max_recv_sge: init.cap.max_recv_sge,
                max_inline_data: init.cap.max_inline_data,
            },
        })
    }

    /// True for a kernel Soft-RoCE device.
    ///
    /// # Examples
    /// ```
    /// # let nic = rdma_pool::nic::Nic::open_default()?;
    /// if let Some(v) = nic.as_verbs() {
    ///     assert_eq!(v.is_rxe(), nic.caps().driver == "rxe");
    /// }
    /// # Ok::<(), rdma_pool::nic::Error>(())
    /// ```
    pub fn is_rxe(&self) -> bool {
        self.caps.driver == "rxe"
    }

    /// Whether RDMA READ/WRITE data through local ODP regions can be trusted: always on hardware;
    /// on rxe only when the path MTU (as queried at open) is 4096, and then only for page-aligned
    /// buffers (the kernel ignores the offset into the page of every packet's first page).
    ///
    /// # Examples
    /// ```
    /// # let nic = rdma_pool::nic::Nic::open_default()?;
    /// if let Some(v) = nic.as_verbs() {
    ///     assert!(v.odp_rdma_safe() || v.is_rxe(), "only rxe is unsafe");
    /// }
    /// # Ok::<(), rdma_pool::nic::Error>(())
    /// ```
    pub fn odp_rdma_safe(&self) -> bool {
        self.rxe_odp.safe()
    }
}
