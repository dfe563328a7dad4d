//! The data the ledger and coupon workloads protect, in a real PostgreSQL
//! (and, for the pre-deduct baseline, a real Redis), and the checks run on
//! it by SQL after the run.
//!
//! Every run gets its own schema (named from the run's key), so runs never
//! see each other's rows and the unique-index variant can differ per run.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Row};

use crate::spec::{CouponPlan, Ordering, Strategy};

/// A data-store failure, naming what was being done.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// PostgreSQL.
    #[error("postgres ({what}): {source}")]
    Sql {
        /// The step.
        what: &'static str,
        /// The driver's error.
        #[source]
        source: sqlx::Error,
    },
    /// Redis.
    #[error("redis ({what}): {source}")]
    Redis {
        /// The step.
        what: &'static str,
        /// The driver's error.
        #[source]
        source: redis::RedisError,
    },
    /// A URL or parameter is missing.
    #[error("{0}")]
    Config(String),
}

fn sql(what: &'static str) -> impl FnOnce(sqlx::Error) -> DataError {
    move |source| DataError::Sql { what, source }
}

fn red(what: &'static str) -> impl FnOnce(redis::RedisError) -> DataError {
    move |source| DataError::Redis { what, source }
}

/// The schema of one run: `lb_` + the key's letters and digits + a hash,
/// within PostgreSQL's 63-byte identifier limit.
pub fn schema_for(key: &str) -> String {
    let clean: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    let tail: String = clean
        .chars()
        .rev()
        .take(40)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let mut h: u32 = 0x811c_9dc5;
    for b in key.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    format!("lb_{tail}_{h:08x}")
}

/// A connection pool to the run's data database, in the run's schema.
#[derive(Debug, Clone)]
pub struct DataDb {
    pool: PgPool,
    schema: String,
}

