//! What each step of a set-up sends and expects: the connection parameters built from
//! [`CmOptions`] and the private data, the private data's length check, the event a step waits
//! for, and timeouts in rdma_cm's milliseconds.
//!
//! Contract:
//! - private data longer than the step allows is refused before anything is sent;
//! - retry counts are clamped to the 3 bits the CM carries, timeouts to `[1, i32::MAX]` ms;
//! - an event other than the one waited for (or with a non-zero status) is an error: a reject
//!   as [`CmError::Rejected`] with the peer's data, anything else as [`CmError::Unexpected`].

use crate::cm::CmError;
use crate::cm::CmOptions;
use crate::cm::event::{Event, event_name};
use ffi::rdma_cm_event_type as ev;
use rdma_sys as ffi;

/// `data` as connection parameters (its pointer valid while `data` lives).
pub(super) fn conn_param(data: &[u8], opts: &CmOptions) -> ffi::rdma_conn_param {
    ffi::rdma_conn_param {
        private_data: if data.is_empty() {
            std::ptr::null()
        } else {
            data.as_ptr().cast()
        },
        private_data_len: data.len() as u8,
        responder_resources: opts.responder_resources,
        initiator_depth: opts.initiator_depth,
        flow_control: 1,
        retry_count: opts.retry_count.min(7),
        rnr_retry_count: opts.rnr_retry_count.min(7),
        srq: 0,
        qp_num: 0,
    }
}

pub(super) fn check_len(data: &[u8], max: usize) -> Result<(), CmError> {
    if data.len() > max {
        return Err(CmError::PrivateDataTooLong {
            len: data.len(),
            max,
        });
    }
    Ok(())
}

/// `e` if it is `want`, else the error it means.
pub(super) fn expect(
    e: Event,
    want: ffi::rdma_cm_event_type::Type,
    name: &'static str,
) -> Result<Event, CmError> {
    if e.kind == want && e.status == 0 {
        return Ok(e);
    }
    if e.kind == ev::RDMA_CM_EVENT_REJECTED {
        return Err(CmError::Rejected {
            status: e.status,
            private_data: e.private_data,
        });
    }
    Err(CmError::Unexpected {
        want: name,
        got: event_name(e.kind),
        status: e.status,
    })
}

pub(super) fn ms(d: std::time::Duration) -> i32 {
    d.as_millis().clamp(1, i32::MAX as u128) as i32
}
