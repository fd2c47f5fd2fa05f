//! The static-inline verbs of `verbs.h`, reimplemented: `ibv_post_send`, `ibv_post_recv`,
//! `ibv_poll_cq`, `ibv_bind_mw`, `ibv_advise_mr`, `ibv_query_device_ex`, `ibv_query_port`, and the
//! `verbs_get_ctx_op` lookup of a provider's extended op in its `struct verbs_context`.
//!
//! Why: rdma-sys 0.3's own versions `unwrap()` the provider's function pointers and skip checks
//! the C inlines make. Here a missing op is [`Error::Unsupported`] (`EOPNOTSUPP`), never a
//! panic, and the checks of the C inlines are kept (`ibv_bind_mw`: type 1 window, same PD).
//!
//! Contract: every function takes live objects (see each `# Safety`) and only builds, posts or
//! reads; none owns or frees anything. `IBV_ADVISE_MR_FLAG_FLUSH` is defined here because
//! rdma-sys does not generate it. Nothing here allocates except a scatter/gather list longer
//! than [`STACK_SGES`] entries.
//!
//! The C work requests the posts hand to the provider are built in `wr.rs`.

use super::conv::obj;
use super::wr::{bind_info, build_send_wr, num_sge};
use crate::nic::backend::{RawBind, RawSendOp, RawSendWr};
use crate::nic::error::{Error, Result, Verb, check_rc, rc_errno};
use crate::nic::types::{AdviseFlags, Completion, Rkey, Sge, WcOpcode, WcStatus};
use rdma_sys as ffi;
use std::ffi::c_int;
use std::io;
use std::mem::offset_of;
use std::ptr;

/// `IBV_ADVISE_MR_FLAG_FLUSH` (= `IB_UVERBS_ADVISE_MR_FLAG_FLUSH`). rdma-sys 0.3 does not generate
/// it: `verbs_api.h` `#define`s it to an `ib_uverbs_*` enumerator outside its allowlist.
pub(super) const IBV_ADVISE_MR_FLAG_FLUSH: u32 = 1;
const _: () = assert!(AdviseFlags::FLUSH.bits() == IBV_ADVISE_MR_FLAG_FLUSH);

/// `__VERBS_ABI_IS_EXTENDED`: `ibv_context::abi_compat` of contexts embedded in a
/// `struct verbs_context` (`(void *)UINTPTR_MAX`).
pub(super) const VERBS_ABI_IS_EXTENDED: usize = usize::MAX;

/// Completions polled per `ibv_poll_cq` call.
const POLL_CHUNK: usize = 16;
/// Scatter/gather entries converted on the stack; longer lists use the heap.
pub(super) const STACK_SGES: usize = 16;

/// Read the `struct verbs_context` field at offset `off`, whose type `_field` names (the
/// closure is never called; it only ties `T` to the field).
///
/// The field is addressed backwards from the embedded `ibv_context` (the C `container_of`), with
/// wrapping arithmetic: a provider built against other headers may have a smaller
/// `verbs_context`, which then starts after where ours would.
///
/// # Safety
/// `ctx` is an extended context (`abi_compat == __VERBS_ABI_IS_EXTENDED`), and the provider's
/// `verbs_context` contains the field (its `sz` covers it, or the field is `sz` itself).
pub(super) unsafe fn read_vctx_field<T: Copy>(
    ctx: *mut ffi::ibv_context,
    off: usize,
    _field: fn(&ffi::verbs_context) -> &T,
) -> T {
    let back = offset_of!(ffi::verbs_context, context) - off;
    let p = ctx.cast::<u8>().wrapping_sub(back).cast::<T>();
    // SAFETY: the field lies inside the provider's verbs_context (caller).
    unsafe { p.read() }
}

/// `verbs_get_ctx_op(ctx, op)`: the provider's extended op `$op`, or `None` when the context is
/// not extended, the provider's `verbs_context` predates the op, or the op is unset. Use only
/// where `$ctx` is a live context.
macro_rules! verbs_ctx_op {
    ($ctx:expr, $op:ident) => {{
        use ::rdma_sys::{ibv_context, verbs_context};
        use ::std::mem::offset_of;
        use $crate::nic::verbs::inlines::{VERBS_ABI_IS_EXTENDED, read_vctx_field};
        let ctx: *mut ibv_context = $ctx;
        // SAFETY: `ctx` is a live context (the macro's contract).
        if unsafe { (*ctx).abi_compat } as usize != VERBS_ABI_IS_EXTENDED {
            None
        } else {
            let op_off = offset_of!(verbs_context, $op);
            // SAFETY: extended contexts sit at the end of a verbs_context, right after `sz`.
            let sz = unsafe {
                read_vctx_field(ctx, offset_of!(verbs_context, sz), |v: &verbs_context| {
                    &v.sz
                })
            };
            if sz < size_of::<verbs_context>() - op_off {
                None
            } else {
                // SAFETY: `sz` says the provider's verbs_context reaches back to the op.
                unsafe { read_vctx_field(ctx, op_off, |v: &verbs_context| &v.$op) }
            }
        }
    }};
}
#[cfg(test)]
pub(super) use verbs_ctx_op;

