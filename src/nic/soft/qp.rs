//! Soft queue pairs and completion queues: the data path.
//!
//! Contract: a work request is executed when it is posted (the soft NIC has no wire), in order
//! per QP; its completion is queued on the send CQ when it is done. A SEND waits on the
//! responder until a receive is posted there (as with infinite RNR retry), and completes then.
//! Every key is checked by [`keys::check_and_access`] with the PD and QP number of the QP that
//! uses it: lkeys by the requester, rkeys by the responder.
//!
//! Invariants: once `state == Error`, every later request completes with `WrFlushErr`;
//! `|cq| <= depth` (an overflowing completion is dropped and counted, and the QP enters the
//! error state, as a CQ overrun does on hardware).

use super::keys::{self, KeyFault, KeyObj, KeyTable, MwBinding, Requester};
use super::{Device, bump, err, lock, mem};
use crate::nic::backend::{RawBind, RawSendOp, RawSendWr};
use crate::nic::error::{Result, Verb};
use crate::nic::types::*;
use crossbeam::queue::ArrayQueue;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

pub(super) struct CqObj {
    queue: ArrayQueue<Completion>,
    pub(super) overruns: AtomicU64,
}

impl CqObj {
    pub(super) fn new(depth: u32) -> CqObj {
        CqObj {
            queue: ArrayQueue::new(depth.max(1) as usize),
            overruns: AtomicU64::new(0),
        }
    }

    fn push(&self, wc: Completion) -> bool {
        if self.queue.push(wc).is_err() {
            self.overruns.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("soft NIC CQ overrun: a completion was dropped");
            return false;
        }
        true
    }

    pub(super) fn poll(&self, out: &mut [Completion]) -> usize {
        let mut n = 0;
        while n < out.len() {
            match self.queue.pop() {
                Some(wc) => {
                    out[n] = wc;
                    n += 1;
                }
                None => break,
            }
        }
        n
    }
}

struct Recv {
    wr_id: u64,
    sges: Vec<Sge>,
}

/// A SEND that reached the responder before a receive was posted.
struct Inbound {
    payload: Vec<u8>,
    invalidate: Option<Rkey>,
    sender: Weak<QpObj>,
    sender_wr_id: u64,
    signaled: bool,
}

struct QpSt {
    state: QpState,
    peer_dev: Weak<Device>,
    peer: Weak<QpObj>,
    recvs: VecDeque<Recv>,
    inbound: VecDeque<Inbound>,
}

pub(super) struct QpObj {
    dev_id: u32,
    pub(super) pd: u64,
    pub(super) qpn: u32,
    send_cq: Arc<CqObj>,
    recv_cq: Arc<CqObj>,
    caps: QpCaps,
    st: Mutex<QpSt>,
}

/// Map a responder-side key fault to the requester's completion status.
fn remote_status(_f: KeyFault) -> WcStatus {
    WcStatus::RemAccessErr
}

/// Map a requester-side (lkey) fault to its completion status.
fn local_status(f: KeyFault) -> WcStatus {
    match f {
        KeyFault::PageFault | KeyFault::Dma => WcStatus::LocAccessErr,
        _ => WcStatus::LocProtErr,
    }
}

impl QpObj {
    pub(super) fn new(
        dev_id: u32,
        pd: u64,
        qpn: u32,
        send_cq: Arc<CqObj>,
        recv_cq: Arc<CqObj>,
        caps: QpCaps,
    ) -> QpObj {
        QpObj {
            dev_id,
            pd,
            qpn,
            send_cq,
            recv_cq,
            caps,
            st: Mutex::new(QpSt {
                state: QpState::Init,
                peer_dev: Weak::new(),
                peer: Weak::new(),
                recvs: VecDeque::new(),
                inbound: VecDeque::new(),
            }),
        }
    }

