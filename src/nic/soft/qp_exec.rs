//! Soft queue pairs: the execution of one request (an `impl QpObj` block; the QP's state and
//! send queue are in `qp.rs`): gathering its bytes through the requester's lkeys, running the
//! operation at the responder through its rkeys (WRITE, READ, atomics, binds, invalidations),
//! scattering what comes back, and delivering SENDs into receives (or parking them).
//!
//! Contract: as `qp.rs` — every key is checked by [`check_and_access`] with the PD and QP
//! number of the QP that uses it, and bytes are buffered only after the key that covers them
//! was checked; an operation that fails at the responder writes nothing there.

use super::counters::bump;
use super::keys::{KeyFault, KeyUse, check_and_access};
use super::mem;
use super::qp::{Inbound, MAX_MSG, Op, OwnedWr, Port, QpObj, Recv, opcode};
use super::sync::lock;
use super::window::{self, WindowBind, bind_status};
use crate::nic::backend::RawSendOp;
use crate::nic::types::*;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Map a requester-side (lkey) fault to its completion status.
fn local_status(f: KeyFault) -> WcStatus {
    match f {
        KeyFault::PageFault | KeyFault::Dma | KeyFault::PinnedPagesGone => WcStatus::LocAccessErr,
        KeyFault::TooLong => WcStatus::LocLenErr,
        _ => WcStatus::LocProtErr,
    }
}

/// What executing a request led to.
pub(super) enum Outcome {
    Done(WcStatus),
    /// A SEND waiting at the responder for a receive.
    Parked,
}

impl QpObj {
    /// Gather the bytes named by local `sges`, each checked before it is buffered.
    fn gather(&self, dev: &dyn Port, sges: &[Sge]) -> std::result::Result<Vec<u8>, KeyFault> {
        if sges.iter().map(|s| s.length as u64).sum::<u64>() > MAX_MSG {
            return Err(KeyFault::TooLong);
        }
        let mut buf = Vec::new();
        // A zero-length entry is skipped, its lkey unchecked (rxe and mlx5 do the same).
        for s in sges.iter().filter(|s| s.length > 0) {
            let len = s.length as usize;
            check_and_access(
                dev.keys(),
                dev.sink(),
                KeyUse {
                    key: s.lkey.0,
                    who: self.who(false),
                    addr: s.addr,
                    len: len as u64,
                    write: false,
                    atomic: false,
                },
                &mut |a| {
                    let start = buf.len();
                    buf.resize(start + len, 0);
                    mem::dma_copy(buf[start..].as_mut_ptr() as usize, a, len)
                },
            )?;
        }
        Ok(buf)
    }

    /// The bytes a SEND or WRITE carries: copied at post time when inline, else gathered now.
    fn payload(
        &self,
        dev: &dyn Port,
        sges: &[Sge],
        inline: Option<&[u8]>,
    ) -> std::result::Result<Vec<u8>, KeyFault> {
        match inline {
            Some(data) => Ok(data.to_vec()),
            None => self.gather(dev, sges),
        }
    }

    /// Scatter `data` into local `sges` (which need LOCAL_WRITE).
    fn scatter(
        &self,
        dev: &dyn Port,
        sges: &[Sge],
        data: &[u8],
    ) -> std::result::Result<(), KeyFault> {
        let mut off = 0;
        for s in sges.iter().filter(|s| s.length > 0) {
            if off >= data.len() {
                break;
            }
            let len = (s.length as usize).min(data.len() - off);
            let src = data[off..].as_ptr() as usize;
            check_and_access(
                dev.keys(),
                dev.sink(),
                KeyUse {
                    key: s.lkey.0,
                    who: self.who(false),
                    addr: s.addr,
                    len: len as u64,
                    write: true,
                    atomic: false,
                },
                &mut |a| mem::dma_copy(a, src, len),
            )?;
            off += len;
        }
        Ok(())
    }

