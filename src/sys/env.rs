//! The environment, read without allocating: `getenv` borrows from the process's environment
//! block, numbers parse from bytes (the pool reads its overrides inside `GlobalAlloc`, where
//! `std::env` would allocate).

use std::ffi::CStr;

/// The value of an environment variable, borrowed from the environment block (no allocation).
pub(crate) fn getenv(name: &CStr) -> Option<&'static [u8]> {
    // SAFETY: `name` is NUL-terminated; the result, when non-null, points into the process's
    // environment block, which this crate never modifies (a concurrent `setenv` by the program
    // is its own data race, as with any `getenv`).
    let p = unsafe { libc::getenv(name.as_ptr()) };
    // SAFETY: a non-null result is a NUL-terminated string that lives as long as the entry.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_bytes())
}

/// A decimal number (no sign, no blanks), or `None`.
pub(crate) fn parse_u64(v: &[u8]) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    v.iter().try_fold(0u64, |n, &b| {
        b.is_ascii_digit()
            .then(|| n.checked_mul(10)?.checked_add(u64::from(b - b'0')))
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_parse_without_allocating() {
        assert_eq!(parse_u64(b"250"), Some(250));
        assert_eq!(parse_u64(b"0"), Some(0));
        assert_eq!(parse_u64(b""), None);
        assert_eq!(parse_u64(b"1s"), None);
        assert_eq!(parse_u64(b"99999999999999999999999"), None);
    }

    #[test]
    fn getenv_reads_without_std_env() {
        assert_eq!(getenv(c"RDMA_POOL_SURELY_UNSET_VARIABLE"), None);
        assert!(getenv(c"PATH").is_some_and(|p| !p.is_empty()));
    }
}