    pub(super) fn connect(&self, peer_dev: Weak<Device>, peer: Weak<QpObj>) {
        let mut st = lock(&self.st);
        st.peer_dev = peer_dev;
        st.peer = peer;
        st.state = QpState::Ready;
    }

    pub(super) fn state(&self) -> QpState {
        lock(&self.st).state
    }

    fn set_error(&self) {
        let mut st = lock(&self.st);
        st.state = QpState::Error;
        // Pending receives are flushed.
        while let Some(r) = st.recvs.pop_front() {
            self.recv_cq.push(Completion {
                wr_id: r.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: WcOpcode::Recv,
                qp_num: self.qpn,
                ..Default::default()
            });
        }
    }

    fn complete(&self, wr_id: u64, signaled: bool, opcode: WcOpcode, status: WcStatus) {
        if status != WcStatus::Success && status != WcStatus::WrFlushErr {
            self.set_error();
        }
        // Errors are always reported, successes only when signaled.
        if (signaled || status != WcStatus::Success)
            && !self.send_cq.push(Completion {
                wr_id,
                status,
                opcode,
                qp_num: self.qpn,
                ..Default::default()
            })
        {
            self.set_error();
        }
    }

    fn who(&self, remote: bool) -> Requester {
        Requester {
            pd: self.pd,
            qpn: self.qpn,
            remote,
        }
    }

    /// Gather the bytes named by local `sges`.
    fn gather(&self, dev: &Device, sges: &[Sge]) -> std::result::Result<Vec<u8>, KeyFault> {
        let total: usize = sges.iter().map(|s| s.length as usize).sum();
        let mut buf = vec![0u8; total];
        let mut off = 0;
        for s in sges {
            let dst = buf[off..].as_mut_ptr() as usize;
            let len = s.length as usize;
            keys::check_and_access(
                &dev.keys,
                dev,
                s.lkey.0,
                self.who(false),
                s.addr,
                s.length as u64,
                false,
                &mut |a| mem::dma_copy(dst, a, len),
            )?;
            off += len;
        }
        Ok(buf)
    }

    /// Scatter `data` into local `sges` (which need LOCAL_WRITE).
    fn scatter(
        &self,
        dev: &Device,
        sges: &[Sge],
        data: &[u8],
    ) -> std::result::Result<(), KeyFault> {
        let mut off = 0;
        for s in sges {
            if off >= data.len() {
                break;
            }
            let len = (s.length as usize).min(data.len() - off);
            let src = data[off..].as_ptr() as usize;
            keys::check_and_access(
                &dev.keys,
                dev,
                s.lkey.0,
                self.who(false),
                s.addr,
                len as u64,
                true,
                &mut |a| mem::dma_copy(a, src, len),
            )?;
            off += len;
        }
        Ok(())
    }

    fn peer(&self) -> Option<(Arc<Device>, Arc<QpObj>)> {
        let st = lock(&self.st);
        Some((st.peer_dev.upgrade()?, st.peer.upgrade()?))
    }

    pub(super) fn post_send(self: &Arc<Self>, dev: &Device, wr: &RawSendWr<'_>) -> Result<()> {
        let opcode = match wr.op {
            RawSendOp::Send | RawSendOp::SendWithInv(_) => WcOpcode::Send,
            RawSendOp::Write { .. } => WcOpcode::RdmaWrite,
            RawSendOp::Read { .. } => WcOpcode::RdmaRead,
            RawSendOp::BindMw { .. } => WcOpcode::BindMw,
            RawSendOp::LocalInv(_) => WcOpcode::LocalInv,
        };
        if wr.sges.len() > self.caps.max_send_sge as usize {
            return Err(err(Verb::PostSend, libc::EINVAL));
        }
        match self.state() {
            // Posting to a QP that was never connected is refused at post time.
            QpState::Init => return Err(err(Verb::PostSend, libc::EINVAL)),
            QpState::Error => {
                self.complete(wr.wr_id, true, opcode, WcStatus::WrFlushErr);
                return Ok(());
            }
            QpState::Ready => {}
        }
        let status = self.execute(dev, wr);
        if let Some(status) = status {
            self.complete(wr.wr_id, wr.signaled, opcode, status);
        }
        Ok(())
    }

