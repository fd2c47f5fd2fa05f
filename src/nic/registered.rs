//! A buffer and its registration owned together ([`Registered`]): memory that safe code can
//! register without `unsafe` (the region cannot outlive the bytes, the bytes cannot be freed
//! under the region) and post as an owned buffer, a range of it at a time.
//!
//! Contract: the region covers the whole buffer with local rights and at most `REMOTE_READ`
//! (a peer that could write it would race with the program's `&mut` access); the posted range
//! is [`Registered::range`]; dropping deregisters first, then unmaps.

use super::{Access, Buffer, Error, Mr, Nic, NicBuf, NicBufMut, Pd, Result, Sge, Verb};
use std::ops::Range;

/// A [`Buffer`] registered in a PD, owned together.
///
/// # Examples
/// ```
/// use rdma_pool::nic::{Access, Buffer, Nic, QpCaps, WcStatus};
/// use std::time::Duration;
/// let nic = Nic::soft();
/// let pd = nic.alloc_pd()?;
/// let cq = nic.create_cq(8)?;
/// let (a, b) = (pd.create_qp(&cq, &cq, QpCaps::default())?, pd.create_qp(&cq, &cq, QpCaps::default())?);
/// a.connect(&b.endpoint()?)?;
/// b.connect(&a.endpoint()?)?;
/// let mut msg = pd.register(Buffer::new(4096)?, Access::LOCAL_WRITE)?;
/// msg.as_mut_slice()[..5].copy_from_slice(b"hello");
/// msg.set_range(0..5)?;
/// let rx = b.post_recv_owned(1, pd.register(Buffer::new(4096)?, Access::LOCAL_WRITE)?)?;
/// a.post_send_owned(2, msg)?.wait(Duration::from_secs(5))?;
/// let got = rx.wait(Duration::from_secs(5))?;
/// assert_eq!(got.completion.byte_len, 5);
/// assert_eq!(&got.buf.as_slice()[..5], b"hello");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Registered {
    // Dropped first: the region goes before its bytes.
    mr: Mr,
    buf: Buffer,
    range: Range<usize>,
}

impl std::fmt::Debug for Registered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registered")
            .field("mr", &self.mr)
            .field("range", &self.range)
            .finish()
    }
}

impl Pd {
    /// Register all of `buf` with `access` and keep both: no `unsafe`, as the region cannot
    /// outlive the bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `REMOTE_WRITE`, `REMOTE_ATOMIC` or `MW_BIND` (a peer
    /// writing the buffer would race with the program's own access: use
    /// [`Pd::reg_mr`] for those); the registration's failure.
    pub fn register(&self, mut buf: Buffer, access: Access) -> Result<Registered> {
        if access.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC | Access::MW_BIND) {
            return Err(Error::invalid(
                Verb::RegMr,
                "an owned registration takes local rights and REMOTE_READ only",
            ));
        }
        let len = buf.len();
        // SAFETY: the region lives in the `Registered` with the buffer and is dropped first;
        // with no remote write right, only the program's own posts write the bytes, and those
        // take the `Registered` by value.
        let mr = unsafe { self.reg_mr(buf.as_mut_ptr(), len, access) }?;
        Ok(Registered {
            mr,
            buf,
            range: 0..len,
        })
    }
}

impl Registered {
    /// The whole buffer.
    pub fn as_slice(&self) -> &[u8] {
        self.buf.as_slice()
    }
    /// The whole buffer, to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.buf.as_mut_slice()
    }
    /// The region (its keys, address and length).
    pub fn mr(&self) -> &Mr {
        &self.mr
    }
    /// The bytes an owned post uses: all of the buffer unless [`Registered::set_range`] said.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }
    /// Post only `range` of the buffer from now on.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a range outside the buffer.
    pub fn set_range(&mut self, range: Range<usize>) -> Result<()> {
        if range.start > range.end || range.end > self.buf.len() {
            return Err(Error::invalid_arg("range outside the registered buffer"));
        }
        self.range = range;
        Ok(())
    }
    /// Deregister and give the buffer back.
    ///
    /// # Errors
    /// The deregistration's failure, with the registration back unchanged.
    pub fn into_buffer(self) -> std::result::Result<Buffer, (Registered, Error)> {
        let Registered { mr, buf, range } = self;
        match mr.dereg() {
            Ok(()) => Ok(buf),
            Err(e) => {
                let back = Registered {
                    mr: e.mr,
                    buf,
                    range,
                };
                Err((back, e.error))
            }
        }
    }
}

// SAFETY: the bytes are a mapping the value owns (moving it moves no byte) and only it reaches;
// the SGE is the region's, over exactly `range`.
unsafe impl NicBuf for Registered {
    fn nic_ptr(&self) -> *const u8 {
        self.buf.as_slice()[self.range.clone()].as_ptr()
    }
    fn nic_len(&self) -> usize {
        self.range.len()
    }
    fn sge(&self, nic: &Nic) -> Result<Option<Sge>> {
        if !nic.same_device(self.mr.pd().nic()) {
            return Err(Error::invalid_arg("registered on another device"));
        }
        if self.range.is_empty() {
            return Ok(None);
        }
        self.mr.sge(self.range.start, self.range.len()).map(Some)
    }
}

// SAFETY: as above; no peer can write the bytes (no remote write right).
unsafe impl NicBufMut for Registered {}
