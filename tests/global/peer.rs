//! A peer: another device (the second test device on verbs, another soft NIC) with a landing
//! zone registered the usual way, connected to a QP on the global pool's PD.

use crate::A;
use crate::common::{self, WAIT};
use rdma_pool::nic::{Access, Buffer, Cq, Mr, Nic, NicKind, Qp, QpCaps, Sge, WcStatus};

pub struct Peer {
    pub cq: Cq,
    pub qp: Qp,
    pub peer_cq: Cq,
    pub peer_qp: Qp,
    pub landing_mr: Mr,
    pub landing: Buffer,
    _peer_nic: Nic,
}

impl Peer {
    /// A peer with a landing zone of `len` bytes.
    pub fn new(len: usize) -> Peer {
        let nic = A.nic().expect("pool NIC");
        let peer_nic = match nic.kind() {
            NicKind::Soft => Nic::soft(),
            _ => common::nics().1,
        };
        let cq = nic.create_cq(256).unwrap();
        let qp = A
            .pd()
            .unwrap()
            .create_qp(&cq, &cq, QpCaps::default())
            .unwrap();
        let peer_pd = peer_nic.alloc_pd().unwrap();
        let peer_cq = peer_nic.create_cq(256).unwrap();
        let peer_qp = peer_pd
            .create_qp(&peer_cq, &peer_cq, QpCaps::default())
            .unwrap();
        common::link(&qp, &peer_qp);
        let mut landing = Buffer::new(len).unwrap();
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        // SAFETY: `landing` outlives its region (both are fields, the region dropped first).
        let landing_mr =
            unsafe { peer_pd.reg_mr(landing.as_mut_ptr(), landing.len(), rw) }.unwrap();
        Peer {
            cq,
            qp,
            peer_cq,
            peer_qp,
            landing_mr,
            landing,
            _peer_nic: peer_nic,
        }
    }

    /// RDMA WRITE `buf` (posted as-is, with the lkey `keys_of` gives) to the start of the
    /// landing zone, and check that exactly its bytes arrived.
    pub fn write_and_check(&mut self, buf: &[u8]) {
        assert!(buf.len() <= self.landing.len());
        let k = rdma_pool::keys_of(buf.as_ptr()).expect("a pool block");
        assert!(k.contains(buf.as_ptr() as usize, buf.len()));
        // Scribble first, so that stale bytes cannot pass for the new ones.
        self.landing.as_mut_slice()[..buf.len()]
            .iter_mut()
            .for_each(|b| *b = !*b);
        let sge = Sge {
            addr: buf.as_ptr() as u64,
            length: buf.len() as u32,
            lkey: k.lkey,
        };
        // SAFETY: the written-from memory stays allocated and unwritten until its completion is polled.
        unsafe {
            self.qp.post_write(
                1,
                &[sge],
                self.landing_mr.addr() as u64,
                self.landing_mr.rkey(),
            )
        }
        .unwrap();
        let status = self.cq.wait_one(WAIT).unwrap().status;
        // On failure, what each soft NIC saw (a stale pinned page: the kernel migrated or
        // dropped a page under a region, which hardware's long-term pin would forbid).
        let seen = |n: &Nic| n.as_soft().map(|s| s.counters());
        assert_eq!(
            status,
            WcStatus::Success,
            "pool NIC {:?}, peer NIC {:?}",
            A.nic().ok().and_then(seen),
            seen(&self._peer_nic)
        );
        assert!(
            self.landing.as_slice()[..buf.len()] == *buf,
            "WRITE of {} bytes",
            buf.len()
        );
    }

    /// The peer READs `buf` from the pool (its rkey from `keys_of`) into the landing zone.
    pub fn peer_reads(&mut self, buf: &[u8]) -> &[u8] {
        let k = rdma_pool::keys_of(buf.as_ptr()).expect("a pool block");
        self.landing.as_mut_slice()[..buf.len()].fill(0);
        let sge = self.landing_mr.sge(0, buf.len()).unwrap();
        // SAFETY: the read's memory stays allocated and unread until its completion is polled.
        unsafe {
            self.peer_qp
                .post_read(2, &[sge], buf.as_ptr() as u64, k.rkey)
        }
        .unwrap();
        assert_eq!(
            self.peer_cq.wait_one(WAIT).unwrap().status,
            WcStatus::Success
        );
        &self.landing.as_slice()[..buf.len()]
    }
}
