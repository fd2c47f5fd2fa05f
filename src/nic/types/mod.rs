//! Plain data that crosses the NIC boundary: keys, access flags, capabilities, work requests
//! and completions.
//!
//! Contract: every numeric value here is the one libibverbs uses (`ibv_access_flags`,
//! `ibv_rereg_mr_flags`, `ibv_advise_mr_advice`, `ibv_wc_status`), so the verbs backend passes
//! them through unchanged and the soft NIC speaks the same language.
//!
//! Invariant: `key.variant() == key.0 & 0xff` and `key.index() == key.0 >> 8` for every key;
//! a new binding or registration of the same index changes the variant.
//!
//! Crate-private here: [`RawMr`], a region as a backend reports it (held by `ReregError`, so it
//! lives with the plain data rather than with the backend trait), and [`MrAttrs`] with
//! [`ReregFlags::resolve`], the one place that says which attributes a re-registration changes.
//!
//! Files: `keys.rs` the keys, `access.rs` the rights and flags of regions and windows,
//! `caps.rs` what a device is and can do, `wr.rs` work requests, `completion.rs` work
//! completions, `connect.rs` a QP's sizes and connection.

mod access;
mod caps;
mod completion;
mod connect;
mod keys;
mod wr;

pub use access::{Access, Advice, AdviseFlags, MAX_ADVISE_SGES, MwType, ReregFlags};
pub(crate) use access::{MrAttrs, RawMr};
pub use caps::{AsyncEvent, Caps, ForkStatus, NicKind, OdpCaps, OdpOps};
pub use completion::{Completion, WcOpcode, WcStatus};
pub use connect::{ConnectOptions, Endpoint, QpCaps, QpState};
pub use keys::{Lkey, Rkey};
pub use wr::{SendFlags, SendOp, SendWr, Sge};