impl DataDb {
    /// Connects (failing within seconds, naming the server).
    ///
    /// # Errors
    /// Unreachable server or bad URL.
    pub async fn connect(url: &str, key: &str, max_connections: u32) -> Result<Self, DataError> {
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(5))
            // A ping before every statement would double the cost we time.
            .test_before_acquire(false)
            .connect(url)
            .await
            .map_err(|e| {
                DataError::Config(format!("data database {}: {e}", distlock::redact_url(url)))
            })?;
        Ok(Self {
            pool,
            schema: schema_for(key),
        })
    }

    /// The run's schema name.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    async fn batch(&self, what: &'static str, script: &str) -> Result<(), DataError> {
        sqlx::raw_sql(AssertSqlSafe(script.to_string()))
            .execute(&self.pool)
            .await
            .map_err(sql(what))?;
        Ok(())
    }

    // ---- ledger workload -------------------------------------------------

    /// Creates the counter, the fenced ledger and its log for `key`.
    ///
    /// # Errors
    /// SQL failures.
    pub async fn prepare_ledger(&self, key: &str) -> Result<(), DataError> {
        let s = &self.schema;
        // One call per critical section does the counter write (unfenced:
        // it takes whatever the holder read), the fenced write (accepted only
        // if the token is greater than the last accepted one) and the log
        // row the checker counts. A write is "stale" when a later
        // acquisition (by its acquire completion time, on the one host
        // clock all workers share) has already written: the writer had lost
        // the lock. An unfenced resource accepts every stale write.
        self.batch(
            "creating the ledger",
            &format!(
                r#"
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE IF NOT EXISTS {s}.counter (key text PRIMARY KEY, value bigint NOT NULL);
CREATE TABLE IF NOT EXISTS {s}.ledger (key text PRIMARY KEY, last_token bigint,
    newest_acq_ns bigint NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS {s}.ledger_log (id bigserial PRIMARY KEY, key text NOT NULL,
    worker int NOT NULL, token bigint, acq_ns bigint NOT NULL, accepted boolean NOT NULL,
    stale boolean NOT NULL);
CREATE OR REPLACE FUNCTION {s}.cs_write(k text, v bigint, tok bigint, acq bigint, w int)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE r {s}.ledger%ROWTYPE; is_stale boolean; ok boolean;
BEGIN
  UPDATE {s}.counter SET value = v WHERE key = k;
  SELECT * INTO r FROM {s}.ledger WHERE key = k FOR UPDATE;
  is_stale := acq < r.newest_acq_ns;
  ok := tok IS NULL OR r.last_token IS NULL OR tok > r.last_token;
  UPDATE {s}.ledger SET
      last_token = CASE WHEN ok AND tok IS NOT NULL THEN tok ELSE last_token END,
      newest_acq_ns = GREATEST(newest_acq_ns, acq)
    WHERE key = k;
  INSERT INTO {s}.ledger_log (key, worker, token, acq_ns, accepted, stale)
    VALUES (k, w, tok, acq, ok, is_stale);
  RETURN ok;
END $$;
"#
            ),
        )
        .await?;
        for table in ["counter", "ledger"] {
            let q = if table == "counter" {
                format!("INSERT INTO {s}.counter VALUES ($1, 0) ON CONFLICT DO NOTHING")
            } else {
                format!("INSERT INTO {s}.ledger (key) VALUES ($1) ON CONFLICT DO NOTHING")
            };
            sqlx::query(AssertSqlSafe(q))
                .bind(key)
                .execute(&self.pool)
                .await
                .map_err(sql("seeding the ledger"))?;
        }
        Ok(())
    }

    /// The ledger workload's critical section: read the counter, hold,
    /// write counter + 1 and the fenced ledger entry. Returns whether the
    /// fenced ledger accepted the token.
    ///
    /// # Errors
    /// SQL failures (the section then counts as not acknowledged).
    pub async fn critical_section(
        &self,
        key: &str,
        worker: u32,
        token: Option<u64>,
        acquired_ns: u64,
        hold: Duration,
    ) -> Result<bool, DataError> {
        let s = &self.schema;
        let v: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT value FROM {s}.counter WHERE key = $1"
        )))
        .bind(key)
        .fetch_one(&self.pool)
        .await
        .map_err(sql("reading the counter"))?;
        if !hold.is_zero() {
            tokio::time::sleep(hold).await;
        }
        let tok = token.map(|t| i64::try_from(t).unwrap_or(i64::MAX));
        let acq = i64::try_from(acquired_ns).unwrap_or(i64::MAX);
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT {s}.cs_write($1, $2, $3, $4, $5)"
        )))
        .bind(key)
        .bind(v + 1)
        .bind(tok)
        .bind(acq)
        .bind(i32::try_from(worker).unwrap_or(i32::MAX))
        .fetch_one(&self.pool)
        .await
        .map_err(sql("writing the counter and the ledger"))
    }

    /// The fenced-ledger and lost-update verdicts for `key`.
    ///
    /// # Errors
    /// SQL failures.
    pub async fn check_ledger(
        &self,
        key: &str,
        fenceable: bool,
    ) -> Result<LedgerReport, DataError> {
        let s = &self.schema;
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT count(*), count(*) FILTER (WHERE accepted), count(*) FILTER (WHERE NOT accepted),
                    count(*) FILTER (WHERE stale AND accepted), count(*) FILTER (WHERE stale)
             FROM {s}.ledger_log WHERE key = $1"
        )))
        .bind(key)
        .fetch_one(&self.pool)
        .await
        .map_err(sql("counting the ledger"))?;
        let n = |i: usize| -> Result<u64, DataError> {
            let v: i64 = row.try_get(i).map_err(sql("reading the ledger counts"))?;
            Ok(u64::try_from(v).unwrap_or(0))
        };
        let counter: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT value FROM {s}.counter WHERE key = $1"
        )))
        .bind(key)
        .fetch_one(&self.pool)
        .await
        .map_err(sql("reading the final counter"))?;
        let acknowledged = n(0)?;
        let counter_final = u64::try_from(counter).unwrap_or(0);
        let stale_writes_accepted = n(3)?;
        let lost_updates = acknowledged.saturating_sub(counter_final);
        Ok(LedgerReport {
            fenceable,
            writes: acknowledged,
            accepted: n(1)?,
            rejected: n(2)?,
            stale_writes_accepted,
            stale_writes_unfenced: n(4)?,
            acknowledged,
            counter_final,
            lost_updates,
            verdict: if lost_updates > 0 {
                "lost updates".into()
            } else if !fenceable {
                "unfenceable".into()
            } else if stale_writes_accepted > 0 {
                "stale writes accepted".into()
            } else {
                "ok".into()
            },
        })
    }

    // ---- coupon workload -------------------------------------------------

    /// Creates `voucher` (id 1, `stock`) and `voucher_order`, with or
    /// without the unique (user, voucher) index.
    ///
    /// # Errors
    /// SQL failures.
    pub async fn prepare_coupon(&self, plan: &CouponPlan) -> Result<(), DataError> {
        let s = &self.schema;
        let index = if plan.unique_index {
            format!("CREATE UNIQUE INDEX voucher_order_one_per_user ON {s}.voucher_order (user_id, voucher_id);")
        } else {
            String::new()
        };
        self.batch(
            "creating the coupon tables",
            &format!(
                r#"
CREATE SCHEMA IF NOT EXISTS {s};
DROP TABLE IF EXISTS {s}.voucher_order, {s}.voucher;
CREATE TABLE {s}.voucher (id bigint PRIMARY KEY, stock int NOT NULL, initial int NOT NULL,
    min_stock int NOT NULL);
CREATE TABLE {s}.voucher_order (id bigserial PRIMARY KEY, user_id bigint NOT NULL,
    voucher_id bigint NOT NULL, created_ns bigint NOT NULL);
{index}
INSERT INTO {s}.voucher VALUES (1, {stock}, {stock}, {stock});
"#,
                stock = plan.stock
            ),
        )
        .await
    }

    /// The seed's order transaction for one click, inside a lock the caller
    /// holds: no order yet for this user, stock left, then decrement and
    /// insert, up to (not including) COMMIT, so the caller decides whether
    /// the lock is released before or after [`Pending::commit`].
    ///
    /// # Errors
    /// SQL failures.
    pub async fn order_locked(&self, user: u64) -> Result<Pending, DataError> {
        let s = &self.schema;
        let uid = i64::try_from(user).unwrap_or(i64::MAX);
        let mut tx = self.pool.begin().await.map_err(sql("BEGIN"))?;
        let have: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {s}.voucher_order WHERE user_id = $1 AND voucher_id = 1"
        )))
        .bind(uid)
        .fetch_one(&mut *tx)
        .await
        .map_err(sql("checking the user's orders"))?;
        if have > 0 {
            return Ok(Pending::Done(Click::Duplicate));
        }
        match self.decrement_and_insert(&mut tx, uid).await {
            Ok(true) => Ok(Pending::Open(tx)),
            Ok(false) => Ok(Pending::Done(Click::SoldOut)),
            // The unique index makes a concurrent duplicate wait, then fail.
            Err(DataError::Sql { source, .. }) if is_unique_violation(&source) => {
                Ok(Pending::Done(Click::Duplicate))
            }
            Err(e) => Err(e),
        }
    }

    /// The lock-free baseline: guarded decrement + insert, the unique index
    /// rejects a second order of the same user.
    ///
    /// # Errors
    /// SQL failures other than the unique-index rejection.
    pub async fn order_atomic(&self, user: u64) -> Result<Click, DataError> {
        let uid = i64::try_from(user).unwrap_or(i64::MAX);
        let mut tx = self.pool.begin().await.map_err(sql("BEGIN"))?;
        match self.decrement_and_insert(&mut tx, uid).await {
            Ok(true) => finish(tx.commit().await),
            Ok(false) => Ok(Click::SoldOut),
            Err(DataError::Sql { source, .. }) if is_unique_violation(&source) => {
                Ok(Click::Duplicate)
            }
            Err(e) => Err(e),
        }
    }

    /// `UPDATE voucher SET stock = stock - 1 WHERE stock > 0` (tracking the
    /// lowest stock ever written) then the order row. False: sold out.
    async fn decrement_and_insert(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
        uid: i64,
    ) -> Result<bool, DataError> {
        let s = &self.schema;
        let left: Option<i32> = sqlx::query_scalar(AssertSqlSafe(format!(
            "UPDATE {s}.voucher SET stock = stock - 1, min_stock = LEAST(min_stock, stock - 1)
             WHERE id = 1 AND stock > 0 RETURNING stock"
        )))
        .fetch_optional(&mut **tx)
        .await
        .map_err(sql("decrementing the stock"))?;
        if left.is_none() {
            return Ok(false);
        }
        let now = i64::try_from(crate::history::monotonic_ns()).unwrap_or(i64::MAX);
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {s}.voucher_order (user_id, voucher_id, created_ns) VALUES ($1, 1, $2)"
        )))
        .bind(uid)
        .bind(now)
        .execute(&mut **tx)
        .await
        .map_err(sql("inserting the order"))?;
        Ok(true)
    }

    /// The coupon invariants, by SQL after the run.
    ///
    /// # Errors
    /// SQL failures.
    pub async fn check_coupon(&self) -> Result<CouponCheck, DataError> {
        let s = &self.schema;
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT v.initial, v.stock, v.min_stock,
                    (SELECT count(*) FROM {s}.voucher_order o WHERE o.voucher_id = 1),
                    (SELECT count(*) FROM (SELECT user_id FROM {s}.voucher_order
                        WHERE voucher_id = 1 GROUP BY user_id HAVING count(*) > 1) d),
                    (SELECT count(*) - count(DISTINCT user_id) FROM {s}.voucher_order
                        WHERE voucher_id = 1)
             FROM {s}.voucher v WHERE v.id = 1"
        )))
        .fetch_one(&self.pool)
        .await
        .map_err(sql("checking the coupon invariants"))?;
        let i32_at = |i: usize| -> Result<i64, DataError> {
            let v: i32 = row.try_get(i).map_err(sql("reading the voucher"))?;
            Ok(i64::from(v))
        };
        let i64_at = |i: usize| -> Result<i64, DataError> {
            row.try_get::<i64, _>(i).map_err(sql("reading the orders"))
        };
        let (initial, remaining, min_stock) = (i32_at(0)?, i32_at(1)?, i32_at(2)?);
        let (orders, dup_users, dup_orders) = (i64_at(3)?, i64_at(4)?, i64_at(5)?);
        Ok(CouponCheck {
            initial_stock: initial,
            remaining_stock: remaining,
            min_stock,
            orders,
            users_with_two_orders: dup_users,
            duplicate_orders: dup_orders,
            oversold: (orders - initial).max(0),
            stock_never_negative: min_stock >= 0 && remaining >= 0,
            one_order_per_user: dup_users == 0,
            orders_match_stock: orders == initial - remaining,
        })
    }
}

fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some("23505"))
}

fn finish(r: Result<(), sqlx::Error>) -> Result<Click, DataError> {
    match r {
        Ok(()) => Ok(Click::Ordered),
        Err(e) if is_unique_violation(&e) => Ok(Click::Duplicate),
        Err(e) => Err(DataError::Sql {
            what: "COMMIT",
            source: e,
        }),
    }
}

/// An order transaction waiting for its COMMIT, or a click already
/// decided (rolled back).
#[derive(Debug)]
pub enum Pending {
    /// Decrement and insert done, not committed.
    Open(sqlx::Transaction<'static, sqlx::Postgres>),
    /// Nothing to commit.
    Done(Click),
}

impl Pending {
    /// Commits after `delay` (the seed's window, widened on purpose).
    ///
    /// # Errors
    /// SQL failures other than the unique-index rejection.
    pub async fn commit(self, delay: Duration) -> Result<Click, DataError> {
        match self {
            Pending::Done(c) => Ok(c),
            Pending::Open(tx) => {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                finish(tx.commit().await)
            }
        }
    }
}

/// What one click ended as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Click {
    /// An order was written (or, pre-deduct, accepted for writing).
    Ordered,
    /// The user already had an order (or the unique index said so).
    Duplicate,
    /// No stock left.
    SoldOut,
}

