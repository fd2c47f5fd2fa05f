//! The real libibverbs backend: [`VerbsNic`] implements the NIC boundary on a verbs device
//! (hardware such as mlx5, or the kernel's Soft-RoCE, `rxe`).
//!
//! Files: this one holds [`VerbsNic`] and its `Backend` impl; `device.rs` finds, opens (or
//! attaches to) a device and queries its caps; `inlines.rs` reimplements the static-inline verbs
//! of `verbs.h`; `rxe_odp.rs` guards rxe's ODP data bug; `mlx5dv.rs` binds DEVX UMEM
//! registration at run time; `tests.rs` tests them without a device, against fake provider
//! structs.
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

mod census;
mod conv;
mod device;
mod inlines;
pub(crate) mod mlx5dv;
mod rxe_odp;
#[cfg(test)]
mod tests;

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

use super::backend::{Backend, RawBind, RawMr, RawSendWr};
use super::error::{
    Error, ReregError, ReregErrorKind, Result, Verb, check_rc, last_errno, rc_errno,
};
use super::types::{
    Access, Advice, AdviseFlags, Caps, Completion, ConnectOptions, Endpoint, ForkStatus, Lkey,
    MrAttrs, MwType, NicKind, QpCaps, QpState, ReregFlags, Rkey, Sge,
};
use census::{Census, Kind};
use conv::{PORT, obj};
use device::{Context, mtu_bytes};
use inlines::{
    advise_mr_raw, bind_mw_raw, poll_cq_raw, post_recv_raw, post_send_list_raw, post_send_raw,
    post_srq_recv_raw, query_port, req_notify_cq_raw, with_ibv_sges,
};
use mlx5dv::DevxState;
use rdma_sys as ffi;
use rxe_odp::RxeOdpGuard;
use std::any::Any;
use std::ffi::{c_int, c_void};
use std::ptr;

/// `IBV_LINK_LAYER_ETHERNET` (an anonymous enum in `verbs.h`, not generated by rdma-sys).
const IBV_LINK_LAYER_ETHERNET: u8 = 2;

fn qp_state(state: ffi::ibv_qp_state::Type) -> QpState {
    use ffi::ibv_qp_state as s;
    match state {
        s::IBV_QPS_RTS | s::IBV_QPS_SQD => QpState::Ready,
        s::IBV_QPS_SQE | s::IBV_QPS_ERR | s::IBV_QPS_UNKNOWN => QpState::Error,
        // RESET, INIT, RTR: not ready to send yet.
        _ => QpState::Init,
    }
}

/// RESET → INIT on port 1 with remote read, write and atomic rights (the responder's
/// windows and regions decide what a peer may do).
///
/// # Safety
/// `qp` is a live QP in the RESET state.
unsafe fn to_init(qp: *mut ffi::ibv_qp) -> c_int {
    use ffi::ibv_qp_attr_mask as m;
    // SAFETY: all-zero is a valid ibv_qp_attr.
    let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
    attr.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = PORT;
    attr.qp_access_flags = (ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
        | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
        | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC)
        .0;
    let mask = m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS;
    // SAFETY: `qp` is live; `attr` outlives the call.
    unsafe { ffi::ibv_modify_qp(qp, &mut attr, mask.0 as c_int) }
}

/// `enum ibv_mtu` of a path MTU in bytes (checked by `ConnectOptions::check`).
fn mtu_enum(bytes: u32) -> ffi::ibv_mtu::Type {
    use ffi::ibv_mtu as m;
    match bytes {
        256 => m::IBV_MTU_256,
        512 => m::IBV_MTU_512,
        1024 => m::IBV_MTU_1024,
        2048 => m::IBV_MTU_2048,
        _ => m::IBV_MTU_4096,
    }
}

/// The initial PSN of QP `qpn` (24 bits).
fn psn_for(qpn: u32) -> u32 {
    qpn & 0xff_ffff
}

/// What `ibv_rereg_mr` is given: libibverbs refuses a non-zero `access` without
/// `CHANGE_ACCESS`, so each argument is passed only with its flag (NULL/0 otherwise).
fn rereg_args(flags: ReregFlags, pd: u64, addr: usize, len: usize, access: Access) -> MrAttrs {
    let requested = MrAttrs {
        pd,
        addr,
        len,
        access,
    };
    flags.resolve(MrAttrs::default(), requested)
}

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

