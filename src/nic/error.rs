//! Errors of the NIC boundary: one variant per verb, each carrying the `io::Error` the verb
//! reported; `EOPNOTSUPP`/`ENOTSUP`/`ENOSYS` are promoted to [`Error::Unsupported`] so callers can
//! take a fallback path without matching errno values.
//!
//! Contract:
//! - an argument check that runs no verb at all (say, [`Mr::sge`](crate::nic::Mr::sge)) reports
//!   [`Error::InvalidArgument`] with `verb: None`; one made on behalf of a verb names it;
//! - fixed error texts are `&'static str` (or a borrowed `Cow`), so building an error on a setup
//!   path allocates only where the text carries run-time values;
//! - the crate-private errno helpers at the bottom (`last_errno`, `rc_errno`, `check_rc`, …) are
//!   the one place that turns a C return code or `errno` into an [`Error`], for the verbs
//!   backend and its `mlx5dv` binding alike.

use std::borrow::Cow;
use std::ffi::c_int;
use std::io;

/// The verbs named by errors and by the soft NIC's fault injection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Verb {
    /// `ibv_open_device`.
    OpenDevice,
    /// `ibv_query_device_ex`.
    QueryDevice,
    /// `ibv_query_port`.
    QueryPort,
    /// `ibv_query_gid`.
    QueryGid,
    /// `ibv_query_qp`.
    QueryQp,
    /// `ibv_alloc_pd`.
    AllocPd,
    /// `ibv_dealloc_pd`.
    DeallocPd,
    /// `ibv_reg_mr`.
    RegMr,
    /// `ibv_rereg_mr`.
    ReregMr,
    /// `ibv_dereg_mr`.
    DeregMr,
    /// `ibv_advise_mr`.
    AdviseMr,
    /// `ibv_alloc_mw`.
    AllocMw,
    /// `ibv_bind_mw`.
    BindMw,
    /// `ibv_dealloc_mw`.
    DeallocMw,
    /// `ibv_create_cq`.
    CreateCq,
    /// `ibv_destroy_cq`.
    DestroyCq,
    /// `ibv_poll_cq`.
    PollCq,
    /// `ibv_create_qp`.
    CreateQp,
    /// `ibv_modify_qp` (connect).
    ModifyQp,
    /// `ibv_destroy_qp`.
    DestroyQp,
    /// `ibv_post_send`.
    PostSend,
    /// `ibv_post_recv`.
    PostRecv,
    /// `mlx5dv_devx_umem_reg_ex`.
    UmemReg,
    /// `mlx5dv_devx_umem_dereg`.
    UmemDereg,
    /// `ibv_get_async_event`.
    GetAsyncEvent,
    /// `ibv_create_comp_channel`.
    CreateCompChannel,
    /// `ibv_req_notify_cq`.
    ReqNotifyCq,
    /// `ibv_get_cq_event`.
    GetCqEvent,
    /// `ibv_create_srq`.
    CreateSrq,
    /// `ibv_destroy_srq`.
    DestroySrq,
    /// `ibv_post_srq_recv`.
    PostSrqRecv,
}

impl Verb {
    /// The C name of the verb.
    pub fn name(self) -> &'static str {
        match self {
            Verb::OpenDevice => "ibv_open_device",
            Verb::QueryDevice => "ibv_query_device_ex",
            Verb::QueryPort => "ibv_query_port",
            Verb::QueryGid => "ibv_query_gid",
            Verb::QueryQp => "ibv_query_qp",
            Verb::AllocPd => "ibv_alloc_pd",
            Verb::DeallocPd => "ibv_dealloc_pd",
            Verb::RegMr => "ibv_reg_mr",
            Verb::ReregMr => "ibv_rereg_mr",
            Verb::DeregMr => "ibv_dereg_mr",
            Verb::AdviseMr => "ibv_advise_mr",
            Verb::AllocMw => "ibv_alloc_mw",
            Verb::BindMw => "ibv_bind_mw",
            Verb::DeallocMw => "ibv_dealloc_mw",
            Verb::CreateCq => "ibv_create_cq",
            Verb::DestroyCq => "ibv_destroy_cq",
            Verb::PollCq => "ibv_poll_cq",
            Verb::CreateQp => "ibv_create_qp",
            Verb::ModifyQp => "ibv_modify_qp",
            Verb::DestroyQp => "ibv_destroy_qp",
            Verb::PostSend => "ibv_post_send",
            Verb::PostRecv => "ibv_post_recv",
            Verb::UmemReg => "mlx5dv_devx_umem_reg_ex",
            Verb::UmemDereg => "mlx5dv_devx_umem_dereg",
            Verb::GetAsyncEvent => "ibv_get_async_event",
            Verb::CreateCompChannel => "ibv_create_comp_channel",
            Verb::ReqNotifyCq => "ibv_req_notify_cq",
            Verb::GetCqEvent => "ibv_get_cq_event",
            Verb::CreateSrq => "ibv_create_srq",
            Verb::DestroySrq => "ibv_destroy_srq",
            Verb::PostSrqRecv => "ibv_post_srq_recv",
        }
    }
}

