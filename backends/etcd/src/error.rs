//! Error mapping shared by every module of the crate: which client errors
//! leave a write's outcome unknown, and which a retry may get past.

use distlock::Error;

pub(crate) const BACKEND: &str = "etcd";

/// Maps a client error. A write whose reply never came may have been
/// applied (`indeterminate`) unless the server refused it outright.
pub(crate) fn map_err(context: impl Into<String>, e: etcd_client::Error, write: bool) -> Error {
    // gRPC codes of a request the server refused outright: InvalidArgument,
    // NotFound, AlreadyExists, PermissionDenied, FailedPrecondition,
    // OutOfRange, Unauthenticated.
    const REFUSED: [i32; 7] = [3, 5, 6, 7, 9, 11, 16];
    let refused = match &e {
        etcd_client::Error::GRpcStatus(s) => REFUSED.contains(&(s.code() as i32)),
        etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_) => true,
        _ => false,
    };
    if write && !refused {
        Error::indeterminate(BACKEND, context, e)
    } else {
        Error::backend(BACKEND, context, e)
    }
}

/// Whether an error is the kind a cluster fault causes (a member gone, a
/// leader election), so the acquisition may try again on another member.
pub(crate) fn transient(e: &Error) -> bool {
    matches!(e, Error::Backend { .. })
}