/// # Safety
/// `mr` is a live `ibv_mr`.
unsafe fn raw_mr(mr: *mut ffi::ibv_mr) -> RawMr {
    // SAFETY: `mr` is live (caller).
    let m = unsafe { &*mr };
    RawMr {
        handle: mr as u64,
        lkey: Lkey(m.lkey),
        rkey: Rkey(m.rkey),
        addr: m.addr as usize,
        len: m.length,
    }
}

impl Backend for VerbsNic {
    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn kind(&self) -> NicKind {
        NicKind::Verbs
    }

    fn poll_async_event(&self) -> Result<Option<super::types::AsyncEvent>> {
        let last_error = |verb| {
            let e = std::io::Error::last_os_error();
            Error::from_errno(verb, e.raw_os_error().unwrap_or(libc::EIO))
        };
        use super::types::AsyncEvent;
        let ctx = self.ctx();
        // SAFETY: `ctx` is the open context of this NIC.
        let fd = unsafe { (*ctx).async_fd };
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // Without blocking, and without changing the fd's flags (an application that attached
        // its own context may block on it).
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        if n < 0 {
            return Err(last_error(Verb::GetAsyncEvent));
        }
        if n == 0 || pfd.revents & libc::POLLIN == 0 {
            return Ok(None);
        }
        /// `struct ibv_async_event`, read as plain integers (the type code may be one the
        /// bindings' enum does not list).
        #[repr(C)]
        struct RawEvent {
            element: u64,
            event_type: u32,
        }
        let mut ev = RawEvent {
            element: 0,
            event_type: 0,
        };
        // SAFETY: `ev` has the layout of `struct ibv_async_event`; an event is pending, so the
        // call does not block.
        let rc = unsafe { ffi::ibv_get_async_event(ctx, (&mut ev as *mut RawEvent).cast()) };
        if rc != 0 {
            return Err(last_error(Verb::GetAsyncEvent));
        }
        // Port events carry the port number in the element union.
        let port = if matches!(ev.event_type, 9..=13 | 17 | 18) {
            ev.element as u32 as u8
        } else {
            0
        };
        let out = AsyncEvent::from_code(ev.event_type, port);
        // SAFETY: the event just read, acknowledged once.
        unsafe { ffi::ibv_ack_async_event((&mut ev as *mut RawEvent).cast()) };
        Ok(Some(out))
    }

