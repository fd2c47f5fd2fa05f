//! The reimplemented inlines and [`Nic::from_raw_context`](crate::nic::Nic::from_raw_context)
//! against a fake provider: zeroed `verbs_context`/`ibv_*` structs in boxes, with test ops that
//! record what they were given (thread-local, so tests may run in parallel).

use super::super::device::RXE_VENDOR_ID;
use super::super::inlines::{
    IBV_ADVISE_MR_FLAG_FLUSH, STACK_SGES, VERBS_ABI_IS_EXTENDED, advise_mr_raw, bind_mw_raw,
    poll_cq_raw, post_send_list_raw, post_send_raw, verbs_ctx_op, with_ibv_sges,
};
use super::super::*;
use crate::nic::backend::RawSendOp;
use crate::nic::types::{WcOpcode, WcStatus};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void};
use std::mem::offset_of;

/// A zeroed extended context with the given ops, as libibverbs lays one out.
fn fake_context() -> Box<ffi::verbs_context> {
    // SAFETY: all-zero is a valid verbs_context (null ops, zero integers, opaque mutex).
    let mut v: Box<ffi::verbs_context> = Box::new(unsafe { std::mem::zeroed() });
    v.sz = size_of::<ffi::verbs_context>();
    v.context.abi_compat = VERBS_ABI_IS_EXTENDED as *mut c_void;
    v
}

fn zeroed<T>() -> Box<T> {
    // SAFETY: used only for the plain-data verbs structs below, valid when all-zero.
    Box::new(unsafe { std::mem::zeroed() })
}

#[derive(Debug, Clone, Default, PartialEq)]
struct SeenWr {
    opcode: u32,
    flags: u32,
    sges: Vec<(u64, u32, u32)>,
    inv_rkey: u32,
    rdma: (u64, u32),
    bind_rkey: u32,
    bind_mw_current_rkey: u32,
    bind: (usize, u64, u64, u32),
}

thread_local! {
    static SEEN: RefCell<Vec<SeenWr>> = const { RefCell::new(Vec::new()) };
    static POST_RC: RefCell<c_int> = const { RefCell::new(0) };
    static BAD_AT: RefCell<Option<usize>> = const { RefCell::new(None) };
    static PENDING: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    static ADVISED: RefCell<Vec<(u32, u32, u32, u64)>> = const { RefCell::new(Vec::new()) };
}

extern "C" fn fake_post_send(
    _qp: *mut ffi::ibv_qp,
    mut wr: *mut ffi::ibv_send_wr,
    bad: *mut *mut ffi::ibv_send_wr,
) -> c_int {
    // A chain: each request is recorded in turn; with `BAD_AT` set, the one at that index is
    // refused (ENOMEM) and named in `bad`, as a provider whose queue filled up does.
    let mut i = 0;
    while !wr.is_null() {
        if BAD_AT.with(|b| *b.borrow()) == Some(i) {
            // SAFETY: `bad` is the caller's out pointer.
            unsafe { *bad = wr };
            return libc::ENOMEM;
        }
        let rc = fake_post_one(wr);
        if rc != 0 {
            // SAFETY: as above.
            unsafe { *bad = wr };
            return rc;
        }
        // SAFETY: `wr` is an element of the caller's chain.
        wr = unsafe { (*wr).next };
        i += 1;
    }
    0
}

fn fake_post_one(wr: *mut ffi::ibv_send_wr) -> c_int {
    // SAFETY: `wr` is the request post_send_raw built; its SGE list has `num_sge` entries,
    // and the union members read are plain data (the window pointer only for BIND_MW).
    let seen = unsafe {
        let w = &*wr;
        let sges = (0..w.num_sge as usize)
            .map(|i| {
                let s = *w.sg_list.add(i);
                (s.addr, s.length, s.lkey)
            })
            .collect();
        let b = w.bind_mw_tso_union.bind_mw;
        SeenWr {
            opcode: w.opcode,
            flags: w.send_flags,
            sges,
            inv_rkey: w.imm_data_invalidated_rkey_union.invalidated_rkey,
            rdma: (w.wr.rdma.remote_addr, w.wr.rdma.rkey),
            bind_rkey: b.rkey,
            bind_mw_current_rkey: if b.mw.is_null() { 0 } else { (*b.mw).rkey },
            bind: (
                b.bind_info.mr as usize,
                b.bind_info.addr,
                b.bind_info.length,
                b.bind_info.mw_access_flags,
            ),
        }
    };
    SEEN.with(|s| s.borrow_mut().push(seen));
    POST_RC.with(|r| *r.borrow())
}