    pub(super) fn execute(self: &Arc<Self>, dev: &dyn Port, wr: &OwnedWr) -> Outcome {
        let (wr_id, signaled, sges, inline) =
            (wr.wr_id, wr.signaled, &wr.sges[..], wr.inline.as_deref());
        let op = match wr.op {
            Op::Wr(op) => op,
            Op::BindType1(req) => {
                let r = window::bind(dev.keys(), dev.counters(), self.who(false), &req);
                return Outcome::Done(bind_status(r, WcStatus::MwBindErr));
            }
        };
        let status = match op {
            RawSendOp::Write { remote_addr, rkey } => {
                let data = match self.payload(dev, sges, inline) {
                    Ok(d) => d,
                    Err(f) => return Outcome::Done(local_status(f)),
                };
                let Some((pdev, peer)) = self.peer() else {
                    return Outcome::Done(WcStatus::RetryExcErr);
                };
                if data.is_empty() {
                    // C9-88: a zero-length RDMA request's rkey is not checked.
                    return Outcome::Done(WcStatus::Success);
                }
                let src = data.as_ptr() as usize;
                let r = check_and_access(
                    pdev.keys(),
                    pdev.sink(),
                    KeyUse {
                        key: rkey.0,
                        who: peer.who(true),
                        addr: remote_addr,
                        len: data.len() as u64,
                        write: true,
                        atomic: false,
                    },
                    &mut |a| mem::dma_copy(a, src, data.len()),
                );
                match r {
                    Ok(()) => {
                        bump(&dev.counters().bytes_moved, data.len() as u64);
                        WcStatus::Success
                    }
                    Err(_) => peer.remote_access_error(),
                }
            }
            RawSendOp::Read { remote_addr, rkey } => {
                let total: u64 = sges.iter().map(|s| s.length as u64).sum();
                if total > MAX_MSG {
                    return Outcome::Done(WcStatus::LocLenErr);
                }
                let Some((pdev, peer)) = self.peer() else {
                    return Outcome::Done(WcStatus::RetryExcErr);
                };
                if total == 0 {
                    return Outcome::Done(WcStatus::Success);
                }
                let mut data = Vec::new();
                let r = check_and_access(
                    pdev.keys(),
                    pdev.sink(),
                    KeyUse {
                        key: rkey.0,
                        who: peer.who(true),
                        addr: remote_addr,
                        len: total,
                        write: false,
                        atomic: false,
                    },
                    &mut |a| {
                        data.resize(total as usize, 0);
                        mem::dma_copy(data.as_mut_ptr() as usize, a, total as usize)
                    },
                );
                if r.is_err() {
                    return Outcome::Done(peer.remote_access_error());
                }
                match self.scatter(dev, sges, &data) {
                    Ok(()) => {
                        bump(&dev.counters().bytes_moved, total);
                        WcStatus::Success
                    }
                    Err(f) => local_status(f),
                }
            }
            RawSendOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => self.atomic(dev, sges, remote_addr, rkey, |v| {
                if v == compare { swap } else { v }
            }),
            RawSendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => self.atomic(dev, sges, remote_addr, rkey, |v| v.wrapping_add(add)),
            RawSendOp::Send
            | RawSendOp::SendWithImm(_)
            | RawSendOp::SendWithInv(_)
            | RawSendOp::WriteWithImm { .. } => {
                let payload = match self.payload(dev, sges, inline) {
                    Ok(d) => d,
                    Err(f) => return Outcome::Done(local_status(f)),
                };
                let Some((pdev, peer)) = self.peer() else {
                    return Outcome::Done(WcStatus::RetryExcErr);
                };
                let (invalidate, imm, write) = match op {
                    RawSendOp::SendWithInv(k) => (Some(k), None, None),
                    RawSendOp::SendWithImm(imm) => (None, Some(imm), None),
                    RawSendOp::WriteWithImm {
                        remote_addr,
                        rkey,
                        imm,
                    } => (None, Some(imm), Some((remote_addr, rkey))),
                    _ => (None, None, None),
                };
                // Record it as parked before the responder can see it, so its completion by
                // the responder's next receive always finds it.
                let opcode = opcode(&Op::Wr(op));
                lock(&self.st).parked.push_back((wr_id, signaled, opcode));
                let msg = Inbound {
                    payload,
                    invalidate,
                    imm,
                    write,
                    solicited: wr.solicited,
                    sender: Arc::downgrade(self),
                };
                match peer.deliver(&*pdev, msg) {
                    Some(status) => {
                        lock(&self.st).parked.pop_back();
                        status
                    }
                    None => return Outcome::Parked,
                }
            }
            RawSendOp::BindMw {
                mw,
                mw_rkey,
                new_rkey,
                bind,
            } => {
                let req = WindowBind {
                    mw,
                    mw_rkey,
                    new_rkey,
                    bind,
                    via: MwType::Type2,
                };
                let r = window::bind(dev.keys(), dev.counters(), self.who(false), &req);
                bind_status(r, WcStatus::MwBindErr)
            }
            RawSendOp::LocalInv(rkey) => {
                let r = window::invalidate(dev.keys(), dev.counters(), rkey, self.pd, None);
                bind_status(r, WcStatus::LocQpOpErr)
            }
        };
        Outcome::Done(status)
    }

    /// The responder side of a remote access error (bad key, bounds, rights): an IB class C
    /// error moves the responder to the error state too, flushing its receives (rxe
    /// `rxe_resp.c`); the requester gets `REM_ACCESS_ERR`.
    fn remote_access_error(&self) -> WcStatus {
        self.set_error();
        WcStatus::RemAccessErr
    }