impl Click {
    /// Counter name in the worker's report.
    pub fn counter(self) -> &'static str {
        match self {
            Click::Ordered => "ordered",
            Click::Duplicate => "rejected_duplicate",
            Click::SoldOut => "rejected_sold_out",
        }
    }
}

/// The fenced-ledger (checker 2) and lost-update (checker 3) verdicts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerReport {
    /// Whether the backend declares a safe fencing token; without one the
    /// ledger cannot protect anything and the verdict says "unfenceable".
    pub fenceable: bool,
    /// Ledger writes (one per acknowledged critical section).
    pub writes: u64,
    /// Writes the fenced ledger accepted.
    pub accepted: u64,
    /// Writes it rejected (token not above the last accepted one).
    pub rejected: u64,
    /// Stale writes (their lock already superseded) that the fenced ledger
    /// accepted: must be 0 for a fenced backend.
    pub stale_writes_accepted: u64,
    /// Stale writes an unfenced resource would have accepted (all of them).
    pub stale_writes_unfenced: u64,
    /// Critical sections whose counter write was acknowledged.
    pub acknowledged: u64,
    /// The counter at the end.
    pub counter_final: u64,
    /// acknowledged - counter_final: increments lost to an overlapping
    /// read-modify-write.
    pub lost_updates: u64,
    /// `ok`, `lost updates`, `stale writes accepted` or `unfenceable`.
    pub verdict: String,
}

