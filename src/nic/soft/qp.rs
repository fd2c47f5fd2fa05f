//! Soft queue pairs: the data path.
//!
//! Contract: each QP has one send engine (`busy`): work requests execute one at a time, in post
//! order, when posted (the soft NIC has no wire), and complete on the send CQ when done. A SEND
//! that finds no receive at the responder is *parked* there (as with infinite RNR retry); later
//! work requests of its QP queue behind it (`pending`, RC ordering) and run once it completes,
//! which happens when the responder posts a receive. Every key is checked by
//! [`keys::check_and_access`] with the PD and QP number of the QP that uses it: lkeys by the
//! requester, rkeys by the responder; bytes are buffered only after the key that covers them
//! was checked.
//!
//! Invariants: once `state == Error`, every posted and every later request completes with
//! `WrFlushErr` and parked SENDs are never delivered; `|parked| + |pending| <= max_send_wr`;
//! receives complete in the order they were posted (`rx` serialises landing); `|cq| <= depth`
//! (an overflowing completion is dropped and counted, and the QP enters the error state, as a
//! CQ overrun does on hardware).
//!
//! Lock order: `rx` → `st` → key slots. No QP lock is held while another QP's lock is taken.
//!
//! A QP sees its device only through [`Port`] (its key table, its fault accounting, its
//! counters): it never reaches into the device's other tables.
//!
//! Here: the QP's state, its send queue (posting, ordering, completion, errors), its receives;
//! `qp_exec.rs` runs one request (gather, responder's operation, scatter) and delivers messages.

use super::counters::AtomicCounters;
use super::cq::CqObj;
use super::keys::{FaultSink, KeyTable, Requester};
use super::mem;
use super::qp_exec::Outcome;
use super::srq::SrqObj;
use super::sync::lock;
use super::window::{self, MAX_WINDOW, WindowBind};
use crate::nic::backend::{RawBind, RawSendOp, RawSendWr};
use crate::nic::error::{Error, Result, Verb};
use crate::nic::types::*;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};

/// What a QP needs of its device.
pub(super) trait Port: Send + Sync {
    /// The device's key table (regions and windows).
    fn keys(&self) -> &KeyTable;
    /// Where refused accesses and ODP faults are accounted.
    fn sink(&self) -> &dyn FaultSink;
    /// The device's counters.
    fn counters(&self) -> &AtomicCounters;
}

pub(super) fn err(verb: Verb, errno: i32) -> Error {
    Error::from_errno(verb, errno)
}

/// The largest RC message (`max_msg_sz` of RC transports: 2^31 bytes).
pub(super) const MAX_MSG: u64 = 1 << 31;

pub(super) struct Recv {
    pub(super) wr_id: u64,
    pub(super) sges: Vec<Sge>,
}

/// A SEND (or an RDMA WRITE with immediate) that reached the responder before a receive was
/// posted.
pub(super) struct Inbound {
    pub(super) payload: Vec<u8>,
    pub(super) invalidate: Option<Rkey>,
    pub(super) imm: Option<u32>,
    /// WRITE_WITH_IMM: the payload goes to this address through this key when the message
    /// lands (a responder without a receive NAKs the whole request: nothing is written before).
    pub(super) write: Option<(u64, Rkey)>,
    /// Sent with `IBV_SEND_SOLICITED`.
    pub(super) solicited: bool,
    pub(super) sender: Weak<QpObj>,
}

/// The largest inline payload the soft NIC accepts (rxe: its largest WQE's SGE area).
pub(super) const MAX_INLINE: u32 = 512;

/// What the send engine executes: a posted work request, or a type 1 bind (`ibv_bind_mw`
/// posts one on the send queue, so it runs in order behind earlier requests and is flushed
/// when they fail).
#[derive(Debug, Clone, Copy)]
pub(super) enum Op {
    Wr(RawSendOp),
    BindType1(WindowBind),
}

/// A work request on the send queue.
pub(super) struct OwnedWr {
    pub(super) wr_id: u64,
    pub(super) signaled: bool,
    /// `IBV_SEND_SOLICITED`: the responder's receive completion is a solicited event.
    pub(super) solicited: bool,
    pub(super) sges: Vec<Sge>,
    /// The bytes of an inline request, copied at post time.
    pub(super) inline: Option<Vec<u8>>,
    pub(super) op: Op,
}