impl std::fmt::Display for Verb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which of `ibv_rereg_mr(3)`'s outcomes a failed re-registration had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReregErrorKind {
    /// `IBV_REREG_MR_ERR_INPUT` (-1): old MR is valid, an input error was detected.
    Input,
    /// `IBV_REREG_MR_ERR_DONT_FORK_NEW` (-2): old MR is valid, DONTFORK on the new range failed.
    DontForkNew,
    /// `IBV_REREG_MR_ERR_DO_FORK_OLD` (-3): the new MR is valid, DOFORK on the old range failed.
    DoForkOld,
    /// `IBV_REREG_MR_ERR_CMD` (-4): the MR must not be used (only deregistered).
    Cmd,
    /// `IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW` (-5): as `Cmd`, and the new range's fork state is
    /// invalid.
    CmdAndDoForkNew,
}

impl ReregErrorKind {
    /// Map `ibv_rereg_mr`'s negative return value.
    pub fn from_raw(rc: i32) -> Option<ReregErrorKind> {
        Some(match rc {
            -1 => ReregErrorKind::Input,
            -2 => ReregErrorKind::DontForkNew,
            -3 => ReregErrorKind::DoForkOld,
            -4 => ReregErrorKind::Cmd,
            -5 => ReregErrorKind::CmdAndDoForkNew,
            _ => return None,
        })
    }

    /// The raw `ibv_rereg_mr_err_code` value.
    pub fn raw(self) -> i32 {
        match self {
            ReregErrorKind::Input => -1,
            ReregErrorKind::DontForkNew => -2,
            ReregErrorKind::DoForkOld => -3,
            ReregErrorKind::Cmd => -4,
            ReregErrorKind::CmdAndDoForkNew => -5,
        }
    }

    /// True when the MR still has its old, valid attributes.
    pub fn old_mr_valid(self) -> bool {
        matches!(self, ReregErrorKind::Input | ReregErrorKind::DontForkNew)
    }

    /// True when the MR is usable at all afterwards (with old or new attributes).
    pub fn mr_usable(self) -> bool {
        !matches!(self, ReregErrorKind::Cmd | ReregErrorKind::CmdAndDoForkNew)
    }
}

/// A failed `ibv_rereg_mr`: which outcome, and the errno behind it.
#[derive(Debug, thiserror::Error)]
#[error("ibv_rereg_mr failed ({kind:?}, old MR {}): {source}",
        if kind.old_mr_valid() { "still valid" } else if kind.mr_usable() { "replaced" } else { "must not be used" })]
pub struct ReregError {
    /// The outcome class.
    pub kind: ReregErrorKind,
    /// The errno.
    #[source]
    pub source: io::Error,
    /// With `DoForkOld`: the region as re-registered (the new attributes are in force).
    pub(crate) replaced: Option<crate::nic::types::RawMr>,
}

impl ReregError {
    /// Build from a kind and an errno value.
    pub fn new(kind: ReregErrorKind, errno: i32) -> ReregError {
        ReregError {
            kind,
            source: io::Error::from_raw_os_error(errno),
            replaced: None,
        }
    }