/// `ibv_query_device_ex(ctx, NULL, attr)`, falling back to `ibv_query_device` as the C inline
/// does. Returns the errno on failure.
///
/// # Safety
/// `ctx` is a live context.
pub(super) unsafe fn query_device_ex(
    ctx: *mut ffi::ibv_context,
) -> Result<ffi::ibv_device_attr_ex, i32> {
    // SAFETY: all-zero is a valid ibv_device_attr_ex (integers and arrays of them).
    let mut attr: ffi::ibv_device_attr_ex = unsafe { std::mem::zeroed() };
    if let Some(op) = verbs_ctx_op!(ctx, query_device_ex) {
        // SAFETY: `ctx` is live; `attr` is writable for the size we pass.
        let rc = unsafe {
            op(
                ctx,
                ptr::null(),
                &mut attr,
                size_of::<ffi::ibv_device_attr_ex>(),
            )
        };
        if rc != libc::EOPNOTSUPP && rc != libc::ENOSYS {
            return if rc == 0 { Ok(attr) } else { Err(rc_errno(rc)) };
        }
        // SAFETY: as above.
        attr = unsafe { std::mem::zeroed() };
    }
    // SAFETY: `ctx` is live; `orig_attr` is a writable ibv_device_attr.
    let rc = unsafe { ffi::ibv_query_device(ctx, &mut attr.orig_attr) };
    if rc == 0 { Ok(attr) } else { Err(rc_errno(rc)) }
}

/// `ibv_query_port` (the `___ibv_query_port` inline). Returns the errno on failure.
///
/// # Safety
/// `ctx` is a live context.
pub(super) unsafe fn query_port(
    ctx: *mut ffi::ibv_context,
    port: u8,
) -> Result<ffi::ibv_port_attr, i32> {
    // SAFETY: all-zero is a valid ibv_port_attr.
    let mut attr: ffi::ibv_port_attr = unsafe { std::mem::zeroed() };
    let rc = match verbs_ctx_op!(ctx, query_port) {
        // SAFETY: `ctx` is live; `attr` is writable for the size we pass.
        Some(op) => unsafe { op(ctx, port, &mut attr, size_of::<ffi::ibv_port_attr>()) },
        // SAFETY: the legacy entry point fills the compat prefix of ibv_port_attr.
        None => unsafe {
            ffi::ibv_query_port(
                ctx,
                port,
                (&raw mut attr).cast::<ffi::_compat_ibv_port_attr>(),
            )
        },
    };
    if rc == 0 { Ok(attr) } else { Err(rc_errno(rc)) }
}

/// `ibv_advise_mr`. Returns the verb's return code (0 or an errno).
///
/// # Safety
/// `pd` is a live PD; `sg_list` points at `num_sge` entries.
pub(super) unsafe fn advise_mr_raw(
    pd: *mut ffi::ibv_pd,
    advice: u32,
    flags: u32,
    sg_list: *mut ffi::ibv_sge,
    num_sge: u32,
) -> c_int {
    // SAFETY: `pd` is live, so is its context.
    let ctx = unsafe { (*pd).context };
    match verbs_ctx_op!(ctx, advise_mr) {
        // SAFETY: arguments as the C inline passes them; validity from the caller.
        Some(op) => unsafe { op(pd, advice, flags, sg_list, num_sge) },
        None => libc::EOPNOTSUPP,
    }
}

/// One SGE as `struct ibv_sge`.
fn conv(s: &Sge) -> ffi::ibv_sge {
    ffi::ibv_sge {
        addr: s.addr,
        length: s.length,
        lkey: s.lkey.0,
    }
}

