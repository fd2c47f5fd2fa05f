//! The verbs backend's [`Backend`] impl for [`VerbsNic`]: each operation of the NIC boundary
//! as its libibverbs verb (or its reimplemented inline, `inlines.rs`), with the errno the verb
//! reported.
//!
//! Contract: see `mod.rs` — every handle is the object pointer; ODP data rxe would corrupt is
//! refused before the post; regions and windows are counted ([`Census`]) so the limits the
//! device reports as `ENOMEM`/`EINVAL` come back as `Error::Limit`.
//!
//! [`Census`]: super::census::Census

use super::census::Kind;
use super::conv::{PORT, obj, raw_mr, rereg_args};
use super::device::mtu_bytes;
use super::inlines::{
    advise_mr_raw, bind_mw_raw, poll_cq_raw, post_recv_raw, post_send_list_raw, post_send_raw,
    post_srq_recv_raw, query_port, req_notify_cq_raw, with_ibv_sges,
};
use super::qp_attr::{IBV_LINK_LAYER_ETHERNET, mtu_enum, psn_for, qp_state, to_init};
use super::{VerbsNic, mlx5dv, set_nonblocking};
use crate::nic::backend::{Backend, RawBind, RawMr, RawSendWr};
use crate::nic::error::{
    Error, ReregError, ReregErrorKind, Result, Verb, check_rc, last_errno, rc_errno,
};
use crate::nic::types::{
    Access, Advice, AdviseFlags, Caps, Completion, ConnectOptions, Endpoint, ForkStatus, MwType,
    NicKind, QpCaps, QpState, ReregFlags, Rkey, Sge,
};
use rdma_sys as ffi;
use std::any::Any;
use std::ffi::{c_int, c_void};
use std::ptr;

impl Backend for VerbsNic {
    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn kind(&self) -> NicKind {
        NicKind::Verbs
    }

    fn poll_async_event(&self) -> Result<Option<crate::nic::types::AsyncEvent>> {
        let last_error = |verb| {
            let e = std::io::Error::last_os_error();
            Error::from_errno(verb, e.raw_os_error().unwrap_or(libc::EIO))
        };
        use crate::nic::types::AsyncEvent;
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