    /// `DoForkOld`: the re-registration `raw` is in force, marking the old range failed.
    pub(crate) fn replaced(raw: crate::nic::types::RawMr, errno: i32) -> ReregError {
        ReregError {
            kind: ReregErrorKind::DoForkOld,
            source: io::Error::from_raw_os_error(errno),
            replaced: Some(raw),
        }
    }

    /// The errno value.
    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }

    /// True when the provider does not implement re-registration (EOPNOTSUPP/ENOSYS).
    pub fn is_unsupported(&self) -> bool {
        matches!(self.errno(), Some(libc::EOPNOTSUPP | libc::ENOSYS))
    }
}

/// Errors of the NIC boundary.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No RDMA device is present (or the verbs backend is not built).
    #[error("no RDMA device found")]
    NoDevice,
    /// No device of that name.
    #[error("no RDMA device named {0:?}")]
    DeviceNotFound(String),
    /// The device an environment variable chose could not be opened.
    #[error("{var}={value:?}: {source}")]
    Env {
        /// The variable (`RDMA_POOL_NIC`).
        var: &'static str,
        /// Its value.
        value: String,
        /// Why the device it names could not be opened.
        source: Box<Error>,
    },
    /// The device or provider does not implement this verb or variant.
    #[error("{verb} is not supported by this device: {detail}")]
    Unsupported {
        /// The verb.
        verb: Verb,
        /// What exactly is missing (borrowed when the text is fixed).
        detail: Cow<'static, str>,
    },
    /// A verb failed; `source` is the errno it reported.
    #[error("{verb} failed: {source}")]
    Verb {
        /// The verb.
        verb: Verb,
        /// The errno.
        #[source]
        source: io::Error,
    },
    /// A re-registration failed.
    #[error(transparent)]
    Rereg(#[from] ReregError),
    /// An argument was rejected before reaching the NIC; nothing changed.
    #[error("invalid argument{}: {detail}", ToVerb(*verb))]
    InvalidArgument {
        /// The verb the argument was meant for; `None` for a pure argument check that runs no
        /// verb (such as [`Mr::sge`](crate::nic::Mr::sge)).
        verb: Option<Verb>,
        /// What was wrong.
        detail: &'static str,
    },
    /// A device limit would be exceeded.
    #[error("{verb}: device limit {limit} = {max} would be exceeded")]
    Limit {
        /// The verb.
        verb: Verb,
        /// The limit's name (`max_mr`, `max_mr_size`, `max_mw`, `max_sge`).
        limit: &'static str,
        /// The limit's value.
        max: u64,
    },
    /// A blocking wait for a completion timed out.
    #[error("no completion within {0:?}")]
    Timeout(std::time::Duration),
}

impl Error {
    /// A verb failure from an errno, promoting "not supported" errnos to `Unsupported`.
    pub fn from_errno(verb: Verb, errno: i32) -> Error {
        Error::from_io(verb, io::Error::from_raw_os_error(errno))
    }

    /// A verb failure from an `io::Error`, promoting "not supported" errnos to `Unsupported`.
    pub fn from_io(verb: Verb, source: io::Error) -> Error {
        match source.raw_os_error() {
            Some(libc::EOPNOTSUPP) => {
                Error::unsupported(verb, "Operation not supported (EOPNOTSUPP)")
            }
            Some(libc::ENOSYS) => Error::unsupported(verb, "Function not implemented (ENOSYS)"),
            _ => Error::Verb { verb, source },
        }
    }

    /// The errno behind this error, if there is one (`EOPNOTSUPP` for `Unsupported`).
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Verb { source, .. } => source.raw_os_error(),
            Error::Rereg(r) => r.errno(),
            Error::Unsupported { .. } => Some(libc::EOPNOTSUPP),
            Error::InvalidArgument { .. } => Some(libc::EINVAL),
            Error::Limit { .. } => Some(libc::ENOMEM),
            Error::Env { source, .. } => source.errno(),
            _ => None,
        }
    }

    /// True for [`Error::Unsupported`].
    pub fn is_unsupported(&self) -> bool {
        matches!(self, Error::Unsupported { .. })
    }

    /// An argument rejected on behalf of `verb`, before it ran.
    pub(crate) fn invalid(verb: Verb, detail: &'static str) -> Error {
        Error::InvalidArgument {
            verb: Some(verb),
            detail,
        }
    }

    /// An argument rejected by a check that runs no verb.
    pub(crate) fn invalid_arg(detail: &'static str) -> Error {
        Error::InvalidArgument { verb: None, detail }
    }

    /// `verb` is not implemented by the device or provider; `detail` says what is missing.
    pub(crate) fn unsupported(verb: Verb, detail: impl Into<Cow<'static, str>>) -> Error {
        Error::Unsupported {
            verb,
            detail: detail.into(),
        }
    }

    /// The error of a verb that failed (returned NULL or -1) and set `errno`.
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))] // used by the verbs backend only
    pub(crate) fn last(verb: Verb) -> Error {
        Error::from_errno(verb, last_errno())
    }
}