pub(super) struct QpSt {
    pub(super) state: QpState,
    /// The responder's device, once connected.
    peer_dev: Option<Weak<dyn Port>>,
    peer: Weak<QpObj>,
    pub(super) recvs: VecDeque<Recv>,
    pub(super) inbound: VecDeque<Inbound>,
    /// This QP's SENDs (and WRITEs with immediate) parked at the responder, oldest first:
    /// (wr_id, signaled, opcode).
    pub(super) parked: VecDeque<(u64, bool, WcOpcode)>,
    /// Work requests posted behind a parked SEND.
    pending: VecDeque<OwnedWr>,
    /// The send engine is executing a request.
    busy: bool,
    /// Send-queue slots in use: requests posted and not yet retired. A request retires when
    /// its completion is reported, an unsignaled one only when a later completion of this QP
    /// is (`<= max_send_wr`).
    slots: u32,
    /// Unsignaled requests that completed and still hold their slots.
    unretired: u32,
}

pub(super) struct QpObj {
    dev: Weak<dyn Port>,
    pub(super) pd: u64,
    pub(super) qpn: u32,
    pub(super) send_cq: Arc<CqObj>,
    pub(super) recv_cq: Arc<CqObj>,
    /// The shared receive queue its messages land in, instead of its own receives.
    pub(super) srq: Option<Arc<SrqObj>>,
    caps: QpCaps,
    pub(super) st: Mutex<QpSt>,
    /// Serialises landing messages into receives, so receives complete in posting order.
    pub(super) rx: Mutex<()>,
}

pub(super) fn opcode(op: &Op) -> WcOpcode {
    match op {
        Op::Wr(RawSendOp::Send | RawSendOp::SendWithImm(_) | RawSendOp::SendWithInv(_)) => {
            WcOpcode::Send
        }
        Op::Wr(RawSendOp::Write { .. } | RawSendOp::WriteWithImm { .. }) => WcOpcode::RdmaWrite,
        Op::Wr(RawSendOp::Read { .. }) => WcOpcode::RdmaRead,
        Op::Wr(RawSendOp::BindMw { .. }) | Op::BindType1(_) => WcOpcode::BindMw,
        Op::Wr(RawSendOp::LocalInv(_)) => WcOpcode::LocalInv,
        Op::Wr(RawSendOp::CompareSwap { .. }) => WcOpcode::CompareSwap,
        Op::Wr(RawSendOp::FetchAdd { .. }) => WcOpcode::FetchAdd,
    }
}

impl QpObj {
    pub(super) fn new(
        dev: Weak<dyn Port>,
        pd: u64,
        qpn: u32,
        send_cq: Arc<CqObj>,
        recv_cq: Arc<CqObj>,
        srq: Option<Arc<SrqObj>>,
        caps: QpCaps,
    ) -> QpObj {
        send_cq.users.fetch_add(1, Ordering::AcqRel);
        recv_cq.users.fetch_add(1, Ordering::AcqRel);
        if let Some(srq) = &srq {
            srq.users.fetch_add(1, Ordering::AcqRel);
        }
        QpObj {
            dev,
            pd,
            qpn,
            send_cq,
            recv_cq,
            srq,
            caps,
            st: Mutex::new(QpSt {
                state: QpState::Init,
                peer_dev: None,
                peer: Weak::new(),
                recvs: VecDeque::new(),
                inbound: VecDeque::new(),
                parked: VecDeque::new(),
                pending: VecDeque::new(),
                busy: false,
                slots: 0,
                unretired: 0,
            }),
            rx: Mutex::new(()),
        }
    }

    /// Connect (INIT → RTS). Only a QP that was never connected can be: an errored QP would
    /// need a reset first, which rdma-pool never does (it creates a new QP).
    pub(super) fn connect(&self, peer_dev: Weak<dyn Port>, peer: Weak<QpObj>) -> bool {
        let mut st = lock(&self.st);
        if st.state != QpState::Init {
            return false;
        }
        st.peer_dev = Some(peer_dev);
        st.peer = peer;
        st.state = QpState::Ready;
        true
    }

    pub(super) fn state(&self) -> QpState {
        lock(&self.st).state
    }