extern "C" fn fake_poll(_cq: *mut ffi::ibv_cq, n: c_int, wc: *mut ffi::ibv_wc) -> c_int {
    PENDING.with(|p| {
        let mut p = p.borrow_mut();
        if p.first() == Some(&u64::MAX) {
            return -2; // a provider error (mlx5's CQ_POLL_ERR)
        }
        let k = p.len().min(n as usize);
        for (i, id) in p.drain(..k).enumerate() {
            // SAFETY: the caller passed room for `n` >= `k` completions.
            unsafe {
                (*wc.add(i)).wr_id = id;
                (*wc.add(i)).opcode = ffi::ibv_wc_opcode::IBV_WC_RDMA_WRITE;
            }
        }
        k as c_int
    })
}

extern "C" fn fake_advise(
    _pd: *mut ffi::ibv_pd,
    advice: u32,
    flags: u32,
    sg: *mut ffi::ibv_sge,
    n: u32,
) -> c_int {
    // SAFETY: advise_mr_raw passes a list of `n` >= 1 entries here.
    let first = unsafe { (*sg).addr };
    ADVISED.with(|a| a.borrow_mut().push((advice, flags, n, first)));
    0
}

/// Like the rxe and mlx5 providers: posts a bind with `ibv_inc_rkey(mw->rkey)` and stores it.
extern "C" fn fake_bind(
    qp: *mut ffi::ibv_qp,
    mw: *mut ffi::ibv_mw,
    b: *mut ffi::ibv_mw_bind,
) -> c_int {
    // SAFETY: the pointers are the live fakes bind_mw_raw was given.
    unsafe {
        let mut wr: ffi::ibv_send_wr = std::mem::zeroed();
        wr.opcode = ffi::ibv_wr_opcode::IBV_WR_BIND_MW;
        wr.wr_id = (*b).wr_id;
        wr.send_flags = (*b).send_flags;
        wr.bind_mw_tso_union.bind_mw = ffi::bind_mw_t {
            mw,
            rkey: Rkey((*mw).rkey).next_variant().0,
            bind_info: (*b).bind_info,
        };
        let rc = fake_post_send(qp, &mut wr, ptr::null_mut());
        if rc == 0 {
            (*mw).rkey = wr.bind_mw_tso_union.bind_mw.rkey;
        }
        rc
    }
}

fn ctx_of(v: &mut ffi::verbs_context) -> *mut ffi::ibv_context {
    &raw mut v.context
}

#[test]
fn verbs_context_ops_are_found_only_where_the_provider_has_them() {
    let mut v = fake_context();
    assert!(
        verbs_ctx_op!(ctx_of(&mut v), advise_mr).is_none(),
        "unset op"
    );
    v.advise_mr = Some(fake_advise);
    assert!(verbs_ctx_op!(ctx_of(&mut v), advise_mr).is_some());
    // A provider's verbs_context that ends just after the op still has it …
    v.sz = size_of::<ffi::verbs_context>() - offset_of!(ffi::verbs_context, advise_mr);
    assert!(verbs_ctx_op!(ctx_of(&mut v), advise_mr).is_some());
    // … one a byte shorter predates it.
    v.sz -= 1;
    assert!(verbs_ctx_op!(ctx_of(&mut v), advise_mr).is_none());
    v.sz = size_of::<ffi::verbs_context>();
    v.context.abi_compat = ptr::null_mut();
    assert!(
        verbs_ctx_op!(ctx_of(&mut v), advise_mr).is_none(),
        "legacy context"
    );
}