/// Convert `sges` to `struct ibv_sge` and run `f` on the list (NULL when empty) and its length.
pub(super) fn with_ibv_sges<R>(sges: &[Sge], f: impl FnOnce(*mut ffi::ibv_sge, usize) -> R) -> R {
    if sges.is_empty() {
        f(ptr::null_mut(), 0)
    } else if sges.len() <= STACK_SGES {
        let mut buf = [ffi::ibv_sge {
            addr: 0,
            length: 0,
            lkey: 0,
        }; STACK_SGES];
        for (d, s) in buf.iter_mut().zip(sges) {
            *d = conv(s);
        }
        f(buf.as_mut_ptr(), sges.len())
    } else {
        let mut v: Vec<ffi::ibv_sge> = sges.iter().map(conv).collect();
        f(v.as_mut_ptr(), v.len())
    }
}

/// `ibv_post_send` of one work request. For `BIND_MW`, `ibv_mw::rkey` is set to the window's
/// current key before posting (rxe reads it from there) and to the new key once posted, as
/// `ibv_bind_mw(3)` does for type 1.
///
/// # Safety
/// `qp` is a live QP; for `BIND_MW`, the window and region handles are live objects of its
/// device; the SGEs name registered memory.
pub(super) unsafe fn post_send_raw(qp: *mut ffi::ibv_qp, wr: &RawSendWr<'_>) -> Result<()> {
    let mw = match wr.op {
        RawSendOp::BindMw {
            mw,
            mw_rkey,
            new_rkey,
            bind,
        } => {
            let mw = obj::<ffi::ibv_mw>(Verb::PostSend, mw)?;
            obj::<ffi::ibv_mr>(Verb::PostSend, bind.mr)?;
            Some((mw, mw_rkey, new_rkey))
        }
        _ => None,
    };
    // SAFETY: `qp` and its context are live.
    let Some(post) = (unsafe { (*(*qp).context).ops.post_send }) else {
        return Err(Error::unsupported(
            Verb::PostSend,
            "the provider has no post_send",
        ));
    };
    let n = num_sge(Verb::PostSend, wr.sges.len())?;
    with_ibv_sges(wr.sges, |list, _| {
        let mut swr = build_send_wr(wr, list, n);
        if let Some((mw, mw_rkey, _)) = mw {
            // SAFETY: `mw` is a live window (caller); the public layer binds it through `&mut`,
            // so nothing else touches it now.
            unsafe { (*mw).rkey = mw_rkey.0 };
        }
        let mut bad: *mut ffi::ibv_send_wr = ptr::null_mut();
        // SAFETY: `qp` is live; `swr` and the SGE list it points at outlive the call.
        let rc = unsafe { post(qp, &mut swr, &mut bad) };
        check_rc(Verb::PostSend, rc)?;
        if let Some((mw, _, new_rkey)) = mw {
            // SAFETY: as above.
            unsafe { (*mw).rkey = new_rkey.0 };
        }
        Ok(())
    })
}

