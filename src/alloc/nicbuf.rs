//! Heap buffers as owned work-request buffers ([`NicBuf`], [`NicBufMut`]): `Vec<u8>` and
//! `Box<[u8]>` of the global allocator (registered when it is a
//! [`GlobalPool`](crate::GlobalPool)), and allocator-api2 vectors and boxes of any allocator
//! (registered when it is a [`Pool`](crate::Pool) or a `GlobalPool`).
//!
//! Contract: the bytes of these types live on the heap, so moving the value moves no byte, and
//! only the value reaches them; the SGE is found by address among the live pools on the QP's
//! device ([`tls::sge_of_any_on`]), so memory of no pool, or straddling two registrations, is
//! refused at post time with the buffer given back.

use super::tls;
use crate::nic::{Error, Nic, NicBuf, NicBufMut, Result, Sge};
use allocator_api2::alloc::Allocator;

/// The SGE of `len` bytes at `ptr` on `nic`, or why not.
fn sge(ptr: *const u8, len: usize, nic: &Nic) -> Result<Option<Sge>> {
    if len == 0 {
        return Ok(None);
    }
    // SAFETY: the callers pass the live bytes of a buffer they own.
    let buf = unsafe { std::slice::from_raw_parts(ptr, len) };
    tls::sge_of_any_on(buf, nic)
        .map(Some)
        .ok_or(Error::InvalidArgument {
            verb: None,
            detail: "buffer is not inside one registration of a pool on this device",
        })
}

/// `NicBuf` and `NicBufMut` for heap buffers: their bytes are `[..len]` of a heap allocation
/// only the value reaches; `$wrote` tells a growable one what arrived.
macro_rules! heap_buf {
    ($([$($g:tt)*] $t:ty => $wrote:expr),* $(,)?) => {$(
        // SAFETY: the bytes are on the heap (moving the value moves no byte) and only the
        // value reaches them; `nic_len` is its length and the SGE covers exactly those bytes.
        unsafe impl<$($g)*> NicBuf for $t {
            fn nic_ptr(&self) -> *const u8 {
                self.as_ptr()
            }
            fn nic_len(&self) -> usize {
                self.len()
            }
            fn sge(&self, nic: &Nic) -> Result<Option<Sge>> {
                sge(self.as_ptr(), self.len(), nic)
            }
        }

        // SAFETY: as above: the value is the only owner of its bytes.
        unsafe impl<$($g)*> NicBufMut for $t {
            fn nic_wrote(&mut self, n: usize) {
                let wrote: fn(&mut Self, usize) = $wrote;
                wrote(self, n)
            }
        }
    )*};
}

heap_buf!(
    [] Vec<u8> => |v, n| v.truncate(n),
    [] Box<[u8]> => |_, _| {},
    [A: Allocator + Send + 'static] allocator_api2::vec::Vec<u8, A> => |v, n| v.truncate(n),
    [A: Allocator + Send + 'static] allocator_api2::boxed::Box<[u8], A> => |_, _| {},
);