/// `" to <verb>"`, or nothing: how [`Error::InvalidArgument`] names its verb.
struct ToVerb(Option<Verb>);

impl std::fmt::Display for ToVerb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(verb) => write!(f, " to {verb}"),
            None => Ok(()),
        }
    }
}

/// Result of the NIC boundary.
pub type Result<T, E = Error> = std::result::Result<T, E>;

// ---------------------------------------------------------------------------------------------
// errno plumbing, shared by the verbs backend and its mlx5dv binding

/// `errno` right now, never 0 (`EIO` when the verb failed without setting it).
#[cfg_attr(not(feature = "verbs"), allow(dead_code))] // used by the verbs backend only
pub(crate) fn last_errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .filter(|&e| e != 0)
        .unwrap_or(libc::EIO)
}

/// `errno` as an `io::Error`, never "success" (a verb that failed without setting errno
/// reports `EIO`).
#[cfg_attr(not(feature = "verbs"), allow(dead_code))] // used by the verbs backend only
pub(crate) fn last_os_error() -> io::Error {
    io::Error::from_raw_os_error(last_errno())
}

/// The errno behind a failed verb's return code: positive codes are errno values (the
/// libibverbs convention), `-1` means "see errno", other negative codes are negated errnos.
#[cfg_attr(not(feature = "verbs"), allow(dead_code))] // used by the verbs backend only
pub(crate) fn rc_errno(rc: c_int) -> i32 {
    match rc {
        rc if rc > 0 => rc,
        -1 => last_errno(),
        rc => rc.checked_neg().unwrap_or(libc::EIO),
    }
}

/// `Ok` for a zero return code, else `verb`'s error for the errno behind `rc` (see
/// [`rc_errno`]).
#[cfg_attr(not(feature = "verbs"), allow(dead_code))] // used by the verbs backend only
pub(crate) fn check_rc(verb: Verb, rc: c_int) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::from_errno(verb, rc_errno(rc)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn return_codes_to_errno() {
        assert_eq!(rc_errno(libc::EINVAL), libc::EINVAL);
        assert_eq!(rc_errno(-libc::ENOMEM), libc::ENOMEM);
        assert!(check_rc(Verb::DeregMr, 0).is_ok());
        assert!(
            check_rc(Verb::AdviseMr, libc::EOPNOTSUPP)
                .unwrap_err()
                .is_unsupported()
        );
        assert_eq!(
            check_rc(Verb::DeregMr, libc::EBUSY).unwrap_err().errno(),
            Some(libc::EBUSY)
        );
    }

    #[test]
    fn invalid_arguments_name_their_verb_only_when_there_is_one() {
        let e = Error::invalid(Verb::BindMw, "window range outside the region");
        assert_eq!(
            e.to_string(),
            "invalid argument to ibv_bind_mw: window range outside the region"
        );
        let e = Error::invalid_arg("range outside the region");
        assert_eq!(e.to_string(), "invalid argument: range outside the region");
        assert_eq!(e.errno(), Some(libc::EINVAL));
    }

    #[test]
    fn unsupported_errnos_are_promoted_with_fixed_text() {
        let e = Error::from_errno(Verb::AdviseMr, libc::EOPNOTSUPP);
        assert!(
            matches!(
                &e,
                Error::Unsupported {
                    detail: Cow::Borrowed(_),
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(Error::from_errno(Verb::RegMr, libc::ENOSYS).is_unsupported());
        assert!(!Error::from_errno(Verb::RegMr, libc::ENOMEM).is_unsupported());
    }
}