#[test]
fn advise_goes_to_the_provider_op_or_is_unsupported() {
    let mut bare = fake_context();
    let mut with_op = fake_context();
    with_op.advise_mr = Some(fake_advise);
    let mut pd_bare = zeroed::<ffi::ibv_pd>();
    pd_bare.context = ctx_of(&mut bare);
    let mut pd_op = zeroed::<ffi::ibv_pd>();
    pd_op.context = ctx_of(&mut with_op);
    let sges = [Sge {
        addr: 0x7000,
        length: 4096,
        lkey: Lkey(5),
    }];
    let run = |pd: &mut ffi::ibv_pd| {
        with_ibv_sges(&sges, |list, n| {
            let (advice, flags) = (Advice::PrefetchWrite as u32, AdviseFlags::FLUSH.bits());
            // SAFETY: `pd` is a live fake; `list` has `n` entries.
            unsafe { advise_mr_raw(pd, advice, flags, list, n as u32) }
        })
    };
    assert!(
        check_rc(Verb::AdviseMr, run(&mut pd_bare))
            .unwrap_err()
            .is_unsupported()
    );
    assert_eq!(run(&mut pd_op), 0);
    let advised = ADVISED.with(|a| a.borrow().clone());
    assert_eq!(advised, [(1, IBV_ADVISE_MR_FLAG_FLUSH, 1, 0x7000)]);
}

struct FakeQp {
    _v: Box<ffi::verbs_context>,
    qp: Box<ffi::ibv_qp>,
    pd: Box<ffi::ibv_pd>,
}

fn fake_qp() -> FakeQp {
    let mut v = fake_context();
    v.context.ops.post_send = Some(fake_post_send);
    v.context.ops.poll_cq = Some(fake_poll);
    v.context.ops.bind_mw = Some(fake_bind);
    let ctx = &raw mut v.context;
    let mut qp = zeroed::<ffi::ibv_qp>();
    qp.context = ctx;
    let mut pd = zeroed::<ffi::ibv_pd>();
    pd.context = ctx;
    SEEN.with(|s| s.borrow_mut().clear());
    POST_RC.with(|r| *r.borrow_mut() = 0);
    FakeQp { _v: v, qp, pd }
}

fn post(f: &mut FakeQp, wr: &RawSendWr<'_>) -> Result<()> {
    // SAFETY: the fake QP and the window/region handles of `wr` are live boxes.
    unsafe { post_send_raw(&raw mut *f.qp, wr) }
}

fn last_seen() -> SeenWr {
    SEEN.with(|s| s.borrow().last().cloned())
        .unwrap_or_default()
}

