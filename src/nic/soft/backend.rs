//! The soft NIC's verbs: the [`Backend`] implementation over a [`Device`].
//!
//! Contract: each verb first consumes an injected fault for itself (`SoftNic::fail_next`), then
//! checks its arguments as the kernel and the providers do, then acts; a verb that fails
//! changes nothing. Data-path verbs (`post_send`, `post_recv`, `poll_cq`) look their QP or CQ up
//! in one shard and hand the work to it (`qp.rs`).

use super::counters::bump;
use super::cq::{ChannelObj, CqObj};
use super::device::{Device, SoftNic, reserve};
use super::fabric;
use super::keys::{KeyObj, MwObj};
use super::memlock::page_span;
use super::prefetch::{PrefetchJob, map_cpu_resident, prefetch_now};
use super::qp::{MAX_INLINE, Port, QpObj};
use super::srq::SrqObj;
use super::sync::lock;
use super::window::release_binding;
use super::{mem, rereg};
use crate::nic::backend::{Backend, RawBind, RawMr, RawSendWr};
use crate::nic::error::{Error, ReregError, Result, Verb};
use crate::nic::types::*;
use std::any::Any;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

/// What a QP keeps of its device.
fn port_of(dev: &Arc<Device>) -> Weak<dyn Port> {
    let dev: Arc<dyn Port> = dev.clone();
    Arc::downgrade(&dev)
}

impl Backend for SoftNic {
    fn caps(&self) -> &Caps {
        &self.dev.caps
    }

    fn kind(&self) -> NicKind {
        NicKind::Soft
    }

    fn fork_status(&self) -> ForkStatus {
        self.dev.config.fork
    }

    fn poll_async_event(&self) -> Result<Option<AsyncEvent>> {
        Ok(lock(&self.dev.events).pop_front())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn alloc_pd(&self) -> Result<u64> {
        self.dev.inject(Verb::AllocPd)?;
        Ok(lock(&self.dev.pds).insert(0) as u64)
    }

    fn dealloc_pd(&self, pd: u64) -> Result<()> {
        self.dev.inject(Verb::DeallocPd)?;
        let mut pds = lock(&self.dev.pds);
        match pds.get(pd as usize) {
            None => Err(Error::from_errno(Verb::DeallocPd, libc::EINVAL)),
            Some(&n) if n > 0 => Err(Error::from_errno(Verb::DeallocPd, libc::EBUSY)),
            Some(_) => {
                pds.remove(pd as usize);
                Ok(())
            }
        }
    }

    fn reg_mr(&self, pd: u64, addr: usize, len: usize, access: Access) -> Result<RawMr> {
        let dev = &self.dev;
        dev.inject(Verb::RegMr)?;
        if !dev.pd_exists(pd) {
            return Err(Error::from_errno(Verb::RegMr, libc::EINVAL));
        }
        reserve(&dev.mr_count, dev.config.max_mr, Verb::RegMr, "max_mr")?;
        let obj = match dev.make_mr(pd, addr, len, access) {
            Ok(o) => o,
            Err(e) => {
                dev.mr_count.fetch_sub(1, Ordering::AcqRel);
                return Err(Error::from_errno(Verb::RegMr, e));
            }
        };
        let pinned = obj.pinned;
        // The mlx5 model: a cached mkey of the region's entry comes back with its key.
        let obj = match obj.cache_ndescs {
            Some(bucket) => dev.keys.insert_cached(bucket, Box::new(KeyObj::Mr(obj))),
            None => Err(Box::new(KeyObj::Mr(obj))),
        };
        let Some(key) = obj.map_or_else(|obj| dev.keys.insert(*obj), Some) else {
            dev.memlock.release(pinned);
            dev.mr_count.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::from_errno(Verb::RegMr, libc::ENOMEM));
        };
        dev.pd_ref(pd, 1);
        bump(&dev.counters.registrations, 1);
        Ok(RawMr {
            handle: (key >> 8) as u64,
            lkey: Lkey(key),
            rkey: Rkey(key),
            addr,
            len,
        })
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
        let requested = MrAttrs {
            pd,
            addr,
            len,
            access,
        };
        rereg::rereg(&self.dev, mr, flags, requested)
    }

