//! The keys: [`Lkey`] names a region to the local NIC, [`Rkey`] a region or window to a peer's.
//!
//! Invariant: `key.variant() == key.0 & 0xff` and `key.index() == key.0 >> 8` for every key;
//! a new binding or registration of the same index changes the variant.

/// A local key: names a memory region to the local NIC in scatter/gather entries.
///
/// # Examples
/// ```
/// use rdma_pool::nic::Lkey;
/// let k = Lkey(0x1234_56ab);
/// assert_eq!(k.variant(), 0xab);
/// assert_eq!(k.index(), 0x12_3456);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lkey(pub u32);

/// A remote key: names a memory region or memory window to a peer's NIC.
///
/// The low 8 bits are the key *variant*: rebinding a window or re-registering a region
/// changes them, and a key with an earlier variant is rejected.
///
/// # Examples
/// ```
/// use rdma_pool::nic::Rkey;
/// let k = Rkey(0x0000_0107);
/// assert_eq!(k.variant(), 7);
/// assert_eq!(k.next_variant(), Rkey(0x0000_0108));
/// assert_eq!(Rkey(0x01ff).next_variant(), Rkey(0x0100));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Rkey(pub u32);

macro_rules! key_methods {
    ($t:ident) => {
        impl $t {
            /// The low 8 bits: the key variant, changed by every rebind / re-registration.
            pub const fn variant(self) -> u8 {
                (self.0 & 0xff) as u8
            }
            /// The high 24 bits: the index of the region or window in the NIC's key table.
            pub const fn index(self) -> u32 {
                self.0 >> 8
            }
            /// The same index with the next variant (what `ibv_inc_rkey` computes).
            pub const fn next_variant(self) -> Self {
                $t((self.0 & !0xff) | ((self.0.wrapping_add(1)) & 0xff))
            }
        }
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{:#010x}", self.0)
            }
        }
    };
}
key_methods!(Lkey);
key_methods!(Rkey);
