//! rdma_cm event channels: a non-blocking descriptor, waited on with `poll(2)` (blocking
//! calls) or tokio's `AsyncFd` (feature `tokio`), each event copied out and acknowledged at
//! once.
//!
//! Contract: an [`Event`] owns copies of what rdma_cm lent (the private data), so nothing
//! borrowed from librdmacm outlives `rdma_ack_cm_event`; the channel is destroyed after every
//! id that reports to it (its owners drop it last).

use super::CmError;
use rdma_sys as ffi;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// One rdma_cm event, copied.
#[derive(Debug)]
pub(super) struct Event {
    pub(super) kind: ffi::rdma_cm_event_type::Type,
    pub(super) status: i32,
    /// The id it concerns (for a connect request: the new id).
    pub(super) id: *mut ffi::rdma_cm_id,
    pub(super) private_data: Vec<u8>,
}

/// The name of an event type (`rdma_event_str`).
pub(super) fn event_name(kind: ffi::rdma_cm_event_type::Type) -> String {
    // SAFETY: rdma_event_str returns a static C string for any value.
    let p = unsafe { ffi::rdma_event_str(kind) };
    if p.is_null() {
        return format!("event {kind}");
    }
    // SAFETY: a NUL-terminated static string.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

/// An event channel (`struct rdma_event_channel`), its descriptor non-blocking.
pub(super) struct Channel {
    pub(super) raw: *mut ffi::rdma_event_channel,
}

// SAFETY: librdmacm's channel calls are thread-safe; the pointer is only passed to them.
unsafe impl Send for Channel {}
// SAFETY: as above.
unsafe impl Sync for Channel {}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: ours, destroyed once, after every id that reports to it.
        unsafe { ffi::rdma_destroy_event_channel(self.raw) };
    }
}

impl Channel {
    pub(super) fn new() -> Result<Channel, CmError> {
        // SAFETY: no arguments.
        let raw = unsafe { ffi::rdma_create_event_channel() };
        if raw.is_null() {
            return Err(CmError::os("rdma_create_event_channel"));
        }
        let ch = Channel { raw };
        crate::nic::set_nonblocking(ch.fd()).map_err(|source| CmError::Os {
            call: "fcntl(O_NONBLOCK) on the rdma_cm channel",
            source,
        })?;
        Ok(ch)
    }

    pub(super) fn fd(&self) -> RawFd {
        // SAFETY: the channel is live.
        unsafe { (*self.raw).fd }
    }

    /// The next event, if one is pending (never blocks).
    pub(super) fn try_event(&self) -> Result<Option<Event>, CmError> {
        let mut ev: *mut ffi::rdma_cm_event = std::ptr::null_mut();
        // SAFETY: the channel is live and non-blocking; `ev` is ours.
        if unsafe { ffi::rdma_get_cm_event(self.raw, &mut ev) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(CmError::Os {
                call: "rdma_get_cm_event",
                source: e,
            });
        }
        // SAFETY: `ev` is the event librdmacm handed out; read, copied, then acknowledged.
        let event = unsafe {
            let e = &*ev;
            let conn = e.param.conn;
            let data = if conn.private_data.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(
                    conn.private_data.cast::<u8>(),
                    conn.private_data_len as usize,
                )
                .to_vec()
            };
            let event = Event {
                kind: e.event,
                status: e.status,
                id: e.id,
                private_data: data,
            };
            ffi::rdma_ack_cm_event(ev);
            event
        };
        Ok(Some(event))
    }

    /// Wait for the next event until `deadline`.
    pub(super) fn wait(&self, deadline: Instant) -> Result<Event, CmError> {
        loop {
            if let Some(e) = self.try_event()? {
                return Ok(e);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CmError::Timeout);
            }
            let mut fds = libc::pollfd {
                fd: self.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: one live pollfd.
            let n = unsafe { libc::poll(&mut fds, 1, ms) };
            if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return Err(CmError::os("poll on the rdma_cm channel"));
            }
        }
    }

    /// Wait for the next event (feature `tokio`), sleeping on the descriptor.
    #[cfg(feature = "tokio")]
    pub(super) async fn wait_async(&self, fd: &AsyncChannel) -> Result<Event, CmError> {
        loop {
            if let Some(e) = self.try_event()? {
                return Ok(e);
            }
            let mut guard = fd.0.readable().await.map_err(|source| CmError::Os {
                call: "AsyncFd::readable on the rdma_cm channel",
                source,
            })?;
            match self.try_event()? {
                Some(e) => return Ok(e),
                None => guard.clear_ready(),
            }
        }
    }
}

/// A channel's descriptor registered with tokio (feature `tokio`): dropped before its channel.
#[cfg(feature = "tokio")]
pub(super) struct AsyncChannel(tokio::io::unix::AsyncFd<RawFd>);

#[cfg(feature = "tokio")]
impl AsyncChannel {
    pub(super) fn new(ch: &Channel) -> Result<AsyncChannel, CmError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(CmError::Unsupported(
                "the async rdma_cm calls need a tokio runtime with its I/O driver",
            ));
        }
        let fd = ch.fd();
        let registered = std::panic::catch_unwind(|| {
            // SAFETY: the descriptor stays open while the channel lives, and every owner drops
            // this registration before its channel.
            unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
            }
        })
        .map_err(|_| {
            CmError::Unsupported("the async rdma_cm calls need tokio's I/O driver enabled")
        })?;
        registered.map(AsyncChannel).map_err(|e| CmError::Os {
            call: "AsyncFd::register on the rdma_cm channel",
            source: e.into(),
        })
    }
}

/// A deadline `d` from now, saturating.
pub(super) fn deadline(d: Duration) -> Instant {
    Instant::now()
        .checked_add(d)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(86400 * 365))
}