    fn fork_status(&self) -> ForkStatus {
        // SAFETY: reads libibverbs' global fork state; no arguments.
        match unsafe { ffi::ibv_is_fork_initialized() } {
            ffi::IBV_FORK_UNNEEDED => ForkStatus::Unneeded,
            ffi::IBV_FORK_ENABLED => ForkStatus::Enabled,
            _ => ForkStatus::Disabled,
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn alloc_pd(&self) -> Result<u64> {
        // SAFETY: the context is open.
        let pd = unsafe { ffi::ibv_alloc_pd(self.ctx()) };
        if pd.is_null() {
            return Err(Error::last(Verb::AllocPd));
        }
        Ok(pd as u64)
    }

    fn dealloc_pd(&self, pd: u64) -> Result<()> {
        let pd = obj::<ffi::ibv_pd>(Verb::DeallocPd, pd)?;
        // SAFETY: `pd` is live and passed here once (backend contract).
        check_rc(Verb::DeallocPd, unsafe { ffi::ibv_dealloc_pd(pd) })
    }

    fn reg_mr(&self, pd: u64, addr: usize, len: usize, access: Access) -> Result<RawMr> {
        let pd = obj::<ffi::ibv_pd>(Verb::RegMr, pd)?;
        let odp = access.contains(Access::ON_DEMAND);
        let access = c_int::try_from(access.bits())
            .map_err(|_| Error::invalid(Verb::RegMr, "access flags out of range"))?;
        let r = self.rxe_odp.track_reg(&self.caps.name, odp, || {
            // SAFETY: `pd` is live; the range's validity is the public layer's contract (for
            // implicit ODP, NULL and SIZE_MAX are what the verb expects).
            let mr = unsafe { ffi::ibv_reg_mr(pd, addr as *mut c_void, len, access) };
            if mr.is_null() {
                return Err(Error::last(Verb::RegMr));
            }
            // SAFETY: `mr` was just registered.
            Ok(unsafe { raw_mr(mr) })
        });
        self.census.created(Kind::Mr, self.caps.max_mr, r)
    }

    fn rereg_mr(
        &self,
        mr: u64,
        flags: ReregFlags,
        pd: u64,
        addr: usize,
        len: usize,
        access: Access,
    ) -> Result<RawMr, ReregError> {
        let input = |errno| ReregError::new(ReregErrorKind::Input, errno);
        if mr == 0 || (flags.contains(ReregFlags::CHANGE_PD) && pd == 0) {
            return Err(input(libc::EINVAL));
        }
        let mr = mr as usize as *mut ffi::ibv_mr;
        let args = rereg_args(flags, pd, addr, len, access);
        let (Ok(flags_c), Ok(access_c)) = (
            c_int::try_from(flags.bits()),
            c_int::try_from(args.access.bits()),
        ) else {
            return Err(input(libc::EINVAL));
        };
        // SAFETY: `mr` (and `pd` with CHANGE_PD) are live objects of this device; the new
        // range's validity is the public layer's contract.
        let rc = unsafe {
            ffi::ibv_rereg_mr(
                mr,
                flags_c,
                args.pd as usize as *mut ffi::ibv_pd,
                args.addr as *mut c_void,
                args.len,
                access_c,
            )
        };
        if rc != 0 {
            let errno = if rc > 0 { rc } else { last_errno() };
            // An unknown code: assume the worst, the region must not be used.
            let kind = ReregErrorKind::from_raw(rc).unwrap_or(ReregErrorKind::Cmd);
            let mut e = ReregError::new(kind, errno);
            if kind == ReregErrorKind::DoForkOld {
                // SAFETY: `mr` is live; libibverbs applied the new translation before failing.
                e.replaced = Some(unsafe { raw_mr(mr) });
            }
            return Err(e);
        }
        // SAFETY: `mr` is live; libibverbs updated its keys, address and length in place.
        Ok(unsafe { raw_mr(mr) })
    }

    fn dereg_mr(&self, mr: u64) -> Result<()> {
        let mr = obj::<ffi::ibv_mr>(Verb::DeregMr, mr)?;
        // SAFETY: `mr` is live.
        let lkey = unsafe { (*mr).lkey };
        let r = self.rxe_odp.track_dereg(lkey, || {
            // SAFETY: `mr` is live; on failure it stays registered and the public layer keeps it.
            check_rc(Verb::DeregMr, unsafe { ffi::ibv_dereg_mr(mr) })
        });
        self.census.released(Kind::Mr, r)
    }

    fn advise_mr(&self, pd: u64, advice: Advice, flags: AdviseFlags, sges: &[Sge]) -> Result<()> {
        let pd = obj::<ffi::ibv_pd>(Verb::AdviseMr, pd)?;
        let n = u32::try_from(sges.len())
            .map_err(|_| Error::invalid(Verb::AdviseMr, "too many scatter/gather entries"))?;
        let rc = with_ibv_sges(sges, |list, _| {
            // SAFETY: `pd` is live; `list` holds `n` entries for the duration of the call.
            unsafe { advise_mr_raw(pd, advice as u32, flags.bits(), list, n) }
        });
        check_rc(Verb::AdviseMr, rc)
    }

    fn alloc_mw(&self, pd: u64, ty: MwType) -> Result<(u64, Rkey)> {
        let pd = obj::<ffi::ibv_pd>(Verb::AllocMw, pd)?;
        let ty = match ty {
            MwType::Type1 => ffi::ibv_mw_type::IBV_MW_TYPE_1,
            MwType::Type2 => ffi::ibv_mw_type::IBV_MW_TYPE_2,
        };
        // SAFETY: `pd` and its context are live.
        let Some(alloc) = (unsafe { (*(*pd).context).ops.alloc_mw }) else {
            return Err(Error::unsupported(
                Verb::AllocMw,
                "the provider has no memory windows",
            ));
        };
        // SAFETY: `pd` is live.
        let mw = unsafe { alloc(pd, ty) };
        let r = if mw.is_null() {
            Err(Error::last(Verb::AllocMw))
        } else {
            // SAFETY: `mw` was just allocated.
            Ok((mw as u64, Rkey(unsafe { (*mw).rkey })))
        };
        self.census.created(Kind::Mw, self.caps.max_mw, r)
    }

    fn bind_mw(&self, qp: u64, mw: u64, mw_rkey: Rkey, bind: &RawBind) -> Result<Rkey> {
        let qp = obj::<ffi::ibv_qp>(Verb::BindMw, qp)?;
        let mw = obj::<ffi::ibv_mw>(Verb::BindMw, mw)?;
        // SAFETY: `qp`, `mw` and `bind.mr` are live objects of this device (backend contract).
        unsafe { bind_mw_raw(qp, mw, mw_rkey, bind) }
    }

    fn dealloc_mw(&self, mw: u64) -> Result<()> {
        let mw = obj::<ffi::ibv_mw>(Verb::DeallocMw, mw)?;
        // SAFETY: `mw` and its context are live.
        let Some(dealloc) = (unsafe { (*(*mw).context).ops.dealloc_mw }) else {
            return Err(Error::unsupported(
                Verb::DeallocMw,
                "the provider has no memory windows",
            ));
        };
        // SAFETY: `mw` is live and passed here once.
        let r = check_rc(Verb::DeallocMw, unsafe { dealloc(mw) });
        self.census.released(Kind::Mw, r)
    }

    fn create_cq(&self, depth: u32, channel: Option<u64>) -> Result<u64> {
        let depth = c_int::try_from(depth)
            .map_err(|_| Error::invalid(Verb::CreateCq, "depth out of range"))?;
        let channel = match channel {
            Some(c) => obj::<ffi::ibv_comp_channel>(Verb::CreateCq, c)?,
            None => ptr::null_mut(),
        };
        // SAFETY: the context is open; the channel (if any) is a live channel of it; no CQ
        // context, completion vector 0.
        let cq = unsafe { ffi::ibv_create_cq(self.ctx(), depth, ptr::null_mut(), channel, 0) };
        if cq.is_null() {
            return Err(Error::last(Verb::CreateCq));
        }
        Ok(cq as u64)
    }

    fn create_comp_channel(&self) -> Result<(u64, std::os::fd::RawFd)> {
        // SAFETY: the context is open.
        let ch = unsafe { ffi::ibv_create_comp_channel(self.ctx()) };
        if ch.is_null() {
            return Err(Error::last(Verb::CreateCompChannel));
        }
        // SAFETY: `ch` was just created.
        let fd = unsafe { (*ch).fd };
        // Non-blocking, so that taking events never blocks (the async path waits on the fd).
        if let Err(source) = set_nonblocking(fd) {
            let e = Error::Verb {
                verb: Verb::CreateCompChannel,
                source,
            };
            // SAFETY: `ch` is ours and unused.
            unsafe { ffi::ibv_destroy_comp_channel(ch) };
            return Err(e);
        }
        Ok((ch as u64, fd))
    }

    fn destroy_comp_channel(&self, channel: u64) -> Result<()> {
        let ch = obj::<ffi::ibv_comp_channel>(Verb::CreateCompChannel, channel)?;
        // SAFETY: `ch` is live, passed here once, and no CQ uses it any more (public layer).
        check_rc(Verb::CreateCompChannel, unsafe {
            ffi::ibv_destroy_comp_channel(ch)
        })
    }

    fn get_cq_events(&self, channel: u64) -> Result<u64> {
        let ch = obj::<ffi::ibv_comp_channel>(Verb::GetCqEvent, channel)?;
        let mut n = 0;
        loop {
            let mut cq: *mut ffi::ibv_cq = ptr::null_mut();
            let mut cq_ctx: *mut std::ffi::c_void = ptr::null_mut();
            // SAFETY: `ch` is live and non-blocking; the out pointers are ours.
            let rc = unsafe { ffi::ibv_get_cq_event(ch, &mut cq, &mut cq_ctx) };
            if rc != 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::WouldBlock {
                    return Ok(n);
                }
                return Err(Error::Verb {
                    verb: Verb::GetCqEvent,
                    source: e,
                });
            }
            // Acknowledged at once: `ibv_destroy_cq` waits for every event to be acked.
            // SAFETY: `cq` is the live CQ the event came from.
            unsafe { ffi::ibv_ack_cq_events(cq, 1) };
            n += 1;
        }
    }

    fn req_notify_cq(&self, cq: u64, solicited_only: bool) -> Result<()> {
        let cq = obj::<ffi::ibv_cq>(Verb::ReqNotifyCq, cq)?;
        // SAFETY: `cq` is live.
        unsafe { req_notify_cq_raw(cq, solicited_only) }
    }

    fn destroy_cq(&self, cq: u64) -> Result<()> {
        let cq = obj::<ffi::ibv_cq>(Verb::DestroyCq, cq)?;
        // SAFETY: `cq` is live, passed here once, and no QP uses it any more (public layer).
        check_rc(Verb::DestroyCq, unsafe { ffi::ibv_destroy_cq(cq) })
    }

    fn poll_cq(&self, cq: u64, out: &mut [Completion]) -> Result<usize> {
        let cq = obj::<ffi::ibv_cq>(Verb::PollCq, cq)?;
        // SAFETY: `cq` is live.
        unsafe { poll_cq_raw(cq, out) }
    }

    fn create_qp(
        &self,
        pd: u64,
        send_cq: u64,
        recv_cq: u64,
        srq: Option<u64>,
        caps: &QpCaps,
    ) -> Result<(u64, u32, QpCaps)> {
        let srq = match srq {
            Some(h) => obj::<ffi::ibv_srq>(Verb::CreateQp, h)?,
            None => ptr::null_mut(),
        };
        let pd = obj::<ffi::ibv_pd>(Verb::CreateQp, pd)?;
        let send_cq = obj::<ffi::ibv_cq>(Verb::CreateQp, send_cq)?;
        let recv_cq = obj::<ffi::ibv_cq>(Verb::CreateQp, recv_cq)?;
        // SAFETY: all-zero is a valid ibv_qp_init_attr.
        let mut init: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = send_cq;
        init.recv_cq = recv_cq;
        init.srq = srq;
        init.cap = ffi::ibv_qp_cap {
            max_send_wr: caps.max_send_wr,
            max_recv_wr: caps.max_recv_wr,
            max_send_sge: caps.max_send_sge,
            max_recv_sge: caps.max_recv_sge,
            max_inline_data: caps.max_inline_data,
        };
        init.qp_type = ffi::ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 0;
        // SAFETY: `pd` and the CQs are live objects of this device; `init` outlives the call.
        let qp = unsafe { ffi::ibv_create_qp(pd, &mut init) };
        if qp.is_null() {
            return Err(Error::last(Verb::CreateQp));
        }
        // SAFETY: `qp` was just created.
        let qpn = unsafe { (*qp).qp_num };
        // `ibv_create_qp` wrote back what the device granted (at least what was asked).
        let granted = QpCaps {
            max_send_wr: init.cap.max_send_wr.max(caps.max_send_wr),
            max_recv_wr: init.cap.max_recv_wr.max(caps.max_recv_wr),
            max_send_sge: caps.max_send_sge,
            max_recv_sge: caps.max_recv_sge,
            max_inline_data: init.cap.max_inline_data.max(caps.max_inline_data),
        };

        // SAFETY: `qp` was just created.
        let rc = unsafe { to_init(qp) };
        if let Err(e) = check_rc(Verb::ModifyQp, rc) {
            // SAFETY: `qp` is ours and unused.
            let rc = unsafe { ffi::ibv_destroy_qp(qp) };
            if rc != 0 {
                tracing::error!(
                    errno = rc_errno(rc),
                    "ibv_destroy_qp failed; the QP is leaked"
                );
            }
            return Err(e);
        }
        Ok((qp as u64, qpn, granted))
    }

    fn endpoint(&self, qp: u64, gid_index: u8) -> Result<Endpoint> {
        let qp = obj::<ffi::ibv_qp>(Verb::ModifyQp, qp)?;
        let ctx = self.ctx();
        // SAFETY: the context is open.
        let port =
            unsafe { query_port(ctx, PORT) }.map_err(|e| Error::from_errno(Verb::QueryPort, e))?;
        // SAFETY: all-zero is a valid ibv_gid.
        let mut gid: ffi::ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; `gid` is writable.
        let rc = unsafe { ffi::ibv_query_gid(ctx, PORT, c_int::from(gid_index), &mut gid) };
        check_rc(Verb::QueryGid, rc)?;
        // SAFETY: every bit pattern is a valid `raw`.
        let gid = unsafe { gid.raw };
        if port.link_layer == IBV_LINK_LAYER_ETHERNET && gid == [0; 16] {
            tracing::warn!(device = %self.caps.name,
                "RoCE GID index 0 is empty: the netdev has no IPv6 link-local address");
            return Err(Error::from_errno(Verb::QueryGid, libc::ENODATA));
        }
        // SAFETY: `qp` is live.
        let qpn = unsafe { (*qp).qp_num };
        Ok(Endpoint {
            gid,
            qpn,
            lid: port.lid,
            psn: psn_for(qpn),
        })
    }

    fn connect_qp(&self, qp: u64, remote: &Endpoint, opts: &ConnectOptions) -> Result<()> {
        let qp = obj::<ffi::ibv_qp>(Verb::ModifyQp, qp)?;
        // SAFETY: the context is open.
        let port = unsafe { query_port(self.ctx(), PORT) }
            .map_err(|e| Error::from_errno(Verb::QueryPort, e))?;
        // SAFETY: `qp` is live.
        let own_psn = psn_for(unsafe { (*qp).qp_num });
        use ffi::ibv_qp_attr_mask as m;
        // A QP created elsewhere (`Qp::from_raw`) may still be in RESET.
        // SAFETY: `qp` is live; libibverbs keeps `state` as its last modify set it.
        if unsafe { (*qp).state } == ffi::ibv_qp_state::IBV_QPS_RESET {
            // SAFETY: as above.
            check_rc(Verb::ModifyQp, unsafe { to_init(qp) })?;
        }

        // INIT -> RTR
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
        attr.path_mtu = match opts.path_mtu {
            Some(bytes) => mtu_enum(bytes).min(port.active_mtu),
            None => port.active_mtu,
        };
        self.rxe_odp.connected(mtu_bytes(attr.path_mtu));
        attr.dest_qp_num = remote.qpn;
        attr.rq_psn = psn_for(remote.psn);
        attr.max_dest_rd_atomic = 1;
        attr.min_rnr_timer = opts.min_rnr_timer;
        // A GID means routing by GRH (always on RoCE); an all-zero GID means LID routing (IB).
        attr.ah_attr.is_global = u8::from(remote.gid != [0; 16]);
        attr.ah_attr.grh.dgid = ffi::ibv_gid { raw: remote.gid };
        attr.ah_attr.grh.sgid_index = opts.gid_index;
        attr.ah_attr.grh.hop_limit = 1;
        attr.ah_attr.dlid = remote.lid;
        attr.ah_attr.sl = 0;
        attr.ah_attr.src_path_bits = 0;
        attr.ah_attr.port_num = PORT;
        let mask = m::IBV_QP_STATE
            | m::IBV_QP_AV
            | m::IBV_QP_PATH_MTU
            | m::IBV_QP_DEST_QPN
            | m::IBV_QP_RQ_PSN
            | m::IBV_QP_MAX_DEST_RD_ATOMIC
            | m::IBV_QP_MIN_RNR_TIMER;
        // SAFETY: `qp` is live; `attr` outlives the call.
        check_rc(Verb::ModifyQp, unsafe {
            ffi::ibv_modify_qp(qp, &mut attr, mask.0 as c_int)
        })?;

        // RTR -> RTS
        // SAFETY: as above.
        let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
        attr.timeout = opts.timeout;
        attr.retry_cnt = opts.retry_cnt;
        attr.rnr_retry = opts.rnr_retry;
        attr.sq_psn = own_psn;
        attr.max_rd_atomic = 1;
        let mask = m::IBV_QP_STATE
            | m::IBV_QP_TIMEOUT
            | m::IBV_QP_RETRY_CNT
            | m::IBV_QP_RNR_RETRY
            | m::IBV_QP_SQ_PSN
            | m::IBV_QP_MAX_QP_RD_ATOMIC;
        // SAFETY: as above.
        check_rc(Verb::ModifyQp, unsafe {
            ffi::ibv_modify_qp(qp, &mut attr, mask.0 as c_int)
        })
    }

    fn qp_state(&self, qp: u64) -> Result<QpState> {
        let qp = obj::<ffi::ibv_qp>(Verb::QueryQp, qp)?;
        // SAFETY: all-zero is valid for both structs.
        let (mut attr, mut init): (ffi::ibv_qp_attr, ffi::ibv_qp_init_attr) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE.0 as c_int;
        // SAFETY: `qp` is live; both out-structs are writable.
        check_rc(Verb::QueryQp, unsafe {
            ffi::ibv_query_qp(qp, &mut attr, mask, &mut init)
        })?;
        Ok(qp_state(attr.qp_state))
    }

    fn destroy_qp(&self, qp: u64) -> Result<()> {
        let qp = obj::<ffi::ibv_qp>(Verb::DestroyQp, qp)?;
        // SAFETY: `qp` is live and passed here once.
        check_rc(Verb::DestroyQp, unsafe { ffi::ibv_destroy_qp(qp) })
    }

    fn post_send(&self, qp: u64, wr: &RawSendWr<'_>) -> Result<()> {
        let qp = obj::<ffi::ibv_qp>(Verb::PostSend, qp)?;
        self.rxe_odp.check(Verb::PostSend, wr.sges)?;
        // SAFETY: `qp` (and, for `BIND_MW`, the window and region) are live objects of this
        // device (backend contract).
        unsafe { post_send_raw(qp, wr) }
    }

    fn post_send_list(
        &self,
        qp: u64,
        wrs: &[RawSendWr<'_>],
    ) -> std::result::Result<(), (usize, Error)> {
        let qp = obj::<ffi::ibv_qp>(Verb::PostSend, qp).map_err(|e| (0, e))?;
        for wr in wrs.iter().filter(|w| !w.inline) {
            self.rxe_odp
                .check(Verb::PostSend, wr.sges)
                .map_err(|e| (0, e))?;
        }
        // SAFETY: `qp` is a live object of this device (backend contract).
        unsafe { post_send_list_raw(qp, wrs) }
    }

    fn create_srq(&self, pd: u64, max_wr: u32, max_sge: u32) -> Result<u64> {
        let pd = obj::<ffi::ibv_pd>(Verb::CreateSrq, pd)?;
        // SAFETY: all-zero is a valid ibv_srq_init_attr.
        let mut init: ffi::ibv_srq_init_attr = unsafe { std::mem::zeroed() };
        init.attr.max_wr = max_wr;
        init.attr.max_sge = max_sge;
        // SAFETY: `pd` is a live PD of this device; `init` outlives the call.
        let srq = unsafe { ffi::ibv_create_srq(pd, &mut init) };
        if srq.is_null() {
            return Err(Error::last(Verb::CreateSrq));
        }
        Ok(srq as u64)
    }

    fn destroy_srq(&self, srq: u64) -> Result<()> {
        let srq = obj::<ffi::ibv_srq>(Verb::DestroySrq, srq)?;
        // SAFETY: `srq` is live, passed here once, and no QP uses it any more (public layer).
        check_rc(Verb::DestroySrq, unsafe { ffi::ibv_destroy_srq(srq) })
    }

    fn post_srq_recv(&self, srq: u64, wr_id: u64, sges: &[Sge]) -> Result<()> {
        let srq = obj::<ffi::ibv_srq>(Verb::PostSrqRecv, srq)?;
        self.rxe_odp.check(Verb::PostSrqRecv, sges)?;
        // SAFETY: `srq` is live.
        unsafe { post_srq_recv_raw(srq, wr_id, sges) }
    }

    fn post_recv(&self, qp: u64, wr_id: u64, sges: &[Sge]) -> Result<()> {
        let qp = obj::<ffi::ibv_qp>(Verb::PostRecv, qp)?;
        self.rxe_odp.check(Verb::PostRecv, sges)?;
        // SAFETY: `qp` is live.
        unsafe { post_recv_raw(qp, wr_id, sges) }
    }

    fn umem_reg(
        &self,
        addr: usize,
        len: usize,
        access: Access,
        pgsz_bitmap: u64,
    ) -> Result<(u64, u32)> {
        // SAFETY: the context is open and `devx` describes it; the range's validity is the
        // public layer's contract.
        unsafe { mlx5dv::umem_reg(self.devx, self.ctx(), addr, len, access, pgsz_bitmap) }
    }

    fn umem_dereg(&self, umem: u64) -> Result<()> {
        if umem == 0 {
            return Err(Error::invalid(Verb::UmemDereg, "null handle"));
        }
        // SAFETY: `umem` came from `umem_reg` and is passed here once (backend contract).
        unsafe { mlx5dv::umem_dereg(umem) }
    }
}