/// `ibv_post_send` of a chain of work requests (no binds): one call, one doorbell. On failure
/// returns how many of them were posted (the provider's `bad_wr` is the first not posted).
///
/// # Safety
/// `qp` is a live QP; the SGEs name registered memory (or, inline, readable memory).
pub(super) unsafe fn post_send_list_raw(
    qp: *mut ffi::ibv_qp,
    wrs: &[RawSendWr<'_>],
) -> std::result::Result<(), (usize, Error)> {
    if wrs.is_empty() {
        return Ok(());
    }
    // SAFETY: `qp` and its context are live.
    let Some(post) = (unsafe { (*(*qp).context).ops.post_send }) else {
        let e = Error::unsupported(Verb::PostSend, "the provider has no post_send");
        return Err((0, e));
    };
    let mut sges: Vec<Vec<ffi::ibv_sge>> = Vec::with_capacity(wrs.len());
    let mut chain: Vec<ffi::ibv_send_wr> = Vec::with_capacity(wrs.len());
    for wr in wrs {
        if matches!(wr.op, RawSendOp::BindMw { .. }) {
            return Err((0, Error::invalid(Verb::PostSend, "a bind in a batch")));
        }
        let n = num_sge(Verb::PostSend, wr.sges.len()).map_err(|e| (0, e))?;
        let mut list: Vec<ffi::ibv_sge> = wr.sges.iter().map(conv).collect();
        let head = if list.is_empty() {
            ptr::null_mut()
        } else {
            list.as_mut_ptr()
        };
        chain.push(build_send_wr(wr, head, n));
        // The Vec's heap buffer does not move when the Vec itself is moved.
        sges.push(list);
    }
    let base = chain.as_mut_ptr();
    for i in 0..chain.len() - 1 {
        // SAFETY: `i + 1 < chain.len()`: both are elements of `chain`, which is not resized.
        unsafe { (*base.add(i)).next = base.add(i + 1) };
    }
    let mut bad: *mut ffi::ibv_send_wr = ptr::null_mut();
    // SAFETY: `qp` is live; the chain and its SGE lists outlive the call.
    let rc = unsafe { post(qp, base, &mut bad) };
    match check_rc(Verb::PostSend, rc) {
        Ok(()) => Ok(()),
        Err(e) => {
            let posted = if bad.is_null() {
                0
            } else {
                // SAFETY: the provider points `bad` into the chain it was given.
                (unsafe { bad.offset_from(base) }).clamp(0, wrs.len() as isize) as usize
            };
            Err((posted, e))
        }
    }
}

/// `ibv_req_notify_cq` (an inline of `verbs.h`: the provider's op).
///
/// # Safety
/// `cq` is a live CQ.
pub(super) unsafe fn req_notify_cq_raw(cq: *mut ffi::ibv_cq, solicited_only: bool) -> Result<()> {
    // SAFETY: `cq` and its context are live.
    let Some(op) = (unsafe { (*(*cq).context).ops.req_notify_cq }) else {
        return Err(Error::unsupported(
            Verb::ReqNotifyCq,
            "the provider has no req_notify_cq",
        ));
    };
    // SAFETY: `cq` is live.
    check_rc(Verb::ReqNotifyCq, unsafe {
        op(cq, c_int::from(solicited_only))
    })
}

/// One receive work request of `sges`, posted by `post` (the provider's `post_recv` or
/// `post_srq_recv` bound to its queue).
fn post_one_recv(
    verb: Verb,
    wr_id: u64,
    sges: &[Sge],
    post: impl FnOnce(*mut ffi::ibv_recv_wr, *mut *mut ffi::ibv_recv_wr) -> c_int,
) -> Result<()> {
    let n = num_sge(verb, sges.len())?;
    with_ibv_sges(sges, |list, _| {
        let mut rwr = ffi::ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: list,
            num_sge: n,
        };
        let mut bad: *mut ffi::ibv_recv_wr = ptr::null_mut();
        check_rc(verb, post(&mut rwr, &mut bad))
    })
}

/// `ibv_post_recv` of one work request.
///
/// # Safety
/// `qp` is a live QP; the SGEs name registered memory.
pub(super) unsafe fn post_recv_raw(qp: *mut ffi::ibv_qp, wr_id: u64, sges: &[Sge]) -> Result<()> {
    // SAFETY: `qp` and its context are live.
    let Some(post) = (unsafe { (*(*qp).context).ops.post_recv }) else {
        return Err(Error::unsupported(
            Verb::PostRecv,
            "the provider has no post_recv",
        ));
    };
    // SAFETY: `qp` is live; the request and its SGE list outlive the call.
    post_one_recv(Verb::PostRecv, wr_id, sges, |wr, bad| unsafe {
        post(qp, wr, bad)
    })
}

/// `ibv_post_srq_recv` of one work request.
///
/// # Safety
/// `srq` is a live SRQ; the SGEs name registered memory.
pub(super) unsafe fn post_srq_recv_raw(
    srq: *mut ffi::ibv_srq,
    wr_id: u64,
    sges: &[Sge],
) -> Result<()> {
    // SAFETY: `srq` and its context are live.
    let Some(post) = (unsafe { (*(*srq).context).ops.post_srq_recv }) else {
        return Err(Error::unsupported(
            Verb::PostSrqRecv,
            "the provider has no post_srq_recv",
        ));
    };
    // SAFETY: `srq` is live; the request and its SGE list outlive the call.
    post_one_recv(Verb::PostSrqRecv, wr_id, sges, |wr, bad| unsafe {
        post(srq, wr, bad)
    })
}