    /// An RC atomic: 8 bytes at `remote_addr` (8-aligned, else the responder NAKs an invalid
    /// request), through a key with `REMOTE_ATOMIC`, replaced by `f` of their value in one
    /// atomic step (other atomics and the CPU see it whole); the original value is scattered
    /// into the 8 local bytes `sges` names.
    fn atomic(
        &self,
        dev: &dyn Port,
        sges: &[Sge],
        remote_addr: u64,
        rkey: Rkey,
        f: impl Fn(u64) -> u64,
    ) -> WcStatus {
        let total: u64 = sges.iter().map(|s| s.length as u64).sum();
        if total != 8 {
            return WcStatus::LocLenErr;
        }
        let Some((pdev, peer)) = self.peer() else {
            return WcStatus::RetryExcErr;
        };
        if remote_addr % 8 != 0 {
            peer.set_error();
            return WcStatus::RemInvReqErr;
        }
        let mut old = 0u64;
        let r = check_and_access(
            pdev.keys(),
            pdev.sink(),
            KeyUse {
                key: rkey.0,
                who: peer.who(true),
                addr: remote_addr,
                len: 8,
                write: true,
                atomic: true,
            },
            &mut |a| {
                // A copy first: it faults safely where the page is gone, the atomic would not.
                mem::dma_copy(&mut old as *mut u64 as usize, a, 8)?;
                // SAFETY: `a` is 8-aligned (checked) and names 8 bytes of the registered,
                // mapped and writable range the key check proved; every access the NIC makes
                // there is atomic, and the program's own are its business (as with hardware).
                let cell = unsafe { std::sync::atomic::AtomicU64::from_ptr(a as *mut u64) };
                old = match cell.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| Some(f(v))) {
                    Ok(v) | Err(v) => v,
                };
                Ok(())
            },
        );
        if r.is_err() {
            return peer.remote_access_error();
        }
        match self.scatter(dev, sges, &old.to_ne_bytes()) {
            Ok(()) => {
                bump(&dev.counters().bytes_moved, 8);
                WcStatus::Success
            }
            Err(f) => local_status(f),
        }
    }

    /// Responder side of a SEND: into the next receive, or parked until one is posted.
    /// Returns the sender's status when it completed now.
    fn deliver(self: &Arc<Self>, dev: &dyn Port, msg: Inbound) -> Option<WcStatus> {
        let _rx = lock(&self.rx);
        if let Some(srq) = &self.srq {
            let recv = {
                let mut q = lock(&srq.q);
                let mut st = lock(&self.st);
                if st.state != QpState::Ready {
                    return Some(WcStatus::RetryExcErr);
                }
                match q.recvs.pop_front() {
                    Some(r) => r,
                    None => {
                        st.inbound.push_back(msg);
                        q.waiting.push_back(Arc::downgrade(self));
                        return None;
                    }
                }
            };
            return Some(self.land(dev, recv, &msg));
        }
        let recv = {
            let mut st = lock(&self.st);
            if st.state != QpState::Ready {
                return Some(WcStatus::RetryExcErr);
            }
            match st.recvs.pop_front() {
                Some(r) => r,
                None => {
                    st.inbound.push_back(msg);
                    return None;
                }
            }
        };
        Some(self.land(dev, recv, &msg))
    }

    /// Land `msg` in `recv`; completes the receive; returns the sender's status.
    pub(super) fn land(&self, dev: &dyn Port, recv: Recv, msg: &Inbound) -> WcStatus {
        let cap: usize = recv.sges.iter().map(|s| s.length as usize).sum();
        let mut wc = self.wc(recv.wr_id, WcOpcode::Recv, WcStatus::Success);
        wc.imm_data = msg.imm;
        let sender_status = if let Some((addr, rkey)) = msg.write {
            // WRITE_WITH_IMM: the bytes go where the key says; the receive only reports.
            wc.opcode = WcOpcode::RecvRdmaWithImm;
            let src = msg.payload.as_ptr() as usize;
            let len = msg.payload.len();
            let r = if len == 0 {
                Ok(())
            } else {
                check_and_access(
                    dev.keys(),
                    dev.sink(),
                    KeyUse {
                        key: rkey.0,
                        who: self.who(true),
                        addr,
                        len: len as u64,
                        write: true,
                        atomic: false,
                    },
                    &mut |a| mem::dma_copy(a, src, len),
                )
            };
            match r {
                Ok(()) => WcStatus::Success,
                Err(_) => {
                    // Refused before the receive is consumed: it is flushed with the others.
                    wc.status = WcStatus::WrFlushErr;
                    WcStatus::RemAccessErr
                }
            }
        } else if msg.payload.len() > cap {
            wc.status = WcStatus::LocLenErr;
            WcStatus::RemInvReqErr
        } else if let Err(f) = self.scatter(dev, &recv.sges, &msg.payload) {
            wc.status = local_status(f);
            WcStatus::RemOpErr
        } else if let Some(rkey) = msg.invalidate {
            match window::invalidate(dev.keys(), dev.counters(), rkey, self.pd, Some(self.qpn)) {
                Ok(()) => {
                    wc.invalidated_rkey = Some(rkey);
                    WcStatus::Success
                }
                Err(fault) => {
                    tracing::debug!(?fault, "soft NIC: SEND_WITH_INV refused");
                    wc.status = WcStatus::RemInvReqErr;
                    WcStatus::RemInvReqErr
                }
            }
        } else {
            WcStatus::Success
        };
        wc.byte_len = msg.payload.len() as u32;
        if wc.status == WcStatus::Success {
            bump(&dev.counters().bytes_moved, msg.payload.len() as u64);
        }
        if !self.recv_cq.push_event(wc, msg.solicited) || wc.status != WcStatus::Success {
            self.set_error();
        }
        sender_status
    }
}
