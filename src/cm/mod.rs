//! Connection set-up with rdma_cm (feature `verbs`): IP addresses and ports instead of GIDs
//! and QP numbers exchanged by hand, from blocking or async (feature `tokio`) code.
//!
//! Contract:
//! - rdma_cm opens each device itself and binds its ids to those contexts, and
//!   `rdma_create_qp` refuses a PD of another context; so the pool whose memory the
//!   connections use must be built on rdma_cm's context: [`open`] / [`open_default`] give a
//!   [`Nic`] on it (for [`Pool::new`](crate::Pool::new), or as
//!   [`GlobalConfig::open`](crate::global::GlobalConfig::open) of a
//!   [`GlobalPool`](crate::GlobalPool)). A connection that arrives on, or resolves to, another
//!   device is refused with [`CmError::WrongDevice`] (and rejected, on the passive side).
//! - Each [`Connection`] owns its id, its event channel and its QP (created by
//!   `rdma_create_qp` in the caller's PD on the caller's CQs, then an ordinary
//!   [`Qp`](crate::nic::Qp): grants, owned posts and `Qp::from_raw` rules apply); dropping it
//!   disconnects and destroys them (the QP when its last clone is dropped).
//! - Private data rides on the connect (at most [`MAX_CONNECT_DATA`] bytes) and on the accept
//!   (at most [`MAX_ACCEPT_DATA`]); longer is refused before anything is sent. The CM pads it
//!   to a fixed size on the wire (rxe and hardware alike), so the crate frames it with a
//!   length byte: [`Connection::peer_data`] is exactly what the peer sent, and
//!   [`Connection::peer_data_raw`] the padded bytes as they arrived (for a peer that does not
//!   frame).
//! - Every wait is bounded by [`CmOptions::timeout`] in blocking code; async code is
//!   cancel-safe in the sense that a dropped future drops what it created (the peer sees the
//!   connection fail), never leaks it.
//!
//! Invariant: a `Connection` exists only in the ESTABLISHED state; its id's `qp` is the
//! QP it holds.

//! # Examples
//! A tokio server (feature `tokio`) whose buffers all come from the `GlobalPool`: each client
//! gets one page of the server's heap granted to it alone, and upper-cased replies to its
//! requests (`examples/cm_server.rs` is the same, with its client and a three-process demo).
//! ```no_run
//! # #[cfg(feature = "tokio")] mod demo {
//! use rdma_pool::cm::{self, CmListener, CmOptions, Connection, QpSpec};
//! use rdma_pool::{GlobalPool, global::GlobalConfig, nic::{AsyncCq, WcStatus}};
//! type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;
//!
//! #[global_allocator] // every Vec below is NIC-registered, on rdma_cm's device context
//! static A: GlobalPool =
//!     GlobalPool::with_config(GlobalConfig { open: Some(cm::open_default), ..GlobalConfig::DEFAULT });
//!
//! #[tokio::main]
//! async fn main() -> Result<()> {
//!     let listener = CmListener::bind("10.0.0.1:7471".parse()?)?;
//!     loop {
//!         let cq = AsyncCq::new(A.nic()?, 64)?;
//!         let spec = QpSpec::new(A.pd()?, cq.cq());
//!         let conn = listener.accept_async(&spec, b"", &CmOptions::default()).await?;
//!         tokio::spawn(serve(conn, cq));
//!     }
//! }
//!
//! async fn serve(mut conn: Connection, cq: AsyncCq) -> Result<()> {
//!     let page = vec![b'#'; 4096]; // this client's page, in the server's heap
//!     let mut grant = A.grant(&page, conn.qp())?; // a key only this client's QP can use
//!     grant.wait_async(&cq, |_| {}).await?;
//!     let wire = grant.wire().to_bytes().to_vec();
//!     conn.qp().post_send_owned(0, wire)?.wait_async(&cq).await?;
//!     loop {
//!         let mut req = conn.qp().post_recv_owned(1, vec![0u8; 256])?;
//!         tokio::select! { r = req.ready(&cq) => r?, r = conn.disconnected() => break r? }
//!         let req = req.take().map_err(|_| "in flight")?;
//!         if req.completion.status != WcStatus::Success {
//!             break; // flushed: the client is gone
//!         }
//!         let reply = req.buf.to_ascii_uppercase();
//!         conn.qp().post_send_owned(2, reply)?.wait_async(&cq).await?;
//!     }
//!     grant.revoke_async(&cq, |_| {}).await?; // the key dies before the page is freed
//!     Ok(())
//! }
//! # }
//! # fn main() {}
//! ```

mod conn;
mod event;