    /// Enter the error state: flush pending receives, queued and parked requests, and fail the
    /// SENDs parked here by peers (their requesters see `RetryExcErr`).
    pub(super) fn set_error(&self) {
        let (recvs, pending, parked, inbound) = {
            let mut st = lock(&self.st);
            st.state = QpState::Error;
            (
                std::mem::take(&mut st.recvs),
                std::mem::take(&mut st.pending),
                std::mem::take(&mut st.parked),
                std::mem::take(&mut st.inbound),
            )
        };
        for r in recvs {
            self.recv_cq
                .push(self.wc(r.wr_id, WcOpcode::Recv, WcStatus::WrFlushErr));
        }
        for (wr_id, _, opcode) in parked {
            self.send_cq
                .push(self.wc(wr_id, opcode, WcStatus::WrFlushErr));
        }
        for w in pending {
            self.send_cq
                .push(self.wc(w.wr_id, opcode(&w.op), WcStatus::WrFlushErr));
        }
        for msg in inbound {
            if let Some(sender) = msg.sender.upgrade() {
                sender.parked_done(WcStatus::RetryExcErr);
            }
        }
    }

    /// Destruction (`ibv_destroy_qp`): once this returns no request of this QP runs and none
    /// will — a delivery into its receives in progress is waited for (`rx`), its send engine
    /// is waited for until released — and nothing more is completed, as on hardware. SENDs
    /// peers parked here fail at their requesters.
    pub(super) fn quiesce(&self) {
        let inbound = {
            let _rx = lock(&self.rx);
            let mut st = lock(&self.st);
            st.state = QpState::Error;
            st.recvs.clear();
            st.pending.clear();
            st.parked.clear();
            std::mem::take(&mut st.inbound)
        };
        while lock(&self.st).busy {
            std::thread::yield_now();
        }
        for msg in inbound {
            if let Some(sender) = msg.sender.upgrade() {
                sender.parked_done(WcStatus::RetryExcErr);
            }
        }
    }

    pub(super) fn wc(&self, wr_id: u64, opcode: WcOpcode, status: WcStatus) -> Completion {
        Completion {
            wr_id,
            status,
            opcode,
            qp_num: self.qpn,
            ..Default::default()
        }
    }

    fn complete(&self, wr_id: u64, signaled: bool, opcode: WcOpcode, status: WcStatus) {
        // Errors are always reported, successes only when signaled; the failing request's own
        // completion comes before the flushes its error causes.
        let report = signaled || status != WcStatus::Success;
        {
            let mut st = lock(&self.st);
            if report {
                st.slots = st.slots.saturating_sub(1 + st.unretired);
                st.unretired = 0;
            } else {
                st.unretired += 1;
            }
        }
        let reported = !report || self.send_cq.push(self.wc(wr_id, opcode, status));
        if !reported || (status != WcStatus::Success && status != WcStatus::WrFlushErr) {
            self.set_error();
        }
    }

    pub(super) fn who(&self, remote: bool) -> Requester {
        Requester {
            pd: self.pd,
            qpn: self.qpn,
            remote,
        }
    }

    /// The connected responder, if it is still there, ready, and connected to this QP: an RC
    /// connection is a pair, and a responder drops the packets of any other QP (the requester
    /// then sees its retries run out), so a third QP cannot borrow the responder's type 2
    /// windows by connecting to it one way.
    pub(super) fn peer(&self) -> Option<(Arc<dyn Port>, Arc<QpObj>)> {
        let (dev, peer) = {
            let st = lock(&self.st);
            (st.peer_dev.as_ref()?.upgrade()?, st.peer.upgrade()?)
        };
        let paired = {
            let pst = lock(&peer.st);
            pst.state == QpState::Ready && std::ptr::eq(pst.peer.as_ptr(), self)
        };
        paired.then_some((dev, peer))
    }

