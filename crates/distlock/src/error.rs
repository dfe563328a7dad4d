//! The one error type every backend returns.

use std::time::Duration;

/// A boxed error from a backend's client library.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong when taking, keeping or giving back a lock.
///
/// Modelled on Jepsen's ok / fail / info: [`Error::is_indeterminate`] tells
/// whether the operation may still have taken effect on the server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The wait budget ran out before the lock could be taken. We cleaned up
    /// after ourselves, so the lock is known NOT to be ours.
    #[error("lock {key:?} not acquired within {waited:?} (held by another owner)")]
    Timeout {
        /// The lock key.
        key: String,
        /// How long we waited.
        waited: Duration,
    },
    /// The operation needs a lock that we do not hold (any more).
    #[error("lock {key:?} is not held by this owner")]
    NotHeld {
        /// The lock key.
        key: String,
    },
    /// The lock was lost while we held it.
    #[error("lock {key:?} was lost: {reason}")]
    Lost {
        /// The lock key.
        key: String,
        /// Why we know it is lost.
        reason: LostReason,
    },
    /// The backend cannot do what was asked (see its capabilities).
    #[error("{backend} does not support {what}")]
    Unsupported {
        /// Backend name.
        backend: &'static str,
        /// The unsupported feature.
        what: String,
    },
    /// A configuration value is missing or wrong; `key` names the setting.
    #[error("bad configuration `{key}`: {message}")]
    Config {
        /// The configuration key (as written in TOML / env).
        key: String,
        /// What is wrong with it.
        message: String,
    },
    /// The backend failed; `context` names the endpoint or operation.
    #[error("{backend}: {context}: {source}")]
    Backend {
        /// Backend name.
        backend: &'static str,
        /// What we were doing, naming the endpoint where it helps.
        context: String,
        /// True when the request may have reached the server (e.g. a
        /// deadline passed after sending): the outcome is unknown.
        indeterminate: bool,
        /// The client library's error.
        #[source]
        source: BoxError,
    },
}

/// What kind of error it was, for histories and counts (the variant
/// without its fields).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// [`Error::Timeout`]: held by another owner for the whole wait.
    Timeout,
    /// [`Error::NotHeld`].
    NotHeld,
    /// [`Error::Lost`].
    Lost,
    /// [`Error::Unsupported`].
    Unsupported,
    /// [`Error::Config`].
    Config,
    /// [`Error::Backend`]: the server or the network said no, or nothing.
    Backend,
}

impl Error {
    /// The kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Timeout { .. } => ErrorKind::Timeout,
            Error::NotHeld { .. } => ErrorKind::NotHeld,
            Error::Lost { .. } => ErrorKind::Lost,
            Error::Unsupported { .. } => ErrorKind::Unsupported,
            Error::Config { .. } => ErrorKind::Config,
            Error::Backend { .. } => ErrorKind::Backend,
        }
    }

    /// Whether the operation's effect on the server is unknown (Jepsen `info`).
    pub fn is_indeterminate(&self) -> bool {
        matches!(
            self,
            Error::Backend {
                indeterminate: true,
                ..
            }
        )
    }

    /// A [`Error::Backend`] for an operation that definitely did not happen.
    pub fn backend(
        backend: &'static str,
        context: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Backend {
            backend,
            context: context.into(),
            indeterminate: false,
            source: source.into(),
        }
    }

    /// A [`Error::Backend`] for an operation that may have happened.
    pub fn indeterminate(
        backend: &'static str,
        context: impl Into<String>,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Backend {
            backend,
            context: context.into(),
            indeterminate: true,
            source: source.into(),
        }
    }

    /// A [`Error::Config`] naming the setting.
    pub fn config(key: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Config {
            key: key.into(),
            message: message.into(),
        }
    }
}

/// Why a held lock is known to be lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LostReason {
    /// The lease ran out without a successful renewal.
    Expired,
    /// A renewal found the lock owned by somebody else or gone.
    NotOwner,
    /// Renewals kept failing until the lease could no longer be vouched for.
    RenewalFailed,
    /// The backend session / connection carrying the lock ended.
    SessionEnded,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "lease expired",
            LostReason::NotOwner => "lock no longer ours",
            LostReason::RenewalFailed => "renewal failed",
            LostReason::SessionEnded => "session ended",
        })
    }
}

/// Shorthand result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Runs `fut` with a deadline. A timeout is reported as indeterminate, because
/// the request may already have reached the server.
///
/// # Errors
/// The future's own error, or an indeterminate [`Error::Backend`] on timeout.
pub async fn with_deadline<T, F>(
    backend: &'static str,
    context: impl FnOnce() -> String,
    limit: Duration,
    fut: F,
) -> Result<T>
where
    F: std::future::Future<Output = Result<T>>,
{
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => Err(Error::indeterminate(
            backend,
            context(),
            format!("no reply within {limit:?}"),
        )),
    }
}