/// The coupon invariants (checker 4), read by SQL after the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CouponCheck {
    /// Stock at the start.
    pub initial_stock: i64,
    /// Stock at the end.
    pub remaining_stock: i64,
    /// The lowest stock ever written.
    pub min_stock: i64,
    /// Order rows.
    pub orders: i64,
    /// Users holding two or more orders.
    pub users_with_two_orders: i64,
    /// Orders beyond one per user.
    pub duplicate_orders: i64,
    /// Orders beyond the initial stock.
    pub oversold: i64,
    /// Invariant 1: stock never below 0.
    pub stock_never_negative: bool,
    /// Invariant 2: no user with two orders.
    pub one_order_per_user: bool,
    /// Invariant 3: orders = initial stock - remaining stock.
    pub orders_match_stock: bool,
}

impl CouponCheck {
    /// All three invariants hold.
    pub fn valid(&self) -> bool {
        self.stock_never_negative && self.one_order_per_user && self.orders_match_stock
    }
}

// ---- Redis pre-deduct baseline -------------------------------------------

/// The seed's final design: one Lua script checks the user set and the
/// stock, pre-deducts and queues the order on a stream; PostgreSQL gets the
/// order later from a consumer.
const PREDEDUCT: &str = r#"
if redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 1 then return 2 end
local s = tonumber(redis.call('GET', KEYS[1]) or '0')
if s <= 0 then return 1 end
redis.call('DECR', KEYS[1])
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('XADD', KEYS[3], '*', 'user', ARGV[1], 'ns', ARGV[2])
return 0
"#;

/// The pre-deduct baseline's Redis keys for a run (one hash slot).
#[derive(Debug, Clone)]
pub struct PredeductKeys {
    stock: String,
    users: String,
    stream: String,
}

impl PredeductKeys {
    /// Keys under the run's key.
    pub fn new(key: &str) -> Self {
        Self {
            stock: format!("{{{key}}}:stock"),
            users: format!("{{{key}}}:users"),
            stream: format!("{{{key}}}:orders"),
        }
    }
}