#[test]
fn send_requests_carry_opcode_keys_and_sges() {
    use ffi::ibv_wr_opcode::*;
    let mut f = fake_qp();
    let sges: Vec<Sge> = (0..20)
        .map(|i| Sge {
            addr: 0x1000 * i,
            length: 8 + i as u32,
            lkey: Lkey(0x300 + i as u32),
        })
        .collect();
    let signaled = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
    for n in [0, 1, 2, STACK_SGES, 20] {
        let wr = RawSendWr {
            wr_id: 1,
            signaled: true,
            inline: false,
            solicited: false,
            sges: &sges[..n],
            op: RawSendOp::Send,
        };
        post(&mut f, &wr).unwrap();
        let seen = last_seen();
        assert_eq!((seen.opcode, seen.flags), (IBV_WR_SEND, signaled));
        let want: Vec<_> = sges[..n]
            .iter()
            .map(|s| (s.addr, s.length, s.lkey.0))
            .collect();
        assert_eq!(seen.sges, want, "{n} SGEs");
    }
    let ops = [
        (RawSendOp::SendWithInv(Rkey(0x4411)), IBV_WR_SEND_WITH_INV),
        (RawSendOp::LocalInv(Rkey(0x4412)), IBV_WR_LOCAL_INV),
        (
            RawSendOp::Write {
                remote_addr: 0xa000,
                rkey: Rkey(0x77),
            },
            IBV_WR_RDMA_WRITE,
        ),
        (
            RawSendOp::Read {
                remote_addr: 0xb000,
                rkey: Rkey(0x78),
            },
            IBV_WR_RDMA_READ,
        ),
    ];
    for (op, opcode) in ops {
        let wr = RawSendWr {
            wr_id: 2,
            signaled: false,
            inline: false,
            solicited: false,
            sges: &sges[..1],
            op,
        };
        post(&mut f, &wr).unwrap();
        let seen = last_seen();
        assert_eq!((seen.opcode, seen.flags), (opcode, 0));
        match op {
            RawSendOp::SendWithInv(k) | RawSendOp::LocalInv(k) => {
                assert_eq!(seen.inv_rkey, k.0)
            }
            RawSendOp::Write { remote_addr, rkey } | RawSendOp::Read { remote_addr, rkey } => {
                assert_eq!(seen.rdma, (remote_addr, rkey.0))
            }
            _ => unreachable!(),
        }
    }
    POST_RC.with(|r| *r.borrow_mut() = libc::ENOMEM);
    let wr = RawSendWr {
        wr_id: 3,
        signaled: true,
        inline: false,
        solicited: false,
        sges: &[],
        op: RawSendOp::Send,
    };
    assert_eq!(post(&mut f, &wr).unwrap_err().errno(), Some(libc::ENOMEM));
}

#[test]
fn type2_bind_keeps_the_window_key_in_step() {
    let mut f = fake_qp();
    let mut mw = zeroed::<ffi::ibv_mw>();
    mw.type_ = ffi::ibv_mw_type::IBV_MW_TYPE_2;
    mw.rkey = 0x0100; // stale: what the provider would read without the sync
    let mut mr = zeroed::<ffi::ibv_mr>();
    let mw_h = &raw mut *mw as u64;
    let mr_h = &raw mut *mr as u64;
    let bind = RawBind {
        wr_id: 4,
        signaled: true,
        mr: mr_h,
        mr_lkey: Lkey(1),
        addr: 0x5000,
        len: 256,
        access: Access::REMOTE_READ,
    };
    let op = RawSendOp::BindMw {
        mw: mw_h,
        mw_rkey: Rkey(0x0105),
        new_rkey: Rkey(0x0106),
        bind,
    };
    post(
        &mut f,
        &RawSendWr {
            wr_id: 4,
            signaled: true,
            inline: false,
            solicited: false,
            sges: &[],
            op,
        },
    )
    .unwrap();
    let seen = last_seen();
    assert_eq!(seen.opcode, ffi::ibv_wr_opcode::IBV_WR_BIND_MW);
    assert_eq!(
        (seen.bind_mw_current_rkey, seen.bind_rkey),
        (0x0105, 0x0106)
    );
    assert_eq!(
        seen.bind,
        (mr_h as usize, 0x5000, 256, Access::REMOTE_READ.bits())
    );
    assert!(seen.sges.is_empty());
    assert_eq!(mw.rkey, 0x0106);

    // A refused post leaves the window at the key the caller still holds.
    POST_RC.with(|r| *r.borrow_mut() = libc::EINVAL);
    let op = RawSendOp::BindMw {
        mw: mw_h,
        mw_rkey: Rkey(0x0106),
        new_rkey: Rkey(0x0107),
        bind,
    };
    assert!(
        post(
            &mut f,
            &RawSendWr {
                wr_id: 5,
                signaled: true,
                inline: false,
                solicited: false,
                sges: &[],
                op
            }
        )
        .is_err()
    );
    assert_eq!(mw.rkey, 0x0106);
}

