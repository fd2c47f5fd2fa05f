//! How many regions and windows this context holds, so that a failure at the device's limit is
//! reported as [`Error::Limit`] on every provider.
//!
//! Contract: above `max_mr`/`max_mw`, mlx5 answers `ENOMEM` and kernel rxe `EINVAL` (its
//! object pools; `quirks::Quirk::LimitIsEinval`). Neither errno alone says "limit reached"
//! (`EINVAL` also means bad input, `ENOMEM` also memlock), so a failure with one of them while
//! the live count is at the limit is the limit; any other failure keeps its errno. Objects made
//! on the same context outside this `VerbsNic` (an attached context) are not counted: then the
//! raw errno stands.
//!
//! Invariant: `mrs` / `mws` equal the regions / windows registered through this backend and
//! not yet released.

use crate::nic::error::{Error, Verb};
use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Debug, Default)]
pub(super) struct Census {
    mrs: AtomicU32,
    mws: AtomicU32,
}

/// Which object count a verb changes.
#[derive(Debug, Clone, Copy)]
pub(super) enum Kind {
    Mr,
    Mw,
}

impl Census {
    fn counter(&self, kind: Kind) -> &AtomicU32 {
        match kind {
            Kind::Mr => &self.mrs,
            Kind::Mw => &self.mws,
        }
    }

    /// Count the result of a create verb, or name the limit it hit.
    pub(super) fn created<T>(&self, kind: Kind, max: u32, r: Result<T, Error>) -> Result<T, Error> {
        let live = self.counter(kind);
        match r {
            Ok(v) => {
                live.fetch_add(1, Ordering::Relaxed);
                Ok(v)
            }
            Err(e) => Err(at_limit(kind, e, live.load(Ordering::Relaxed), max)),
        }
    }

    /// Count the result of a destroy verb.
    pub(super) fn released(&self, kind: Kind, r: Result<(), Error>) -> Result<(), Error> {
        if r.is_ok() {
            self.counter(kind).fetch_sub(1, Ordering::Relaxed);
        }
        r
    }
}

/// `e` as [`Error::Limit`] when it is `EINVAL`/`ENOMEM` with `live` objects at `max`.
pub(super) fn at_limit(kind: Kind, e: Error, live: u32, max: u32) -> Error {
    let (verb, limit) = match kind {
        Kind::Mr => (Verb::RegMr, "max_mr"),
        Kind::Mw => (Verb::AllocMw, "max_mw"),
    };
    match e.errno() {
        Some(libc::EINVAL | libc::ENOMEM) if live >= max => Error::Limit {
            verb,
            limit,
            max: max as u64,
        },
        _ => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn einval_or_enomem_at_the_limit_is_the_limit() {
        let einval = || Error::from_errno(Verb::RegMr, libc::EINVAL);
        assert!(matches!(
            at_limit(Kind::Mr, einval(), 4, 4),
            Error::Limit {
                limit: "max_mr",
                max: 4,
                ..
            }
        ));
        assert!(matches!(
            at_limit(
                Kind::Mw,
                Error::from_errno(Verb::AllocMw, libc::ENOMEM),
                9,
                9
            ),
            Error::Limit {
                limit: "max_mw",
                ..
            }
        ));
        // Below the limit the errno stands: EINVAL is bad input, ENOMEM memlock.
        assert_eq!(
            at_limit(Kind::Mr, einval(), 3, 4).errno(),
            Some(libc::EINVAL)
        );
        assert!(!matches!(
            at_limit(Kind::Mr, Error::from_errno(Verb::RegMr, libc::EFAULT), 4, 4),
            Error::Limit { .. }
        ));
    }

    #[test]
    fn the_census_counts_what_lives() {
        let c = Census::default();
        c.created(Kind::Mr, 1, Ok(())).unwrap();
        let e = c
            .created::<()>(
                Kind::Mr,
                1,
                Err(Error::from_errno(Verb::RegMr, libc::EINVAL)),
            )
            .unwrap_err();
        assert!(matches!(e, Error::Limit { .. }));
        c.released(Kind::Mr, Ok(())).unwrap();
        let e = c
            .created::<()>(
                Kind::Mr,
                1,
                Err(Error::from_errno(Verb::RegMr, libc::EINVAL)),
            )
            .unwrap_err();
        assert_eq!(e.errno(), Some(libc::EINVAL));
    }
}
