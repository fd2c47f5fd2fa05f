//! Active and passive connection set-up: [`connect`]/[`connect_async`] and [`CmListener`],
//! each step waiting for its rdma_cm event (see the module contract in `cm/mod.rs`).
//!
//! Files: the established [`Connection`] and its disconnect (`mod.rs`); the rdma_cm id and its
//! QP (`id.rs`); connection parameters, private-data checks and expected events (`param.rs`);
//! resolving and connecting (`active.rs`); listening and accepting (`passive.rs`).

mod active;
mod id;
mod param;
mod passive;

pub use active::{Resolved, connect, resolve};
#[cfg(feature = "tokio")]
pub use active::{connect_async, resolve_async};
pub use passive::CmListener;

#[cfg(feature = "tokio")]
use crate::cm::event::AsyncChannel;
use crate::cm::event::{Channel, Event, deadline};
use crate::cm::{CmError, from_sockaddr, unframe_data};
use crate::nic::Qp;
use ffi::rdma_cm_event_type as ev;
use id::Id;
use rdma_sys as ffi;
use std::net::SocketAddr;

/// An established RC connection: its QP (an ordinary [`Qp`] for grants, owned and raw
/// posts) and what the peer sent with it. Dropping it disconnects.
///
/// A peer's disconnect reaches this side as an rdma_cm event: when
/// [`Connection::wait_disconnected`] (or `Connection::disconnected`, feature `tokio`) reads it,
/// the crate answers it and the QP moves to the error state, flushing every receive and send
/// still posted. Await it alongside the receives: until it is read, a receive posted for a peer
/// that left waits.
pub struct Connection {
    id: Id,
    qp: Qp,
    peer_data: Vec<u8>,
    disconnected: bool,
    channel: Channel,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("qp", &self.qp)
            .field("local", &self.local_addr())
            .field("peer", &self.peer_addr())
            .finish()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if !self.disconnected {
            // SAFETY: the id is live.
            unsafe { ffi::rdma_disconnect(self.id.0) };
        }
    }
}

impl Connection {
    /// An established connection of `id` (reporting to `channel`) with its QP.
    fn new(id: Id, qp: Qp, peer_data: Vec<u8>, channel: Channel) -> Connection {
        Connection {
            id,
            qp,
            peer_data,
            disconnected: false,
            channel,
        }
    }

    /// The connection's QP.
    pub fn qp(&self) -> &Qp {
        &self.qp
    }

    /// The private data the peer sent with its connect (passive side) or accept (active),
    /// exactly; empty when the peer did not frame it (see [`Connection::peer_data_raw`]).
    pub fn peer_data(&self) -> &[u8] {
        unframe_data(&self.peer_data).unwrap_or(&[])
    }

    /// The private data as it arrived: padded by the CM to its fixed size, framed with a
    /// length byte by an rdma-pool peer.
    pub fn peer_data_raw(&self) -> &[u8] {
        &self.peer_data
    }

    /// This side's address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the id is live; its route holds a socket address of its family.
        unsafe { from_sockaddr(ffi::rdma_get_local_addr(&*self.id.0)) }
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as above.
        unsafe { from_sockaddr(ffi::rdma_get_peer_addr(&*self.id.0)) }
    }

    /// Wait until the peer disconnects (or `timeout` passes).
    ///
    /// # Errors
    /// [`CmError::Timeout`]; a channel failure.
    pub fn wait_disconnected(&mut self, timeout: std::time::Duration) -> Result<(), CmError> {
        let end = deadline(timeout);
        while !self.disconnected {
            let e = self.channel.wait(end)?;
            self.on_event(&e);
        }
        Ok(())
    }

    /// The peer left: answer its disconnect, which also moves the QP to the error state, so
    /// every receive and send still posted comes back flushed.
    fn on_event(&mut self, e: &Event) {
        if e.kind == ev::RDMA_CM_EVENT_DISCONNECTED && !self.disconnected {
            self.disconnected = true;
            // SAFETY: the id is live.
            unsafe { ffi::rdma_disconnect(self.id.0) };
        }
    }

    /// Wait (feature `tokio`) until the peer disconnects.
    ///
    /// # Errors
    /// A channel failure.
    #[cfg(feature = "tokio")]
    pub async fn disconnected(&mut self) -> Result<(), CmError> {
        if self.disconnected {
            return Ok(());
        }
        // Registered for this call only: the next one may run on another runtime.
        let afd = AsyncChannel::new(&self.channel)?;
        while !self.disconnected {
            let e = self.channel.wait_async(&afd).await?;
            self.on_event(&e);
        }
        Ok(())
    }

    /// Disconnect now (`rdma_disconnect`; the QP moves to the error state and flushes).
    ///
    /// # Errors
    /// The `rdma_disconnect` failure.
    pub fn disconnect(mut self) -> Result<(), CmError> {
        self.disconnected = true;
        // SAFETY: the id is live.
        if unsafe { ffi::rdma_disconnect(self.id.0) } != 0 {
            return Err(CmError::os("rdma_disconnect"));
        }
        Ok(())
    }
}