    /// Run one request; `None` when its completion is deferred (a parked SEND).
    fn execute(self: &Arc<Self>, dev: &Device, wr: &RawSendWr<'_>) -> Option<WcStatus> {
        match wr.op {
            RawSendOp::Write { remote_addr, rkey } => {
                let data = match self.gather(dev, wr.sges) {
                    Ok(d) => d,
                    Err(f) => return Some(local_status(f)),
                };
                let Some((pdev, peer)) = self.peer() else {
                    return Some(WcStatus::RetryExcErr);
                };
                let src = data.as_ptr() as usize;
                let r = keys::check_and_access(
                    &pdev.keys,
                    &*pdev,
                    rkey.0,
                    peer.who(true),
                    remote_addr,
                    data.len() as u64,
                    true,
                    &mut |a| mem::dma_copy(a, src, data.len()),
                );
                Some(match r {
                    Ok(()) => {
                        bump(&dev.counters.bytes_moved, data.len() as u64);
                        WcStatus::Success
                    }
                    Err(f) => remote_status(f),
                })
            }
            RawSendOp::Read { remote_addr, rkey } => {
                let total: usize = wr.sges.iter().map(|s| s.length as usize).sum();
                let Some((pdev, peer)) = self.peer() else {
                    return Some(WcStatus::RetryExcErr);
                };
                let mut data = vec![0u8; total];
                let dst = data.as_mut_ptr() as usize;
                let r = keys::check_and_access(
                    &pdev.keys,
                    &*pdev,
                    rkey.0,
                    peer.who(true),
                    remote_addr,
                    total as u64,
                    false,
                    &mut |a| mem::dma_copy(dst, a, total),
                );
                if let Err(f) = r {
                    return Some(remote_status(f));
                }
                Some(match self.scatter(dev, wr.sges, &data) {
                    Ok(()) => {
                        bump(&dev.counters.bytes_moved, total as u64);
                        WcStatus::Success
                    }
                    Err(f) => local_status(f),
                })
            }
            RawSendOp::Send | RawSendOp::SendWithInv(_) => {
                let payload = match self.gather(dev, wr.sges) {
                    Ok(d) => d,
                    Err(f) => return Some(local_status(f)),
                };
                let Some((pdev, peer)) = self.peer() else {
                    return Some(WcStatus::RetryExcErr);
                };
                let invalidate = match wr.op {
                    RawSendOp::SendWithInv(k) => Some(k),
                    _ => None,
                };
                let msg = Inbound {
                    payload,
                    invalidate,
                    sender: Arc::downgrade(self),
                    sender_wr_id: wr.wr_id,
                    signaled: wr.signaled,
                };
                peer.deliver(&pdev, msg)
            }
            RawSendOp::BindMw {
                mw,
                mw_rkey,
                new_rkey,
                bind,
            } => Some(
                match self.bind(dev, mw, mw_rkey, new_rkey, &bind, MwType::Type2) {
                    Ok(()) => WcStatus::Success,
                    Err(_) => WcStatus::MwBindErr,
                },
            ),
            RawSendOp::LocalInv(rkey) => Some(match invalidate(dev, rkey, self.pd, None) {
                Ok(()) => WcStatus::Success,
                Err(()) => WcStatus::LocQpOpErr,
            }),
        }
    }

    /// Responder side of a SEND: into the next receive, or parked until one is posted.
    /// Returns the sender's status when it completed now.
    fn deliver(&self, dev: &Device, msg: Inbound) -> Option<WcStatus> {
        let mut st = lock(&self.st);
        if st.state != QpState::Ready {
            return Some(WcStatus::RemOpErr);
        }
        match st.recvs.pop_front() {
            Some(recv) => {
                drop(st);
                Some(self.land(dev, recv, &msg))
            }
            None => {
                st.inbound.push_back(msg);
                None
            }
        }
    }