    /// `ibv_post_send`: execute now, or queue behind the request in flight or a parked SEND.
    pub(super) fn post_send(self: &Arc<Self>, dev: &dyn Port, wr: &RawSendWr<'_>) -> Result<()> {
        if wr.sges.len() > self.caps.max_send_sge as usize {
            return Err(err(Verb::PostSend, libc::EINVAL));
        }
        if let RawSendOp::BindMw { bind, .. } = wr.op
            && bind.len > MAX_WINDOW
        {
            return Err(err(Verb::PostSend, libc::EOPNOTSUPP));
        }
        let inline = if wr.inline {
            let total: u64 = wr.sges.iter().map(|s| s.length as u64).sum();
            if total > self.caps.max_inline_data as u64 {
                return Err(err(Verb::PostSend, libc::EINVAL));
            }
            // The bytes are copied now, their lkeys unused; unreadable memory fails the post.
            let mut data = vec![0u8; total as usize];
            let mut off = 0;
            for s in wr.sges {
                let len = s.length as usize;
                mem::dma_copy(data[off..].as_mut_ptr() as usize, s.addr as usize, len)
                    .map_err(|_| err(Verb::PostSend, libc::EFAULT))?;
                off += len;
            }
            Some(data)
        } else {
            None
        };
        self.post_op(
            dev,
            OwnedWr {
                wr_id: wr.wr_id,
                signaled: wr.signaled,
                solicited: wr.solicited,
                sges: wr.sges.to_vec(),
                inline,
                op: Op::Wr(wr.op),
            },
        )
    }

    /// Put `op` on the send queue: execute now, or queue behind the request in flight or a
    /// parked SEND (RC order).
    fn post_op(self: &Arc<Self>, dev: &dyn Port, wr: OwnedWr) -> Result<()> {
        {
            let mut st = lock(&self.st);
            match st.state {
                // Posting to a QP that was never connected is refused at post time.
                QpState::Init => return Err(err(Verb::PostSend, libc::EINVAL)),
                QpState::Error => {
                    drop(st);
                    self.complete(wr.wr_id, true, opcode(&wr.op), WcStatus::WrFlushErr);
                    return Ok(());
                }
                QpState::Ready => {}
            }
            // Every request holds a send-queue slot until it retires (`complete`).
            if st.slots >= self.caps.max_send_wr {
                return Err(err(Verb::PostSend, libc::ENOMEM));
            }
            st.slots += 1;
            if st.busy || !st.parked.is_empty() || !st.pending.is_empty() {
                st.pending.push_back(wr);
                return Ok(());
            }
            st.busy = true;
        }
        self.run(dev, &wr);
        self.drain(dev);
        Ok(())
    }

    /// Execute one request (the engine is ours: `busy`) and complete it unless it parked.
    fn run(self: &Arc<Self>, dev: &dyn Port, wr: &OwnedWr) {
        if let Outcome::Done(status) = self.execute(dev, wr) {
            self.complete(wr.wr_id, wr.signaled, opcode(&wr.op), status);
        }
    }

    /// Run queued requests until none is left or a SEND parks; then release the engine.
    fn drain(self: &Arc<Self>, dev: &dyn Port) {
        loop {
            let next = {
                let mut st = lock(&self.st);
                if st.state == QpState::Error || !st.parked.is_empty() {
                    st.busy = false;
                    return;
                }
                match st.pending.pop_front() {
                    Some(w) => w,
                    None => {
                        st.busy = false;
                        return;
                    }
                }
            };
            self.run(dev, &next);
        }
    }

    /// The oldest parked SEND of this QP was delivered (or failed) at the responder.
    fn parked_done(self: &Arc<Self>, status: WcStatus) {
        let (entry, resume) = {
            let mut st = lock(&self.st);
            let entry = st.parked.pop_front();
            let resume = st.parked.is_empty() && !st.busy && !st.pending.is_empty();
            if resume {
                st.busy = true;
            }
            (entry, resume)
        };
        if let Some((wr_id, signaled, opcode)) = entry {
            self.complete(wr_id, signaled, opcode, status);
        }
        if resume {
            match self.dev.upgrade() {
                Some(dev) => self.drain(&*dev),
                None => lock(&self.st).busy = false,
            }
        }
    }