    fn dereg_mr(&self, mr: u64) -> Result<()> {
        let dev = &self.dev;
        dev.inject(Verb::DeregMr)?;
        let check = |obj: &KeyObj| match obj {
            KeyObj::Mr(m) if m.num_mw.load(Ordering::Acquire) > 0 => Err(libc::EBUSY),
            KeyObj::Mr(_) => Ok(()),
            KeyObj::Mw(_) => Err(libc::EINVAL),
        };
        // The mlx5 model: a region from the mkey cache goes back to it, key and all (only
        // a usable one: a failed re-registration destroys the mkey).
        let bucket = match dev.keys.read(mr as u32).obj.as_ref() {
            Some(KeyObj::Mr(m)) if m.usable && !m.revoked => m.cache_ndescs,
            _ => None,
        };
        let removed = match bucket {
            Some(b) => dev.keys.remove_to_cache(mr as u32, b, check),
            None => dev.keys.remove_if(mr as u32, check),
        };
        match removed {
            Ok(KeyObj::Mr(m)) => {
                if m.pins.as_ref().is_some_and(|p| !p.held(m.addr, m.len)) {
                    bump(&dev.counters.stale_pinned_releases, 1);
                }
                dev.memlock.release(m.pinned);
                dev.pd_ref(m.pd, -1);
                dev.mr_count.fetch_sub(1, Ordering::AcqRel);
                bump(&dev.counters.deregistrations, 1);
                Ok(())
            }
            Ok(KeyObj::Mw(_)) => Err(Error::from_errno(Verb::DeregMr, libc::EINVAL)),
            Err(errno) => Err(Error::from_errno(Verb::DeregMr, errno)),
        }
    }