    /// Land `msg` in `recv`; completes the receive; returns the sender's status.
    fn land(&self, dev: &Device, recv: Recv, msg: &Inbound) -> WcStatus {
        let cap: usize = recv.sges.iter().map(|s| s.length as usize).sum();
        let mut wc = Completion {
            wr_id: recv.wr_id,
            opcode: WcOpcode::Recv,
            qp_num: self.qpn,
            ..Default::default()
        };
        let sender_status = if msg.payload.len() > cap {
            wc.status = WcStatus::LocLenErr;
            WcStatus::RemInvReqErr
        } else if let Err(f) = self.scatter(dev, &recv.sges, &msg.payload) {
            wc.status = local_status(f);
            WcStatus::RemOpErr
        } else if let Some(rkey) = msg.invalidate {
            match invalidate(dev, rkey, self.pd, Some(self.qpn)) {
                Ok(()) => {
                    wc.invalidated_rkey = Some(rkey);
                    WcStatus::Success
                }
                Err(()) => {
                    wc.status = WcStatus::RemInvReqErr;
                    WcStatus::RemInvReqErr
                }
            }
        } else {
            WcStatus::Success
        };
        wc.byte_len = msg.payload.len() as u32;
        if wc.status == WcStatus::Success {
            bump(&dev.counters.bytes_moved, msg.payload.len() as u64);
        }
        if !self.recv_cq.push(wc) || wc.status != WcStatus::Success {
            self.set_error();
        }
        sender_status
    }

    pub(super) fn post_recv(&self, dev: &Device, wr_id: u64, sges: &[Sge]) -> Result<()> {
        if sges.len() > self.caps.max_recv_sge as usize {
            return Err(err(Verb::PostRecv, libc::EINVAL));
        }
        let mut st = lock(&self.st);
        if st.state == QpState::Error {
            drop(st);
            self.recv_cq.push(Completion {
                wr_id,
                status: WcStatus::WrFlushErr,
                opcode: WcOpcode::Recv,
                qp_num: self.qpn,
                ..Default::default()
            });
            return Ok(());
        }
        if st.recvs.len() >= self.caps.max_recv_wr as usize {
            return Err(err(Verb::PostRecv, libc::ENOMEM));
        }
        let recv = Recv {
            wr_id,
            sges: sges.to_vec(),
        };
        match st.inbound.pop_front() {
            Some(msg) => {
                drop(st);
                let status = self.land(dev, recv, &msg);
                if let Some(sender) = msg.sender.upgrade() {
                    sender.complete(msg.sender_wr_id, msg.signaled, WcOpcode::Send, status);
                }
            }
            None => st.recvs.push_back(recv),
        }
        Ok(())
    }

    pub(super) fn bind_type1(
        &self,
        dev: &Device,
        mw: u64,
        mw_rkey: Rkey,
        new_rkey: Rkey,
        bind: &RawBind,
    ) -> Result<()> {
        match self.state() {
            QpState::Init => return Err(err(Verb::BindMw, libc::EINVAL)),
            QpState::Error => {
                self.complete(bind.wr_id, true, WcOpcode::BindMw, WcStatus::WrFlushErr);
                return Ok(());
            }
            QpState::Ready => {}
        }
        let status = match self.bind(dev, mw, mw_rkey, new_rkey, bind, MwType::Type1) {
            Ok(()) => WcStatus::Success,
            Err(_) => WcStatus::MwBindErr,
        };
        self.complete(bind.wr_id, bind.signaled, WcOpcode::BindMw, status);
        Ok(())
    }