    /// `ibv_post_srq_recv`: land the oldest message parked at a QP of `srq`, or queue the
    /// receive (see `srq.rs`).
    pub(super) fn post_srq_recv(
        srq: &SrqObj,
        dev: &dyn Port,
        wr_id: u64,
        sges: &[Sge],
    ) -> Result<()> {
        if sges.len() > srq.max_sge as usize {
            return Err(err(Verb::PostSrqRecv, libc::EINVAL));
        }
        loop {
            let (qp, msg) = {
                let mut q = lock(&srq.q);
                loop {
                    let Some(w) = q.waiting.pop_front() else {
                        if q.recvs.len() >= srq.max_wr as usize {
                            return Err(err(Verb::PostSrqRecv, libc::ENOMEM));
                        }
                        q.recvs.push_back(SrqObj::recv(wr_id, sges));
                        return Ok(());
                    };
                    let Some(qp) = w.upgrade() else { continue };
                    let mut st = lock(&qp.st);
                    if st.state != QpState::Ready {
                        continue;
                    }
                    if let Some(m) = st.inbound.pop_front() {
                        if !st.inbound.is_empty() {
                            q.waiting.push_front(w);
                        }
                        drop(st);
                        break (qp, m);
                    }
                }
            };
            // A SEND of a requester that failed meanwhile was flushed there: drop it.
            if !msg
                .sender
                .upgrade()
                .is_some_and(|s| s.state() != QpState::Error)
            {
                continue;
            }
            let status = {
                let _rx = lock(&qp.rx);
                qp.land(dev, SrqObj::recv(wr_id, sges), &msg)
            };
            if let Some(sender) = msg.sender.upgrade() {
                sender.parked_done(status);
            }
            return Ok(());
        }
    }

    pub(super) fn post_recv(&self, dev: &dyn Port, wr_id: u64, sges: &[Sge]) -> Result<()> {
        if self.srq.is_some() {
            // The QP receives through its SRQ.
            return Err(err(Verb::PostRecv, libc::EINVAL));
        }
        if sges.len() > self.caps.max_recv_sge as usize {
            return Err(err(Verb::PostRecv, libc::EINVAL));
        }
        let landed = {
            let _rx = lock(&self.rx);
            let msg = loop {
                let msg = {
                    let mut st = lock(&self.st);
                    if st.state == QpState::Error {
                        drop(st);
                        self.recv_cq
                            .push(self.wc(wr_id, WcOpcode::Recv, WcStatus::WrFlushErr));
                        return Ok(());
                    }
                    match st.inbound.pop_front() {
                        Some(m) => m,
                        None if st.recvs.len() >= self.caps.max_recv_wr as usize => {
                            return Err(err(Verb::PostRecv, libc::ENOMEM));
                        }
                        None => {
                            st.recvs.push_back(Recv {
                                wr_id,
                                sges: sges.to_vec(),
                            });
                            return Ok(());
                        }
                    }
                };
                // A SEND of a requester that failed meanwhile was flushed there: drop it. (Its
                // state is read without our lock held: no two QP locks are ever nested. `rx`
                // keeps deliveries out meanwhile.)
                if msg
                    .sender
                    .upgrade()
                    .is_some_and(|s| s.state() != QpState::Error)
                {
                    break msg;
                }
            };
            let status = self.land(
                dev,
                Recv {
                    wr_id,
                    sges: sges.to_vec(),
                },
                &msg,
            );
            (msg.sender, status)
        };
        // Outside our locks: completing the SEND may run the sender's queued requests, which
        // may deliver to us again.
        if let Some(sender) = landed.0.upgrade() {
            sender.parked_done(landed.1);
        }
        Ok(())
    }

    /// `ibv_bind_mw` (type 1): refuse bad input at the call ([`window::check_type1_call`],
    /// the QP untouched), else put the bind on the send queue, where it runs in order.
    pub(super) fn bind_type1(
        self: &Arc<Self>,
        dev: &dyn Port,
        mw: u64,
        mw_rkey: Rkey,
        new_rkey: Rkey,
        bind: &RawBind,
    ) -> Result<()> {
        window::check_type1_call(dev.keys(), mw, bind).map_err(|errno| err(Verb::BindMw, errno))?;
        let op = Op::BindType1(WindowBind {
            mw,
            mw_rkey,
            new_rkey,
            bind: *bind,
            via: MwType::Type1,
        });
        let wr = OwnedWr {
            wr_id: bind.wr_id,
            signaled: bind.signaled,
            solicited: false,
            sges: Vec::new(),
            inline: None,
            op,
        };
        self.post_op(dev, wr)
            .map_err(|e| err(Verb::BindMw, e.errno().unwrap_or(libc::EINVAL)))
    }
}

impl Drop for QpObj {
    fn drop(&mut self) {
        self.send_cq.users.fetch_sub(1, Ordering::AcqRel);
        self.recv_cq.users.fetch_sub(1, Ordering::AcqRel);
        if let Some(srq) = &self.srq {
            srq.users.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl std::fmt::Debug for QpObj {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QpObj").field("qpn", &self.qpn).finish()
    }
}
