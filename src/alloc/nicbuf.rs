//! Heap buffers as owned work-request buffers ([`NicBuf`], [`NicBufMut`]): `Vec<u8>` and
//! `Box<[u8]>` of the global allocator (registered when it is a
//! [`GlobalPool`](crate::GlobalPool)), and allocator-api2 vectors and boxes of any allocator
//! (registered when it is a [`Pool`](super::Pool) or a `GlobalPool`).
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

// SAFETY: a `Vec`'s bytes are on the heap (moving the `Vec` moves no byte) and only it reaches
// them; `nic_len` is its length, the SGE describes exactly those bytes.
unsafe impl NicBuf for Vec<u8> {
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

// SAFETY: as for `NicBuf`: a `Vec` is the only owner of its bytes.
unsafe impl NicBufMut for Vec<u8> {
    fn nic_wrote(&mut self, n: usize) {
        self.truncate(n);
    }
}

// SAFETY: as for `Vec<u8>`.
unsafe impl NicBuf for Box<[u8]> {
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

// SAFETY: as for `Vec<u8>`.
unsafe impl NicBufMut for Box<[u8]> {}

// SAFETY: as for `Vec<u8>`: an allocator-api2 vector owns its heap bytes whatever allocator
// it holds.
unsafe impl<A: Allocator + Send + 'static> NicBuf for allocator_api2::vec::Vec<u8, A> {
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

// SAFETY: as above.
unsafe impl<A: Allocator + Send + 'static> NicBufMut for allocator_api2::vec::Vec<u8, A> {
    fn nic_wrote(&mut self, n: usize) {
        self.truncate(n);
    }
}

// SAFETY: as above.
unsafe impl<A: Allocator + Send + 'static> NicBuf for allocator_api2::boxed::Box<[u8], A> {
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

// SAFETY: as above.
unsafe impl<A: Allocator + Send + 'static> NicBufMut for allocator_api2::boxed::Box<[u8], A> {}