    fn advise_mr(&self, pd: u64, advice: Advice, flags: AdviseFlags, sges: &[Sge]) -> Result<()> {
        let dev = &self.dev;
        dev.inject(Verb::AdviseMr)?;
        let e = |errno| Error::from_errno(Verb::AdviseMr, errno);
        if !dev.config.advise_mr {
            return Err(e(libc::EOPNOTSUPP));
        }
        if !dev.pd_exists(pd) || flags.bits() & !AdviseFlags::FLUSH.bits() != 0 {
            return Err(e(libc::EINVAL));
        }
        // Validate every entry before acting on any (nothing half-done on bad input).
        for sge in sges {
            let slot = dev.keys.read(sge.lkey.index());
            match slot.obj.as_ref() {
                None => return Err(e(libc::EFAULT)),
                Some(KeyObj::Mw(_)) => return Err(e(libc::EINVAL)),
                Some(KeyObj::Mr(_)) if slot.variant != sge.lkey.variant() => {
                    return Err(e(libc::ENOENT));
                }
                Some(KeyObj::Mr(mr)) => {
                    if mr.pd != pd {
                        return Err(e(libc::EPERM));
                    }
                    if mr.odp.is_none() || !mr.usable {
                        return Err(e(libc::EINVAL));
                    }
                    if !mr.contains(sge.addr, sge.length as u64) {
                        return Err(e(libc::EFAULT));
                    }
                    if advice == Advice::PrefetchWrite && !mr.access.contains(Access::LOCAL_WRITE) {
                        return Err(e(libc::EPERM));
                    }
                }
            }
        }
        for sge in sges {
            match advice {
                // Map only what the CPU already has; never fault.
                Advice::PrefetchNoFault => map_cpu_resident(&dev.keys, &dev.counters, sge),
                Advice::Prefetch | Advice::PrefetchWrite => {
                    let job = PrefetchJob {
                        lkey: sge.lkey.0,
                        addr: sge.addr,
                        len: sge.length as u64,
                        write: advice == Advice::PrefetchWrite,
                    };
                    // FLUSH: now. Otherwise by the prefetch thread, or now when there is none.
                    if flags.contains(AdviseFlags::FLUSH) || dev.prefetcher.submit(job).is_err() {
                        prefetch_now(&dev.keys, &dev.counters, &job).map_err(e)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn alloc_mw(&self, pd: u64, ty: MwType) -> Result<(u64, Rkey)> {
        let dev = &self.dev;
        dev.inject(Verb::AllocMw)?;
        if !dev.pd_exists(pd) {
            return Err(Error::from_errno(Verb::AllocMw, libc::EINVAL));
        }
        let supported = match ty {
            MwType::Type1 => dev.config.mw_type1,
            MwType::Type2 => dev.config.mw_type2,
        };
        if !supported {
            return Err(Error::from_errno(Verb::AllocMw, libc::EOPNOTSUPP));
        }
        reserve(&dev.mw_count, dev.config.max_mw, Verb::AllocMw, "max_mw")?;
        let Some(key) = dev.keys.insert(KeyObj::Mw(MwObj {
            pd,
            ty,
            binding: None,
        })) else {
            dev.mw_count.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::from_errno(Verb::AllocMw, libc::ENOMEM));
        };
        dev.pd_ref(pd, 1);
        Ok(((key >> 8) as u64, Rkey(key)))
    }

    fn bind_mw(&self, qp: u64, mw: u64, mw_rkey: Rkey, bind: &RawBind) -> Result<Rkey> {
        self.dev.inject(Verb::BindMw)?;
        let qp = self.qp(qp, Verb::BindMw)?;
        let new_rkey = mw_rkey.next_variant();
        qp.bind_type1(&*self.dev, mw, mw_rkey, new_rkey, bind)?;
        Ok(new_rkey)
    }

    fn dealloc_mw(&self, mw: u64) -> Result<()> {
        let dev = &self.dev;
        dev.inject(Verb::DeallocMw)?;
        let removed = dev.keys.remove_if(mw as u32, |obj| match obj {
            KeyObj::Mw(_) => Ok(()),
            KeyObj::Mr(_) => Err(libc::EINVAL),
        });
        match removed {
            Ok(KeyObj::Mw(w)) => {
                if let Some(b) = w.binding {
                    release_binding(&dev.keys, b);
                }
                dev.pd_ref(w.pd, -1);
                dev.mw_count.fetch_sub(1, Ordering::AcqRel);
                Ok(())
            }
            Ok(KeyObj::Mr(_)) => Err(Error::from_errno(Verb::DeallocMw, libc::EINVAL)),
            Err(errno) => Err(Error::from_errno(Verb::DeallocMw, errno)),
        }
    }

    fn create_cq(&self, depth: u32, channel: Option<u64>) -> Result<u64> {
        self.dev.inject(Verb::CreateCq)?;
        let channel = match channel {
            None => None,
            Some(c) => Some(
                lock(&self.dev.channels)
                    .get(c as usize)
                    .cloned()
                    .ok_or_else(|| Error::from_errno(Verb::CreateCq, libc::EINVAL))?,
            ),
        };
        let h = self.dev.next_handle.fetch_add(1, Ordering::Relaxed);
        self.dev
            .cqs
            .shard(h)
            .insert(h, Arc::new(CqObj::new(depth, channel)));
        Ok(h)
    }

    fn create_comp_channel(&self) -> Result<(u64, RawFd)> {
        self.dev.inject(Verb::CreateCompChannel)?;
        let c = ChannelObj::new().map_err(|source| Error::Verb {
            verb: Verb::CreateCompChannel,
            source,
        })?;
        let fd = c.raw_fd();
        Ok((lock(&self.dev.channels).insert(Arc::new(c)) as u64, fd))
    }

    fn destroy_comp_channel(&self, channel: u64) -> Result<()> {
        let mut channels = lock(&self.dev.channels);
        match channels.get(channel as usize) {
            None => Err(Error::from_errno(Verb::CreateCompChannel, libc::EINVAL)),
            Some(c) if c.users.load(Ordering::Acquire) > 0 => {
                Err(Error::from_errno(Verb::CreateCompChannel, libc::EBUSY))
            }
            Some(_) => {
                channels.remove(channel as usize);
                Ok(())
            }
        }
    }

    fn get_cq_events(&self, channel: u64) -> Result<u64> {
        self.dev.inject(Verb::GetCqEvent)?;
        let c = lock(&self.dev.channels)
            .get(channel as usize)
            .cloned()
            .ok_or_else(|| Error::from_errno(Verb::GetCqEvent, libc::EINVAL))?;
        c.take().map_err(|source| Error::Verb {
            verb: Verb::GetCqEvent,
            source,
        })
    }

    fn req_notify_cq(&self, cq: u64, solicited_only: bool) -> Result<()> {
        self.dev.inject(Verb::ReqNotifyCq)?;
        let c = self.cq(cq, Verb::ReqNotifyCq)?;
        if c.arm(solicited_only) {
            Ok(())
        } else {
            Err(Error::from_errno(Verb::ReqNotifyCq, libc::EINVAL))
        }
    }

    fn destroy_cq(&self, cq: u64) -> Result<()> {
        self.dev.inject(Verb::DestroyCq)?;
        let mut cqs = self.dev.cqs.shard(cq);
        match cqs.get(&cq) {
            None => Err(Error::from_errno(Verb::DestroyCq, libc::EINVAL)),
            // QPs still post to it.
            Some(c) if c.users.load(Ordering::Acquire) > 0 => {
                Err(Error::from_errno(Verb::DestroyCq, libc::EBUSY))
            }
            Some(_) => {
                cqs.remove(&cq);
                Ok(())
            }
        }
    }

    fn poll_cq(&self, cq: u64, out: &mut [Completion]) -> Result<usize> {
        self.dev.inject(Verb::PollCq)?;
        Ok(self.cq(cq, Verb::PollCq)?.poll(out))
    }

    fn create_qp(
        &self,
        pd: u64,
        send_cq: u64,
        recv_cq: u64,
        srq: Option<u64>,
        caps: &QpCaps,
    ) -> Result<(u64, u32, QpCaps)> {
        let dev = &self.dev;
        dev.inject(Verb::CreateQp)?;
        let srq = match srq {
            None => None,
            Some(h) => match lock(&dev.srqs).get(h as usize) {
                // An SRQ of another PD is refused, as the kernel does.
                Some(s) if s.pd == pd => Some(s.clone()),
                _ => return Err(Error::from_errno(Verb::CreateQp, libc::EINVAL)),
            },
        };
        if caps.max_inline_data > MAX_INLINE {
            return Err(Error::from_errno(Verb::CreateQp, libc::EINVAL));
        }
        // As rxe: the inline area is the SGE area of the largest send, at least as asked.
        let caps = &QpCaps {
            max_inline_data: caps
                .max_inline_data
                .max(16 * caps.max_send_sge)
                .min(MAX_INLINE),
            ..*caps
        };
        if !dev.pd_exists(pd) {
            return Err(Error::from_errno(Verb::CreateQp, libc::EINVAL));
        }
        let (scq, rcq) = {
            let s = dev.cqs.shard(send_cq).get(&send_cq).cloned();
            let r = dev.cqs.shard(recv_cq).get(&recv_cq).cloned();
            match (s, r) {
                (Some(s), Some(r)) => (s, r),
                _ => return Err(Error::from_errno(Verb::CreateQp, libc::EINVAL)),
            }
        };
        let qpn = dev.next_qpn.fetch_add(1, Ordering::Relaxed) & 0xff_ffff;
        let h = dev.next_handle.fetch_add(1, Ordering::Relaxed);
        let qp = Arc::new(QpObj::new(port_of(dev), pd, qpn, scq, rcq, srq, *caps));
        lock(&dev.qpns).insert(qpn, Arc::downgrade(&qp));
        dev.qps.shard(h).insert(h, qp);
        dev.pd_ref(pd, 1);
        Ok((h, qpn, *caps))
    }

    fn endpoint(&self, qp: u64, gid_index: u8) -> Result<Endpoint> {
        let q = self.qp(qp, Verb::ModifyQp)?;
        // One GID per soft port.
        if gid_index != 0 {
            return Err(Error::from_errno(Verb::QueryGid, libc::EINVAL));
        }
        Ok(Endpoint {
            gid: fabric::soft_gid(self.dev.id),
            qpn: q.qpn,
            lid: 0,
            psn: q.qpn & 0xff_ffff,
        })
    }

    fn connect_qp(&self, qp: u64, remote: &Endpoint, opts: &ConnectOptions) -> Result<()> {
        self.dev.inject(Verb::ModifyQp)?;
        // One GID per soft port; the wire-level settings have nothing to act on.
        if opts.gid_index != 0 {
            return Err(Error::from_errno(Verb::ModifyQp, libc::EINVAL));
        }
        let q = self.qp(qp, Verb::ModifyQp)?;
        let peer_dev = fabric::device_of(&remote.gid)
            .ok_or_else(|| Error::from_errno(Verb::ModifyQp, libc::EINVAL))?;
        let peer = lock(&peer_dev.qpns)
            .get(&remote.qpn)
            .and_then(Weak::upgrade)
            .ok_or_else(|| Error::from_errno(Verb::ModifyQp, libc::EINVAL))?;
        if !q.connect(port_of(&peer_dev), Arc::downgrade(&peer)) {
            // ibv_modify_qp to RTR is valid from INIT only.
            return Err(Error::from_errno(Verb::ModifyQp, libc::EINVAL));
        }
        Ok(())
    }

    fn qp_state(&self, qp: u64) -> Result<QpState> {
        self.dev.inject(Verb::QueryQp)?;
        Ok(self.qp(qp, Verb::QueryQp)?.state())
    }

    fn destroy_qp(&self, qp: u64) -> Result<()> {
        let dev = &self.dev;
        dev.inject(Verb::DestroyQp)?;
        let q = dev
            .qps
            .shard(qp)
            .remove(&qp)
            .ok_or_else(|| Error::from_errno(Verb::DestroyQp, libc::EINVAL))?;
        lock(&dev.qpns).remove(&q.qpn);
        q.quiesce();
        dev.pd_ref(q.pd, -1);
        Ok(())
    }

    fn post_send(&self, qp: u64, wr: &RawSendWr<'_>) -> Result<()> {
        self.dev.inject(Verb::PostSend)?;
        let q = self.qp(qp, Verb::PostSend)?;
        q.post_send(&*self.dev, wr)
    }

    fn create_srq(&self, pd: u64, max_wr: u32, max_sge: u32) -> Result<u64> {
        let dev = &self.dev;
        dev.inject(Verb::CreateSrq)?;
        if !dev.pd_exists(pd) || max_sge > dev.caps.max_sge || max_wr > dev.caps.max_qp_wr {
            return Err(Error::from_errno(Verb::CreateSrq, libc::EINVAL));
        }
        let h = lock(&dev.srqs).insert(Arc::new(SrqObj::new(pd, max_wr.max(1), max_sge)));
        dev.pd_ref(pd, 1);
        Ok(h as u64)
    }

    fn destroy_srq(&self, srq: u64) -> Result<()> {
        let dev = &self.dev;
        dev.inject(Verb::DestroySrq)?;
        let mut srqs = lock(&dev.srqs);
        match srqs.get(srq as usize) {
            None => Err(Error::from_errno(Verb::DestroySrq, libc::EINVAL)),
            Some(s) if s.users.load(Ordering::Acquire) > 0 => {
                Err(Error::from_errno(Verb::DestroySrq, libc::EBUSY))
            }
            Some(_) => {
                let s = srqs.remove(srq as usize);
                drop(srqs);
                dev.pd_ref(s.pd, -1);
                Ok(())
            }
        }
    }

    fn post_srq_recv(&self, srq: u64, wr_id: u64, sges: &[Sge]) -> Result<()> {
        self.dev.inject(Verb::PostSrqRecv)?;
        let s = lock(&self.dev.srqs)
            .get(srq as usize)
            .cloned()
            .ok_or_else(|| Error::from_errno(Verb::PostSrqRecv, libc::EINVAL))?;
        QpObj::post_srq_recv(&s, &*self.dev, wr_id, sges)
    }

    fn post_recv(&self, qp: u64, wr_id: u64, sges: &[Sge]) -> Result<()> {
        self.dev.inject(Verb::PostRecv)?;
        let q = self.qp(qp, Verb::PostRecv)?;
        q.post_recv(&*self.dev, wr_id, sges)
    }

    fn umem_reg(
        &self,
        addr: usize,
        len: usize,
        access: Access,
        pgsz_bitmap: u64,
    ) -> Result<(u64, u32)> {
        let dev = &self.dev;
        dev.inject(Verb::UmemReg)?;
        let e = |errno| Error::from_errno(Verb::UmemReg, errno);
        if !dev.config.devx {
            return Err(Error::Unsupported {
                verb: Verb::UmemReg,
                detail: "DEVX is disabled on this soft device".into(),
            });
        }
        // devx.c accepts exactly these flags (uverbs_get_flags32), then ib_check_mr_access.
        let allowed = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::RELAXED_ORDERING;
        if !access.is_valid_for_mr() || access.intersects(!allowed) {
            return Err(e(libc::EINVAL));
        }
        let prot = mem::range_prot(addr, len).ok_or_else(|| e(libc::EFAULT))?;
        if !prot.read || (access.contains(Access::LOCAL_WRITE) && !prot.write) {
            return Err(e(libc::EFAULT));
        }
        // The device maps the buffer with one page size from the bitmap: at least the base page,
        // at most what backs the memory (a larger page would need physical contiguity), and a
        // page larger than the base page only for a buffer aligned to it (queue objects address
        // the UMEM in whole pages from its start).
        let backing = mem::backing_page_size(addr).unwrap_or(mem::page_size()) as u64;
        let base = mem::page_size() as u64;
        let fits = (12..64)
            .map(|bit| 1u64 << bit)
            .any(|p| pgsz_bitmap & p != 0 && p <= backing && (p == base || addr as u64 % p == 0));
        if !fits {
            return Err(e(libc::EINVAL));
        }
        let pinned = page_span(addr, len);
        dev.memlock.charge(pinned).map_err(e)?;
        let id = dev.next_handle.fetch_add(1, Ordering::Relaxed) as u32;
        let h = lock(&dev.umems).insert((id, pinned)) as u64;
        Ok((h, id))
    }

    fn umem_dereg(&self, umem: u64) -> Result<()> {
        self.dev.inject(Verb::UmemDereg)?;
        let (_, pinned) = lock(&self.dev.umems)
            .try_remove(umem as usize)
            .ok_or_else(|| Error::from_errno(Verb::UmemDereg, libc::EINVAL))?;
        self.dev.memlock.release(pinned);
        Ok(())
    }
}

impl SoftNic {
    /// The QP behind handle `qp`.
    fn cq(&self, cq: u64, verb: Verb) -> Result<Arc<CqObj>> {
        self.dev
            .cqs
            .shard(cq)
            .get(&cq)
            .cloned()
            .ok_or_else(|| Error::from_errno(verb, libc::EINVAL))
    }

    fn qp(&self, qp: u64, verb: Verb) -> Result<Arc<QpObj>> {
        self.dev
            .qps
            .shard(qp)
            .get(&qp)
            .cloned()
            .ok_or_else(|| Error::from_errno(verb, libc::EINVAL))
    }
}