#[test]
fn type1_bind_passes_the_mr_even_to_unbind_and_returns_the_new_key() {
    let mut f = fake_qp();
    let pd: *mut ffi::ibv_pd = &raw mut *f.pd;
    let mut other_pd = zeroed::<ffi::ibv_pd>();
    let mut mw = zeroed::<ffi::ibv_mw>();
    mw.context = f.qp.context;
    mw.pd = pd;
    mw.type_ = ffi::ibv_mw_type::IBV_MW_TYPE_1;
    mw.rkey = 0x2200;
    let mut mr = zeroed::<ffi::ibv_mr>();
    mr.pd = pd;
    let bind = |mr: &mut ffi::ibv_mr| RawBind {
        wr_id: 6,
        signaled: true,
        mr: &raw mut *mr as u64,
        mr_lkey: Lkey(1),
        addr: 0x9000,
        len: 0, // unbind
        access: Access::empty(),
    };
    let mut run = |mw: &mut ffi::ibv_mw, b: RawBind| {
        // SAFETY: all fakes are live boxes.
        unsafe { bind_mw_raw(&raw mut *f.qp, mw, Rkey(0x2203), &b) }
    };
    assert_eq!(run(&mut mw, bind(&mut mr)).unwrap(), Rkey(0x2204));
    assert_eq!(mw.rkey, 0x2204);
    let seen = last_seen();
    assert_eq!(seen.bind, (&raw mut *mr as usize, 0x9000, 0, 0));
    assert_eq!(seen.flags, ffi::ibv_send_flags::IBV_SEND_SIGNALED.0);

    // The C inline's checks: a region of another PD, a type 2 window; and no null MR.
    mr.pd = &raw mut *other_pd;
    assert_eq!(
        run(&mut mw, bind(&mut mr)).unwrap_err().errno(),
        Some(libc::EPERM)
    );
    mr.pd = pd;
    mw.type_ = ffi::ibv_mw_type::IBV_MW_TYPE_2;
    assert_eq!(
        run(&mut mw, bind(&mut mr)).unwrap_err().errno(),
        Some(libc::EINVAL)
    );
    mw.type_ = ffi::ibv_mw_type::IBV_MW_TYPE_1;
    let null_mr = RawBind {
        mr: 0,
        ..bind(&mut mr)
    };
    assert!(matches!(
        run(&mut mw, null_mr),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
fn poll_fills_in_chunks_and_stops_when_empty() {
    let f = fake_qp();
    let mut cq = zeroed::<ffi::ibv_cq>();
    cq.context = f.qp.context;
    let cq: *mut ffi::ibv_cq = &raw mut *cq;
    // SAFETY: `cq` is a live fake.
    let poll = |out: &mut [Completion]| unsafe { poll_cq_raw(cq, out) };
    let mut out = [Completion::default(); 40];
    assert_eq!(poll(&mut out).unwrap(), 0);
    PENDING.with(|p| *p.borrow_mut() = (100..120).collect());
    assert_eq!(poll(&mut out).unwrap(), 20);
    let ids: Vec<u64> = out[..20].iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (100..120).collect::<Vec<_>>());
    assert!(
        out[..20]
            .iter()
            .all(|c| c.opcode == WcOpcode::RdmaWrite && c.status == WcStatus::Success)
    );
    PENDING.with(|p| *p.borrow_mut() = (1..=5).collect());
    assert_eq!(poll(&mut out[..3]).unwrap(), 3);
    assert_eq!(poll(&mut out[..3]).unwrap(), 2);
    assert_eq!(out[1].wr_id, 5);
    PENDING.with(|p| *p.borrow_mut() = vec![u64::MAX]);
    assert!(matches!(
        poll(&mut out),
        Err(Error::Verb {
            verb: Verb::PollCq,
            ..
        })
    ));
}

// -- attaching to a context the caller opened ---------------------------------------------

/// A device as libibverbs lays it out: `struct ibv_device` inside a larger `verbs_device`
/// (libmlx5's `mlx5dv_is_supported` reads the provider ops just past the `ibv_device`; zero
/// there means "not mlx5").
#[repr(C)]
struct FakeDevice {
    dev: ffi::ibv_device,
    verbs_device_tail: [usize; 16],
}

thread_local! {
    /// What `fake_query_device_ex` returns (it fills the attributes only for 0).
    static QUERY_RC: RefCell<c_int> = const { RefCell::new(0) };
}

extern "C" fn fake_query_device_ex(
    _ctx: *mut ffi::ibv_context,
    _input: *const ffi::ibv_query_device_ex_input,
    attr: *mut ffi::ibv_device_attr_ex,
    _size: usize,
) -> c_int {
    let rc = QUERY_RC.with(|r| *r.borrow());
    if rc != 0 {
        return rc;
    }
    // SAFETY: query_device_ex passes a writable, zeroed ibv_device_attr_ex.
    let a = unsafe { &mut *attr };
    a.orig_attr.vendor_id = RXE_VENDOR_ID;
    a.orig_attr.max_mr_size = 1 << 30;
    a.orig_attr.max_mr = 100;
    a.orig_attr.max_sge = 4;
    a.orig_attr.max_qp_wr = 128;
    a.orig_attr.max_cqe = 64;
    a.odp_caps.general_caps = u64::from(ffi::ibv_odp_general_caps::IBV_ODP_SUPPORT.0);
    0
}

extern "C" fn fake_query_port(
    _ctx: *mut ffi::ibv_context,
    _port: u8,
    attr: *mut ffi::ibv_port_attr,
    _size: usize,
) -> c_int {
    // SAFETY: query_port passes a writable, zeroed ibv_port_attr.
    unsafe { (*attr).active_mtu = ffi::ibv_mtu::IBV_MTU_1024 };
    0
}

struct FakeOpenContext {
    v: Box<ffi::verbs_context>,
    _dev: Box<FakeDevice>,
}

fn fake_open_context(name: &[u8]) -> FakeOpenContext {
    let mut dev: Box<FakeDevice> = zeroed();
    for (d, &c) in dev.dev.name.iter_mut().zip(name) {
        *d = c as c_char;
    }
    let mut v = fake_context();
    v.query_device_ex = Some(fake_query_device_ex);
    v.query_port = Some(fake_query_port);
    v.context.device = &raw mut dev.dev;
    FakeOpenContext { v, _dev: dev }
}

#[test]
fn an_attached_context_is_queried_and_not_closed() {
    let mut f = fake_open_context(b"rxe7");
    let ctx: *mut c_void = ctx_of(&mut f.v).cast();
    // SAFETY: the fake context outlives the NIC; dropping the NIC must not close it (a real
    // ibv_close_device on the fake would crash).
    let nic = unsafe { crate::nic::Nic::from_raw_context(ctx) }.unwrap();
    let caps = nic.caps();
    assert_eq!((caps.name.as_str(), caps.driver.as_str()), ("rxe7", "rxe"));
    assert_eq!((caps.max_mr, caps.max_sge, caps.max_cqe), (100, 4, 64));
    assert_eq!(caps.path_mtu, 1024);
    assert!(caps.odp.explicit && !caps.odp.implicit && !caps.devx && !caps.rereg_mr);
    assert_eq!(nic.kind(), NicKind::Verbs);
    assert_eq!(nic.raw_context(), Some(ctx));
    let verbs = nic.as_verbs().unwrap();
    assert!(verbs.is_rxe() && !verbs.odp_rdma_safe());

    // A PD of this context is adopted without being deallocated on drop; others are refused.
    let mut pd = zeroed::<ffi::ibv_pd>();
    pd.context = ctx.cast();
    let mut foreign = zeroed::<ffi::ibv_pd>();
    // SAFETY: both fakes outlive the handles made from them.
    let adopted = unsafe { crate::nic::Pd::from_raw(&nic, (&raw mut *pd).cast()) }.unwrap();
    assert_eq!(adopted.as_raw(), &raw mut *pd as u64);
    assert!(adopted.nic().same_device(&nic));
    drop(adopted);
    for p in [(&raw mut *foreign).cast(), ptr::null_mut()] {
        // SAFETY: as above; null is refused before anything is read.
        let e = unsafe { crate::nic::Pd::from_raw(&nic, p) }.unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument { verb: None, .. }),
            "{e:?}"
        );
    }
    drop(nic);
}