pub use conn::{CmListener, Connection, Resolved, connect, resolve};
#[cfg(feature = "tokio")]
pub use conn::{connect_async, resolve_async};

use crate::nic::{self, Cq, Nic, Pd, QpCaps, Srq};
use rdma_sys as ffi;
use std::net::SocketAddr;
use std::time::Duration;

/// Private data bytes a connect request carries: the CM REQ's 56, less the length byte.
pub const MAX_CONNECT_DATA: usize = 55;
/// Private data bytes an accept carries: the CM REP's 196, less the length byte.
pub const MAX_ACCEPT_DATA: usize = 195;

/// `data` framed: its length, then its bytes.
fn frame_data(data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(data.len() + 1);
    v.push(data.len() as u8);
    v.extend_from_slice(data);
    v
}

/// The payload of framed (and padded) private data; `None` if it is not framed.
fn unframe_data(raw: &[u8]) -> Option<&[u8]> {
    let (&n, rest) = raw.split_first()?;
    rest.get(..n as usize)
}

/// What can go wrong setting up a connection.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CmError {
    /// A verbs call failed (the QP, the NIC).
    #[error(transparent)]
    Nic(#[from] nic::Error),
    /// An rdma_cm call failed.
    #[error("{call}: {source}")]
    Os {
        /// The call.
        call: &'static str,
        /// The errno.
        #[source]
        source: std::io::Error,
    },
    /// The peer rejected the connection (with its private data, if any).
    #[error("the peer rejected the connection (status {status})")]
    Rejected {
        /// rdma_cm's status (the CM's reject reason; 28: consumer-defined).
        status: i32,
        /// What the peer said.
        private_data: Vec<u8>,
    },
    /// An event other than the one the step waits for.
    #[error("rdma_cm reported {got} (status {status}) while waiting for {want}")]
    Unexpected {
        /// What the step waited for.
        want: &'static str,
        /// What came.
        got: String,
        /// Its status (an errno for the error events).
        status: i32,
    },
    /// The connection uses a device context other than the PD's.
    #[error(
        "the connection runs on another device context than the PD's: build the pool on \
         rdma_cm's context (rdma_pool::cm::open / open_default)"
    )]
    WrongDevice,
    /// Private data longer than the step carries.
    #[error("private data of {len} bytes: at most {max} fit")]
    PrivateDataTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// No event in time.
    #[error("rdma_cm timed out")]
    Timeout,
    /// Not possible here (a soft NIC, no runtime for the async calls).
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
}

impl CmError {
    pub(crate) fn os(call: &'static str) -> CmError {
        CmError::Os {
            call,
            source: std::io::Error::last_os_error(),
        }
    }
}

/// How long the steps may take and what the connection asks of the transport.
///
/// # Examples
/// ```
/// use rdma_pool::cm::CmOptions;
/// use std::time::Duration;
/// let o = CmOptions { timeout: Duration::from_secs(2), ..CmOptions::default() };
/// assert_eq!(o.rnr_retry_count, 7);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmOptions {
    /// Address and route resolution, each (`rdma_resolve_addr`/`route`).
    pub resolve_timeout: Duration,
    /// The whole set-up (every wait of a blocking call).
    pub timeout: Duration,
    /// Transport retries (0..=7).
    pub retry_count: u8,
    /// Receiver-not-ready retries (0..=7; 7 retries forever).
    pub rnr_retry_count: u8,
    /// Outstanding RDMA READs and atomics the peer may have against us.
    pub responder_resources: u8,
    /// Outstanding RDMA READs and atomics we may have against the peer.
    pub initiator_depth: u8,
}

impl Default for CmOptions {
    fn default() -> Self {
        CmOptions {
            resolve_timeout: Duration::from_secs(2),
            timeout: Duration::from_secs(10),
            retry_count: 7,
            rnr_retry_count: 7,
            responder_resources: 1,
            initiator_depth: 1,
        }
    }
}

/// The QP a connection gets: in `pd`, completing on `send_cq` and `recv_cq` (receiving from
/// `srq` when given), with `caps`.
#[derive(Debug, Clone, Copy)]
pub struct QpSpec<'a> {
    /// The PD: of a NIC on rdma_cm's context ([`open`]).
    pub pd: &'a Pd,
    /// Where sends complete.
    pub send_cq: &'a Cq,
    /// Where receives complete (an SRQ's own CQ when `srq` is given).
    pub recv_cq: &'a Cq,
    /// A shared receive queue, if the QP receives from one.
    pub srq: Option<&'a Srq>,
    /// Queue sizes.
    pub caps: QpCaps,
}

impl<'a> QpSpec<'a> {
    /// A QP in `pd` completing everything on `cq`, default sizes.
    pub fn new(pd: &'a Pd, cq: &'a Cq) -> QpSpec<'a> {
        QpSpec {
            pd,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            caps: QpCaps::default(),
        }
    }
}