/// Opens a Redis connection for the baseline.
///
/// # Errors
/// Bad URL or unreachable server.
pub async fn redis_connect(url: &str) -> Result<redis::aio::MultiplexedConnection, DataError> {
    let client = redis::Client::open(url).map_err(red("parsing the data redis URL"))?;
    let cfg = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(3)))
        .set_response_timeout(Some(Duration::from_secs(5)));
    client
        .get_multiplexed_async_connection_with_config(&cfg)
        .await
        .map_err(red("connecting to the data redis"))
}

/// Sets the Redis stock and clears the user set and stream.
///
/// # Errors
/// Redis failures.
pub async fn prepare_prededuct(
    url: &str,
    keys: &PredeductKeys,
    stock: u32,
) -> Result<(), DataError> {
    let mut con = redis_connect(url).await?;
    redis::pipe()
        .atomic()
        .del(&keys.users)
        .del(&keys.stream)
        .set(&keys.stock, stock)
        .exec_async(&mut con)
        .await
        .map_err(red("setting the stock"))
}

/// One click through the pre-deduct script.
///
/// # Errors
/// Redis failures.
pub async fn prededuct_click(
    con: &mut redis::aio::MultiplexedConnection,
    keys: &PredeductKeys,
    user: u64,
) -> Result<Click, DataError> {
    let r: i64 = redis::Script::new(PREDEDUCT)
        .key(&keys.stock)
        .key(&keys.users)
        .key(&keys.stream)
        .arg(user)
        .arg(crate::history::monotonic_ns())
        .invoke_async(con)
        .await
        .map_err(red("running the pre-deduct script"))?;
    Ok(match r {
        0 => Click::Ordered,
        2 => Click::Duplicate,
        _ => Click::SoldOut,
    })
}

/// What the stream consumer did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ConsumerStats {
    /// Stream entries read.
    pub read: u64,
    /// Orders written to PostgreSQL.
    pub written: u64,
    /// Entries PostgreSQL refused (unique index or no stock).
    pub refused: u64,
    /// CLOCK_MONOTONIC ns when the last order was written.
    pub last_write_ns: u64,
}

/// Reads the order stream from the start and writes each order into
/// PostgreSQL (guarded decrement + insert, the unique index as the last
/// line of defence), until `stop` is set and the stream is drained.
///
/// # Errors
/// Redis or SQL failures.
pub async fn consume_orders(
    url: &str,
    keys: &PredeductKeys,
    db: &DataDb,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Result<ConsumerStats, DataError> {
    let mut con = redis_connect(url).await?;
    let mut stats = ConsumerStats::default();
    let mut last_id = "0-0".to_string();
    loop {
        let stopping = *stop.borrow();
        let reply: redis::streams::StreamReadReply = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(256)
            .arg("BLOCK")
            .arg(50)
            .arg("STREAMS")
            .arg(&keys.stream)
            .arg(&last_id)
            .query_async(&mut con)
            .await
            .map_err(red("reading the order stream"))?;
        let mut got = 0;
        for k in reply.keys {
            for entry in k.ids {
                got += 1;
                stats.read += 1;
                last_id = entry.id.clone();
                let user: u64 = entry.get("user").unwrap_or(0);
                match db.order_atomic(user).await? {
                    Click::Ordered => {
                        stats.written += 1;
                        stats.last_write_ns = crate::history::monotonic_ns();
                    }
                    Click::Duplicate | Click::SoldOut => stats.refused += 1,
                }
            }
        }
        if got == 0 && stopping {
            return Ok(stats);
        }
    }
}

/// Whether the strategy takes the lock under test.
pub fn uses_lock(plan: &CouponPlan) -> bool {
    plan.strategy == Strategy::Lock
}

/// Whether the lock is released before COMMIT (the seed's bug).
pub fn unlocks_first(plan: &CouponPlan) -> bool {
    plan.ordering == Ordering::UnlockThenCommit
}
