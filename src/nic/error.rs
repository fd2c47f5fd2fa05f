//! Errors of the NIC boundary: one variant per verb, each carrying the `io::Error` the verb
//! reported; `EOPNOTSUPP`/`ENOTSUP`/`ENOSYS` are promoted to [`Error::Unsupported`] so callers can
//! take a fallback path without matching errno values.

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
    pub(crate) replaced: Option<crate::nic::backend::RawMr>,
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
    /// The device or provider does not implement this verb or variant.
    #[error("{verb} is not supported by this device: {detail}")]
    Unsupported {
        /// The verb.
        verb: Verb,
        /// What exactly is missing.
        detail: String,
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
    #[error("invalid argument to {verb}: {detail}")]
    InvalidArgument {
        /// The verb.
        verb: Verb,
        /// What was wrong.
        detail: String,
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
            Some(libc::EOPNOTSUPP | libc::ENOSYS) => Error::Unsupported {
                verb,
                detail: source.to_string(),
            },
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
            _ => None,
        }
    }

    /// True for [`Error::Unsupported`].
    pub fn is_unsupported(&self) -> bool {
        matches!(self, Error::Unsupported { .. })
    }

    pub(crate) fn invalid(verb: Verb, detail: impl Into<String>) -> Error {
        Error::InvalidArgument {
            verb,
            detail: detail.into(),
        }
    }
}

/// Result of the NIC boundary.
pub type Result<T, E = Error> = std::result::Result<T, E>;
