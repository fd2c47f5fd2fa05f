//! The compact form of a grant a peer needs: where, how much, and the key.

use crate::nic::Rkey;

/// What a peer needs to use a grant: the address, the length and the rkey, as 20
/// little-endian bytes on the wire.
///
/// # Examples
/// ```
/// use rdma_pool::grant::GrantWire;
/// use rdma_pool::nic::Rkey;
/// let w = GrantWire { addr: 0x7f00_0000_1000, len: 4096, rkey: Rkey(0x1234_5601) };
/// let bytes = w.to_bytes();
/// assert_eq!(GrantWire::from_bytes(&bytes), Some(w));
/// assert_eq!(GrantWire::from_bytes(&bytes[..19]), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct GrantWire {
    /// First byte the peer may reach (the remote address of its work requests).
    pub addr: u64,
    /// Bytes it may reach from there.
    pub len: u64,
    /// The key.
    pub rkey: Rkey,
}

impl GrantWire {
    /// Bytes of the wire form.
    pub const BYTES: usize = 20;

    /// The wire form.
    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..].copy_from_slice(&self.rkey.0.to_le_bytes());
        b
    }

    /// Parse the wire form; `None` when `b` is not exactly [`GrantWire::BYTES`] long.
    pub fn from_bytes(b: &[u8]) -> Option<GrantWire> {
        let b: &[u8; Self::BYTES] = b.try_into().ok()?;
        let (addr, rest) = b.split_at(8);
        let (len, rkey) = rest.split_at(8);
        Some(GrantWire {
            addr: u64::from_le_bytes(addr.try_into().ok()?),
            len: u64::from_le_bytes(len.try_into().ok()?),
            rkey: Rkey(u32::from_le_bytes(rkey.try_into().ok()?)),
        })
    }
}
