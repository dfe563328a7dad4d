//! The registry entries of the PostgreSQL crate: `pg-advisory`, `pg-row`
//! and `pg-optimistic`, each with the `SELECT 1` floor, and the row locks
//! with the two-`UPDATE` write floor beside it.

use std::sync::Arc;
use std::time::Duration;

use distlock::descriptor::{
    self as d, BuildParams, Config as _, Connected, Descriptor, Probe, Probes, Topology,
};
use distlock::{Capabilities, DistLock, Result};
use serde_json::Value;

use crate::advisory::PgAdvisoryLock;
use crate::config::PgConfig;
use crate::row::{PgOptimisticLock, PgRowLock};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Advisory,
    Row,
    Optimistic,
}

/// A backend of the PostgreSQL family (they all read `[postgres]`).
#[derive(Debug)]
pub struct PgBackend(Kind);

/// `pg-advisory`: a session advisory lock.
pub static PG_ADVISORY: PgBackend = PgBackend(Kind::Advisory);
/// `pg-row`: a lease row.
pub static PG_ROW: PgBackend = PgBackend(Kind::Row);
/// `pg-optimistic`: a version-column CAS.
pub static PG_OPTIMISTIC: PgBackend = PgBackend(Kind::Optimistic);

/// A lock with a raw floor on its own connections.
#[async_trait::async_trait]
trait Floors: Send + Sync {
    async fn floor(&self) -> Result<()>;
    async fn write_floor(&self) -> Result<()>;
}

#[async_trait::async_trait]
impl Floors for PgAdvisoryLock {
    async fn floor(&self) -> Result<()> {
        self.floor_round_trip().await
    }
    async fn write_floor(&self) -> Result<()> {
        Ok(())
    }
}

macro_rules! row_floors {
    ($($lock:ty),*) => {$(
        #[async_trait::async_trait]
        impl Floors for $lock {
            async fn floor(&self) -> Result<()> {
                self.floor_round_trip().await
            }
            async fn write_floor(&self) -> Result<()> {
                self.write_floor_round_trip().await
            }
        }
    )*};
}

row_floors!(PgRowLock, PgOptimisticLock);

/// Two `SELECT 1` on the lock's own pool.
struct Floor<L>(Arc<L>);

#[async_trait::async_trait]
impl<L: Floors> Probe for Floor<L> {
    async fn once(&self) -> Result<()> {
        self.0.floor().await
    }
}

/// Two one-row writes on the lock's own pool: the floor of a lock whose
/// acquire and release each write a row (reported next to the plain
/// `SELECT 1` floor, which no such lock can approach).
struct WriteFloor<L>(Arc<L>);

#[async_trait::async_trait]
impl<L: Floors> Probe for WriteFloor<L> {
    async fn once(&self) -> Result<()> {
        self.0.write_floor().await
    }
}

fn connected<L: Floors + DistLock>(lock: L, params: BuildParams, writes: bool) -> Connected {
    let lock = Arc::new(lock);
    let mut probes = Probes::default();
    if params.probes {
        probes.floor = Some(Box::new(Floor(lock.clone())));
        if writes {
            probes
                .peers
                .push(("write-floor".into(), Box::new(WriteFloor(lock.clone()))));
        }
    }
    Connected {
        lock: lock as Arc<dyn DistLock>,
        probes,
    }
}

#[async_trait::async_trait]
impl Descriptor for PgBackend {
    fn name(&self) -> &'static str {
        match self.0 {
            Kind::Advisory => "pg-advisory",
            Kind::Row => "pg-row",
            Kind::Optimistic => "pg-optimistic",
        }
    }

    fn about(&self) -> &'static str {
        match self.0 {
            Kind::Advisory => "PostgreSQL session advisory lock on a session of its own per acquisition; server-side wait (lock_timeout); sequence token; keepalives bound a dead host (dead_host_timeout_ms); ping -> lost",
            Kind::Row => "PostgreSQL lease row: INSERT .. ON CONFLICT DO UPDATE .. WHERE expired (database clock); owner per acquisition; token max(row counter + 1, database clock µs); watchdog",
            Kind::Optimistic => "PostgreSQL version-column CAS with jittered exponential backoff; version token (max(+1, database clock µs)); watchdog",
        }
    }

    fn capabilities(&self) -> Capabilities {
        match self.0 {
            Kind::Advisory => PgAdvisoryLock::CAPABILITIES,
            Kind::Row => PgRowLock::CAPABILITIES,
            Kind::Optimistic => PgOptimisticLock::CAPABILITIES,
        }
    }

    fn topology(&self) -> Topology {
        Topology::Postgres
    }

    fn family(&self) -> &'static str {
        PgConfig::FAMILY
    }

    fn env_vars(&self) -> &'static [&'static str] {
        PgConfig::ENV_VARS
    }

    fn settings(&self, table: Option<Value>) -> Result<Value> {
        d::settings_of::<PgConfig>(table)
    }

    fn set_endpoint(&self, settings: &mut Value, endpoint: &str) -> Result<()> {
        d::set_endpoint_of::<PgConfig>(settings, endpoint)
    }

    fn configured_endpoint(&self, settings: &Value) -> Option<String> {
        d::configured_endpoint_of::<PgConfig>(settings)
    }

    async fn connect(&self, settings: &Value, params: BuildParams) -> Result<Connected> {
        let cfg: PgConfig = d::typed(PgConfig::FAMILY, settings)?;
        Ok(match self.0 {
            Kind::Advisory => connected(PgAdvisoryLock::connect(cfg).await?, params, false),
            Kind::Row => connected(PgRowLock::connect(cfg).await?, params, true),
            Kind::Optimistic => connected(PgOptimisticLock::connect(cfg).await?, params, true),
        })
    }

    async fn server_version(&self, settings: &Value) -> Option<String> {
        use sqlx::Connection;
        let cfg: PgConfig = d::typed(PgConfig::FAMILY, settings).ok()?;
        let opts = cfg.connect_options().ok()?;
        let limit = Duration::from_secs(2);
        let mut c = tokio::time::timeout(limit, sqlx::PgConnection::connect_with(&opts))
            .await
            .ok()?
            .ok()?;
        crate::common::nodelay(&crate::common::tcp_peers(&opts).await);
        let v: String = tokio::time::timeout(
            limit,
            sqlx::query_scalar("SHOW server_version").fetch_one(&mut c),
        )
        .await
        .ok()?
        .ok()?;
        Some(format!("postgresql {v}"))
    }
}