#[test]
fn attaching_to_null_or_a_failing_context_is_an_error() {
    // SAFETY: null is refused before anything is read.
    let e = unsafe { crate::nic::Nic::from_raw_context(ptr::null_mut()) }.unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { verb: None, .. }),
        "{e:?}"
    );

    let mut f = fake_open_context(b"mock0");
    QUERY_RC.with(|r| *r.borrow_mut() = libc::EIO);
    // SAFETY: the fake context outlives the call.
    let e = unsafe { crate::nic::Nic::from_raw_context(ctx_of(&mut f.v).cast()) }.unwrap_err();
    assert!(
        matches!(
            e,
            Error::Verb {
                verb: Verb::QueryDevice,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn the_soft_nic_has_no_raw_context() {
    let nic = crate::nic::Nic::soft();
    assert_eq!(nic.raw_context(), None);
    let mut pd = zeroed::<ffi::ibv_pd>();
    // SAFETY: the soft NIC is refused before `pd` is read.
    let e = unsafe { crate::nic::Pd::from_raw(&nic, (&raw mut *pd).cast()) }.unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument { verb: None, .. }),
        "{e:?}"
    );
}

#[test]
fn a_batch_is_one_chain_with_immediates_big_endian_and_its_flags() {
    use ffi::ibv_send_flags as f;
    use ffi::ibv_wr_opcode::*;
    let mut fq = fake_qp();
    SEEN.with(|s| s.borrow_mut().clear());
    let data = [7u8; 8];
    let sge = [Sge {
        addr: data.as_ptr() as u64,
        length: 8,
        lkey: Lkey(0),
    }];
    let wr = |wr_id, op, signaled, inline, solicited| RawSendWr {
        wr_id,
        signaled,
        inline,
        solicited,
        sges: &sge,
        op,
    };
    let wrs = [
        wr(1, RawSendOp::SendWithImm(0x0a0b_0c0d), false, true, false),
        wr(
            2,
            RawSendOp::WriteWithImm {
                remote_addr: 0x1000,
                rkey: Rkey(5),
                imm: 9,
            },
            false,
            false,
            true,
        ),
        wr(3, RawSendOp::Send, true, false, false),
    ];
    // SAFETY: the fake QP is a live box; the SGEs name `data`.
    unsafe { post_send_list_raw(&raw mut *fq.qp, &wrs) }.unwrap();
    let seen = SEEN.with(|s| s.borrow().clone());
    assert_eq!(seen.len(), 3, "one call, the whole chain");
    assert_eq!(
        (seen[0].opcode, seen[0].flags, seen[0].inv_rkey),
        (
            IBV_WR_SEND_WITH_IMM,
            f::IBV_SEND_INLINE.0,
            0x0a0b_0c0du32.to_be()
        )
    );
    assert_eq!(
        (
            seen[1].opcode,
            seen[1].flags,
            seen[1].inv_rkey,
            seen[1].rdma
        ),
        (
            IBV_WR_RDMA_WRITE_WITH_IMM,
            f::IBV_SEND_SOLICITED.0,
            9u32.to_be(),
            (0x1000, 5)
        )
    );
    assert_eq!(
        (seen[2].opcode, seen[2].flags),
        (IBV_WR_SEND, f::IBV_SEND_SIGNALED.0)
    );
    assert_eq!(seen[2].sges, vec![(data.as_ptr() as u64, 8, 0)]);

    // The provider refuses the third: the first two were posted, and the error says so.
    BAD_AT.with(|b| *b.borrow_mut() = Some(2));
    // SAFETY: as above.
    let (posted, e) = unsafe { post_send_list_raw(&raw mut *fq.qp, &wrs) }.unwrap_err();
    BAD_AT.with(|b| *b.borrow_mut() = None);
    assert_eq!((posted, e.errno()), (2, Some(libc::ENOMEM)));
}