/// `ibv_bind_mw` (type 1), with the checks of the C inline; returns the window's new rkey.
///
/// # Safety
/// `qp`, `mw` and `bind.mr` are live objects of one device.
pub(super) unsafe fn bind_mw_raw(
    qp: *mut ffi::ibv_qp,
    mw: *mut ffi::ibv_mw,
    mw_rkey: Rkey,
    bind: &RawBind,
) -> Result<Rkey> {
    let mr = obj::<ffi::ibv_mr>(Verb::BindMw, bind.mr)?;
    // SAFETY: `mw` and `mr` are live (caller).
    let (ty, mw_pd, mr_pd, ctx) = unsafe { ((*mw).type_, (*mw).pd, (*mr).pd, (*mw).context) };
    if ty != ffi::ibv_mw_type::IBV_MW_TYPE_1 {
        return Err(Error::from_errno(Verb::BindMw, libc::EINVAL));
    }
    if mw_pd != mr_pd {
        return Err(Error::from_errno(Verb::BindMw, libc::EPERM));
    }
    // SAFETY: the window's context is live.
    let Some(op) = (unsafe { (*ctx).ops.bind_mw }) else {
        return Err(Error::unsupported(
            Verb::BindMw,
            "the provider has no bind_mw",
        ));
    };
    let mut mw_bind = ffi::ibv_mw_bind {
        wr_id: bind.wr_id,
        send_flags: if bind.signaled {
            ffi::ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        },
        bind_info: bind_info(bind),
    };
    // SAFETY: `mw` is live and bound through `&mut` above this layer: the provider derives the
    // new key from `rkey`, which must be the window's current key.
    unsafe { (*mw).rkey = mw_rkey.0 };
    // SAFETY: `qp`, `mw` are live; `mw_bind` outlives the call.
    let rc = unsafe { op(qp, mw, &mut mw_bind) };
    check_rc(Verb::BindMw, rc)?;
    // SAFETY: `mw` is live; the provider stored the new key.
    Ok(Rkey(unsafe { (*mw).rkey }))
}

/// A work completion as the public layer sees it. On error completions only `wr_id`, `status`
/// and `qp_num` are defined by the verbs spec; the opcode is then whatever the provider left
/// (the buffer is zeroed first, so usually `Send`).
pub(super) fn completion(wc: &ffi::ibv_wc) -> Completion {
    use ffi::ibv_wc_opcode as op;
    let opcode = match wc.opcode {
        op::IBV_WC_SEND => WcOpcode::Send,
        op::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
        op::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
        op::IBV_WC_BIND_MW => WcOpcode::BindMw,
        op::IBV_WC_LOCAL_INV => WcOpcode::LocalInv,
        op::IBV_WC_COMP_SWAP => WcOpcode::CompareSwap,
        op::IBV_WC_FETCH_ADD => WcOpcode::FetchAdd,
        op::IBV_WC_RECV => WcOpcode::Recv,
        op::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        other => WcOpcode::Other(other),
    };
    let with_inv = wc.wc_flags & ffi::ibv_wc_flags::IBV_WC_WITH_INV.0 != 0;
    let with_imm = wc.wc_flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
    // SAFETY: both members of the union are plain u32.
    let inv = unsafe { wc.imm_data_invalidated_rkey_union.invalidated_rkey };
    // SAFETY: as above.
    let imm = u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data });
    Completion {
        wr_id: wc.wr_id,
        status: WcStatus::from_raw(wc.status),
        opcode,
        byte_len: wc.byte_len,
        qp_num: wc.qp_num,
        invalidated_rkey: with_inv.then_some(Rkey(inv)),
        imm_data: with_imm.then_some(imm),
    }
}

/// `ibv_poll_cq` into `out`, in chunks of [`POLL_CHUNK`], until `out` is full or the CQ empty.
///
/// # Safety
/// `cq` is a live CQ.
pub(super) unsafe fn poll_cq_raw(cq: *mut ffi::ibv_cq, out: &mut [Completion]) -> Result<usize> {
    // SAFETY: `cq` and its context are live.
    let Some(poll) = (unsafe { (*(*cq).context).ops.poll_cq }) else {
        return Err(Error::unsupported(
            Verb::PollCq,
            "the provider has no poll_cq",
        ));
    };
    let mut done = 0;
    while done < out.len() {
        let want = (out.len() - done).min(POLL_CHUNK);
        // SAFETY: all-zero is a valid ibv_wc.
        let mut wcs: [ffi::ibv_wc; POLL_CHUNK] = unsafe { std::mem::zeroed() };
        // SAFETY: `cq` is live; `wcs` has room for `want` (<= POLL_CHUNK) completions.
        let n = unsafe { poll(cq, want as c_int, wcs.as_mut_ptr()) };
        let Ok(n) = usize::try_from(n) else {
            if done > 0 {
                // Deliver what was consumed; the error shows again on the next poll.
                break;
            }
            return Err(Error::Verb {
                verb: Verb::PollCq,
                source: io::Error::other(format!("ibv_poll_cq returned {n}")),
            });
        };
        let n = n.min(want);
        for (o, wc) in out[done..].iter_mut().zip(&wcs[..n]) {
            *o = completion(wc);
        }
        done += n;
        if n < want {
            break;
        }
    }
    Ok(done)
}