/// The devices rdma_cm opened, each as a [`Nic`] on rdma_cm's own context.
///
/// # Errors
/// [`CmError::Os`] when librdmacm finds no device (or cannot list them).
pub fn devices() -> Result<Vec<Nic>, CmError> {
    let mut n = 0;
    // SAFETY: `n` is ours; the list is freed below.
    let list = unsafe { ffi::rdma_get_devices(&mut n) };
    if list.is_null() {
        return Err(CmError::os("rdma_get_devices"));
    }
    let mut out = Vec::new();
    let mut first_error = None;
    for i in 0..n.max(0) as usize {
        // SAFETY: `list` holds `n` contexts rdma_cm keeps open for the process's life.
        let ctx = unsafe { *list.add(i) };
        // SAFETY: as above: the context outlives every Nic made from it.
        match unsafe { Nic::from_raw_context(ctx.cast()) } {
            Ok(nic) => out.push(nic),
            Err(e) => first_error = first_error.or(Some(e)),
        }
    }
    // SAFETY: the list from rdma_get_devices, freed once (the contexts stay open).
    unsafe { ffi::rdma_free_devices(list) };
    match (out.is_empty(), first_error) {
        (true, Some(e)) => Err(CmError::Nic(e)),
        _ => Ok(out),
    }
}

/// The device `name` on rdma_cm's context.
///
/// # Errors
/// [`nic::Error::DeviceNotFound`] naming it; the device's failure.
pub fn open(name: &str) -> nic::Result<Nic> {
    let all = devices().map_err(|e| match e {
        CmError::Nic(e) => e,
        _ => nic::Error::DeviceNotFound(name.to_owned()),
    })?;
    all.into_iter()
        .find(|n| n.caps().name == name)
        .ok_or_else(|| nic::Error::DeviceNotFound(name.to_owned()))
}

/// The device `RDMA_POOL_NIC` names (else the first) on rdma_cm's context: a
/// [`GlobalConfig::open`](crate::global::GlobalConfig::open) for a `GlobalPool` whose memory
/// rdma_cm connections use.
///
/// # Errors
/// [`nic::Error::Env`] when the variable names a device rdma_cm does not have;
/// [`nic::Error::NoDevice`] without any.
pub fn open_default() -> nic::Result<Nic> {
    match std::env::var("RDMA_POOL_NIC") {
        Ok(name) if !name.is_empty() && name != "verbs" && name != "soft" => {
            open(&name).map_err(|e| nic::Error::Env {
                var: "RDMA_POOL_NIC",
                value: name.clone(),
                source: Box::new(e),
            })
        }
        _ => devices()
            .ok()
            .and_then(|d| d.into_iter().next())
            .ok_or(nic::Error::NoDevice),
    }
}

/// `addr` as a `sockaddr_storage` rdma_cm takes.
fn to_sockaddr(addr: &SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: a sockaddr_in fits in a sockaddr_storage.
            unsafe { std::ptr::write((&raw mut ss).cast(), sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: a sockaddr_in6 fits in a sockaddr_storage.
            unsafe { std::ptr::write((&raw mut ss).cast(), sin6) };
        }
    }
    ss
}

/// The address at `sa`, if it is IPv4 or IPv6.
///
/// # Safety
/// `sa` points at a readable socket address of its family's size.
unsafe fn from_sockaddr(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    // SAFETY: the caller's.
    match i32::from(unsafe { (*sa).sa_family }) {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let sin = unsafe { &*sa.cast::<libc::sockaddr_in>() };
            let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::new(ip.into(), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a sockaddr_in6.
            let sin6 = unsafe { &*sa.cast::<libc::sockaddr_in6>() };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(std::net::SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_data_is_framed_and_unframed_through_padding() {
        let mut wire = frame_data(b"hello");
        wire.resize(56, 0);
        assert_eq!(unframe_data(&wire), Some(&b"hello"[..]));
        assert_eq!(unframe_data(&[9, 1, 2]), None);
        assert_eq!(unframe_data(&[]), None);
        assert_eq!(unframe_data(&frame_data(b"")), Some(&b""[..]));
    }

    #[test]
    fn socket_addresses_round_trip() {
        for a in ["10.77.0.2:7471", "[fe80::1%3]:9", "127.0.0.1:0"] {
            let a: SocketAddr = a.parse().unwrap();
            let ss = to_sockaddr(&a);
            // SAFETY: `ss` holds the address just written.
            let back = unsafe { from_sockaddr((&raw const ss).cast()) };
            assert_eq!(back, Some(a));
        }
    }
}
