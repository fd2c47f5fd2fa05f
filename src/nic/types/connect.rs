//! A QP's sizes and connection: [`QpCaps`], [`QpState`], the [`Endpoint`] exchanged with the
//! peer and the [`ConnectOptions`] of `ibv_modify_qp`.

/// QP state as far as rdma-pool cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Created, not connected (RESET/INIT).
    Init,
    /// Connected, ready to send (RTS).
    Ready,
    /// The error state: every posted request completes with `WrFlushErr`.
    Error,
}

/// QP sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive.
    pub max_recv_sge: u32,
    /// Bytes a send may carry inline ([`SendFlags::INLINE`](crate::nic::SendFlags::INLINE),
    /// [`Qp::post_inline`](crate::nic::Qp::post_inline)). The device may grant more than asked:
    /// [`Qp::caps`](crate::nic::Qp::caps) tells what it granted.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        }
    }
}

/// What a peer needs to connect its QP to ours (exchanged out of band: [`Endpoint::to_bytes`],
/// or serde with the `serde` feature).
///
/// # Examples
/// ```
/// use rdma_pool::nic::Endpoint;
/// let e = Endpoint { gid: [7; 16], qpn: 0x11, lid: 3, psn: 0x42 };
/// let b = e.to_bytes();
/// assert_eq!(Endpoint::from_bytes(&b), Some(e));
/// assert_eq!(Endpoint::from_bytes(&b[..25]), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(try_from = "EndpointFields")
)]
pub struct Endpoint {
    /// Port GID (RoCE: the IPv6 link-local GID at index 0).
    pub gid: [u8; 16],
    /// QP number.
    pub qpn: u32,
    /// Port LID (InfiniBand only; 0 on RoCE).
    pub lid: u16,
    /// Initial packet sequence number.
    pub psn: u32,
}

/// What serde reads of an [`Endpoint`], before the range check.
#[cfg(feature = "serde")]
#[derive(serde::Deserialize)]
struct EndpointFields {
    gid: [u8; 16],
    qpn: u32,
    lid: u16,
    psn: u32,
}

#[cfg(feature = "serde")]
impl TryFrom<EndpointFields> for Endpoint {
    type Error = &'static str;
    fn try_from(f: EndpointFields) -> Result<Endpoint, &'static str> {
        let e = Endpoint {
            gid: f.gid,
            qpn: f.qpn,
            lid: f.lid,
            psn: f.psn,
        };
        e.check().map(|()| e)
    }
}

impl Endpoint {
    /// Bytes of the wire form.
    pub const BYTES: usize = 26;

    /// Refuse a QP number or PSN wider than their 24 bits (hardware would silently take the
    /// low bits: another QP).
    ///
    /// # Errors
    /// What is out of range.
    pub fn check(&self) -> Result<(), &'static str> {
        if self.qpn >> 24 != 0 {
            return Err("QP number wider than 24 bits");
        }
        if self.psn >> 24 != 0 {
            return Err("PSN wider than 24 bits");
        }
        Ok(())
    }

    /// The wire form: the GID, then QP number, LID and PSN little-endian.
    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[..16].copy_from_slice(&self.gid);
        b[16..20].copy_from_slice(&self.qpn.to_le_bytes());
        b[20..22].copy_from_slice(&self.lid.to_le_bytes());
        b[22..].copy_from_slice(&self.psn.to_le_bytes());
        b
    }

    /// Parse the wire form; `None` when `b` is not exactly [`Endpoint::BYTES`] long or a
    /// number is out of range (QP number and PSN are 24 bits).
    pub fn from_bytes(b: &[u8]) -> Option<Endpoint> {
        let b: &[u8; Self::BYTES] = b.try_into().ok()?;
        let e = Endpoint {
            gid: b[..16].try_into().ok()?,
            qpn: u32::from_le_bytes(b[16..20].try_into().ok()?),
            lid: u16::from_le_bytes(b[20..22].try_into().ok()?),
            psn: u32::from_le_bytes(b[22..26].try_into().ok()?),
        };
        e.check().ok().map(|()| e)
    }
}

/// How [`Qp::connect_with`](crate::nic::Qp::connect_with) connects (`ibv_modify_qp` to RTR
/// and RTS). The defaults are what [`Qp::connect`](crate::nic::Qp::connect) uses.
///
/// # Examples
/// ```
/// use rdma_pool::nic::ConnectOptions;
/// let o = ConnectOptions { path_mtu: Some(1024), retry_cnt: 3, ..ConnectOptions::default() };
/// assert!(o.check().is_ok());
/// assert!(ConnectOptions { rnr_retry: 8, ..o }.check().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectOptions {
    /// The local GID index the connection's packets carry (RoCE: 0 is the IPv6 link-local
    /// GID; RoCE v2 over IPv4 uses the index of the address's GID).
    pub gid_index: u8,
    /// Path MTU in bytes (256, 512, 1024, 2048, 4096); `None`: the port's active MTU.
    pub path_mtu: Option<u32>,
    /// Local ACK timeout, `4.096 µs × 2^timeout` (0..=31; 0 waits forever).
    pub timeout: u8,
    /// Transport retries (0..=7).
    pub retry_cnt: u8,
    /// Receiver-not-ready retries (0..=7; 7 retries forever).
    pub rnr_retry: u8,
    /// The RNR NAK timer this side asks of senders (0..=31, the IB encoding).
    pub min_rnr_timer: u8,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            gid_index: 0,
            path_mtu: None,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
        }
    }
}

impl ConnectOptions {
    /// Refuse values outside their ranges.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::nic::Error::InvalidArgument) naming the field.
    pub fn check(&self) -> Result<(), crate::nic::Error> {
        let bad = |detail| {
            Err(crate::nic::Error::invalid(
                crate::nic::Verb::ModifyQp,
                detail,
            ))
        };
        if let Some(m) = self.path_mtu
            && ![256, 512, 1024, 2048, 4096].contains(&m)
        {
            return bad("path_mtu must be 256, 512, 1024, 2048 or 4096");
        }
        if self.timeout > 31 {
            return bad("timeout must be 0..=31");
        }
        if self.retry_cnt > 7 || self.rnr_retry > 7 {
            return bad("retry_cnt and rnr_retry must be 0..=7");
        }
        if self.min_rnr_timer > 31 {
            return bad("min_rnr_timer must be 0..=31");
        }
        Ok(())
    }
}