    /// The checks of rxe_check_bind_mw (IB spec C10-72..75, o10-36.2.2, o10-37.2.30/40), then
    /// the bind.
    fn bind(
        &self,
        dev: &Device,
        mw: u64,
        mw_rkey: Rkey,
        new_rkey: Rkey,
        bind: &RawBind,
        via: MwType,
    ) -> std::result::Result<(), ()> {
        let table = &dev.keys;
        let mut wslot = table.write(mw as u32);
        if wslot.variant != mw_rkey.variant() || new_rkey.index() != mw_rkey.index() {
            return Err(());
        }
        let Some(KeyObj::Mw(w)) = wslot.obj.as_mut() else {
            return Err(());
        };
        if w.ty != via || w.pd != self.pd {
            return Err(());
        }
        if w.ty == MwType::Type2 && (w.binding.is_some() || bind.len == 0) {
            // A type 2 window is bound only from the free state, and never to nothing.
            return Err(());
        }
        if w.ty == MwType::Type1 && bind.access.contains(Access::ZERO_BASED) {
            return Err(());
        }
        let new_binding = if bind.len == 0 {
            None
        } else {
            let mslot = table.read(bind.mr as u32);
            let Some(KeyObj::Mr(mr)) = mslot.obj.as_ref() else {
                return Err(());
            };
            if mslot.variant != bind.mr_lkey.variant() || mr.pd != w.pd || !mr.usable {
                return Err(());
            }
            if !mr.access.contains(Access::MW_BIND) {
                return Err(());
            }
            // A window grants no more than its region allows.
            let remote = bind.access & Access::REMOTE;
            if !mr.access.contains(remote) {
                return Err(());
            }
            if bind
                .access
                .intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
                && !mr.access.contains(Access::LOCAL_WRITE)
            {
                return Err(());
            }
            if !mr.contains(bind.addr as u64, bind.len as u64) {
                return Err(());
            }
            mr.num_mw.fetch_add(1, Ordering::AcqRel);
            Some(MwBinding {
                mr_key: (bind.mr as u32) << 8 | mslot.variant as u32,
                addr: bind.addr,
                len: bind.len,
                access: bind.access,
                qpn: (w.ty == MwType::Type2).then_some(self.qpn),
            })
        };
        if let Some(old) = w.binding.take() {
            release_binding(table, old);
        }
        w.binding = new_binding;
        wslot.variant = new_rkey.variant();
        bump(&dev.counters.mw_binds, 1);
        Ok(())
    }
}

/// Drop a binding's hold on its region.
pub(super) fn release_binding(table: &KeyTable, b: MwBinding) {
    let slot = table.read(b.mr_key >> 8);
    if let Some(KeyObj::Mr(mr)) = slot.obj.as_ref().filter(|_| slot.variant == b.mr_key as u8) {
        mr.num_mw.fetch_sub(1, Ordering::AcqRel);
    }
}

/// LOCAL_INV / SEND_WITH_INV: only a valid type 2 window of the QP's PD can be invalidated
/// (rxe_check_invalidate_mw; o10-37.2.26 forbids type 1); SEND_WITH_INV (`qpn` given) further
/// needs the window bound through the receiving QP.
fn invalidate(dev: &Device, rkey: Rkey, pd: u64, qpn: Option<u32>) -> std::result::Result<(), ()> {
    let table = &dev.keys;
    let mut slot = table.write(rkey.index());
    if slot.variant != rkey.variant() {
        return Err(());
    }
    let Some(KeyObj::Mw(w)) = slot.obj.as_mut() else {
        return Err(());
    };
    if w.ty != MwType::Type2 {
        return Err(());
    }
    let Some(b) = w.binding else { return Err(()) };
    if w.pd != pd || qpn.is_some_and(|q| b.qpn != Some(q)) {
        return Err(());
    }
    w.binding = None;
    release_binding(table, b);
    bump(&dev.counters.invalidations, 1);
    Ok(())
}

impl std::fmt::Debug for QpObj {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QpObj")
            .field("dev", &self.dev_id)
            .field("qpn", &self.qpn)
            .finish()
    }
}
