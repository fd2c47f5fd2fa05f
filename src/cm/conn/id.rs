//! The rdma_cm id: created on an event channel, bound to a device context by rdma_cm, and the
//! `rdma_create_qp` that makes its QP in the caller's PD on the caller's CQs.
//!
//! Contract:
//! - an [`Id`] owns its `rdma_cm_id` and destroys it on drop, but never its QP: once created,
//!   the QP is the [`Qp`]'s to destroy (the id's `qp` pointer is cleared before
//!   `rdma_destroy_id`);
//! - a QP is created only in a PD of the device the id is bound to, on CQs of that device, and
//!   with an SRQ only of that PD whose CQ is the receive CQ; anything else is refused
//!   ([`CmError::WrongDevice`], or an invalid-argument NIC error) before the call.

use crate::cm::event::Channel;
use crate::cm::{CmError, QpSpec};
use crate::nic::Qp;
use rdma_sys as ffi;

/// An rdma_cm id, destroyed on drop (its QP, if any, is the [`Qp`]'s to destroy).
pub(super) struct Id(pub(super) *mut ffi::rdma_cm_id);

// SAFETY: librdmacm's id calls are thread-safe; the pointer is only passed to them.
unsafe impl Send for Id {}
// SAFETY: as above.
unsafe impl Sync for Id {}

impl Id {
    pub(super) fn new(ch: &Channel) -> Result<Id, CmError> {
        let mut id = std::ptr::null_mut();
        // SAFETY: `ch` is live; `id` is ours.
        let rc = unsafe {
            ffi::rdma_create_id(
                ch.raw,
                &mut id,
                std::ptr::null_mut(),
                ffi::rdma_port_space::RDMA_PS_TCP,
            )
        };
        if rc != 0 {
            return Err(CmError::os("rdma_create_id"));
        }
        Ok(Id(id))
    }

    /// The device context rdma_cm bound the id to (null before its address is known).
    pub(super) fn verbs(&self) -> *mut std::ffi::c_void {
        // SAFETY: the id is live.
        unsafe { (*self.0).verbs.cast() }
    }

    pub(super) fn check_device(&self, spec: &QpSpec<'_>) -> Result<(), CmError> {
        if spec.pd.nic().raw_context() != Some(self.verbs()) {
            return Err(CmError::WrongDevice);
        }
        Ok(())
    }

    /// `rdma_create_qp` in the spec's PD on its CQs, as an owned [`Qp`].
    pub(super) fn create_qp(&self, spec: &QpSpec<'_>) -> Result<Qp, CmError> {
        self.check_device(spec)?;
        // The CQs and SRQ must be the PD's device's: a handle of another context would name
        // another object there.
        let nic = spec.pd.nic();
        if !nic.same_device(spec.send_cq.nic()) || !nic.same_device(spec.recv_cq.nic()) {
            return Err(CmError::Nic(crate::nic::Error::invalid_arg(
                "a CQ of another device than the PD's",
            )));
        }
        if let Some(srq) = spec.srq {
            if srq.pd() != spec.pd {
                return Err(CmError::Nic(crate::nic::Error::invalid_arg(
                    "an SRQ of another PD",
                )));
            }
            if srq.cq().as_raw() != spec.recv_cq.as_raw() {
                return Err(CmError::Nic(crate::nic::Error::invalid_arg(
                    "with an SRQ, recv_cq must be the SRQ's CQ",
                )));
            }
        }
        // SAFETY: all-zero is a valid ibv_qp_init_attr.
        let mut init: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = spec.send_cq.as_raw() as usize as *mut ffi::ibv_cq;
        init.recv_cq = spec.recv_cq.as_raw() as usize as *mut ffi::ibv_cq;
        if let Some(srq) = spec.srq {
            init.srq = srq.as_raw() as usize as *mut ffi::ibv_srq;
        }
        init.qp_type = ffi::ibv_qp_type::IBV_QPT_RC;
        init.cap = ffi::ibv_qp_cap {
            max_send_wr: spec.caps.max_send_wr,
            max_recv_wr: if spec.srq.is_some() {
                0
            } else {
                spec.caps.max_recv_wr
            },
            max_send_sge: spec.caps.max_send_sge,
            max_recv_sge: if spec.srq.is_some() {
                0
            } else {
                spec.caps.max_recv_sge
            },
            max_inline_data: spec.caps.max_inline_data,
        };
        let pd = spec.pd.as_raw() as usize as *mut ffi::ibv_pd;
        // SAFETY: the id is bound to the PD's context (checked); the CQs and SRQ are live
        // objects of it; `init` outlives the call.
        if unsafe { ffi::rdma_create_qp(self.0, pd, &mut init) } != 0 {
            return Err(CmError::os("rdma_create_qp"));
        }
        // SAFETY: rdma_cm just created it in `pd` on these CQs; from now on only the `Qp`
        // destroys it (`Drop for Id` clears the id's pointer first).
        let qp = unsafe {
            Qp::adopt_owned(
                spec.pd,
                (*self.0).qp.cast(),
                spec.send_cq,
                spec.recv_cq,
                spec.srq,
            )
        };
        qp.map_err(CmError::Nic)
    }
}

impl Drop for Id {
    fn drop(&mut self) {
        // SAFETY: ours, destroyed once; its QP (if any) is destroyed by its `Qp`, not here.
        unsafe {
            (*self.0).qp = std::ptr::null_mut();
            ffi::rdma_destroy_id(self.0);
        }
    }
}
