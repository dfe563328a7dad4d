//! The seed's final design as a lock-free baseline: Redis pre-deducts the
//! stock and queues the order on a stream, and a consumer writes the orders
//! into PostgreSQL afterwards.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::coupon::Click;
use super::{red, DataDb, DataError};

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

/// Opens a Redis connection for the baseline: one that reconnects after
/// the server restarts (a plain multiplexed connection stayed broken, and
/// every click after a 0.2 s restart failed).
///
/// # Errors
/// Bad URL or unreachable server.
pub async fn redis_connect(url: &str) -> Result<redis::aio::ConnectionManager, DataError> {
    let client = redis::Client::open(url).map_err(red("parsing the data redis URL"))?;
    let cfg = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(3)))
        .set_response_timeout(Some(Duration::from_secs(5)))
        .set_number_of_retries(3)
        .set_max_delay(Duration::from_millis(500));
    client
        .get_connection_manager_with_config(cfg)
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
    con: &mut redis::aio::ConnectionManager,
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
    /// Reads of the stream that failed and were tried again (Redis
    /// restarting or stalled).
    #[serde(default)]
    pub read_errors: u64,
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
        let read: Result<redis::streams::StreamReadReply, _> = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(256)
            .arg("BLOCK")
            .arg(50)
            .arg("STREAMS")
            .arg(&keys.stream)
            .arg(&last_id)
            .query_async(&mut con)
            .await;
        // Redis restarting or stalled: the consumer waits for it (it ended
        // at the first error, and the run with it) until the run stops; it
        // reads on from the last entry it wrote.
        let reply = match read {
            Ok(r) => r,
            Err(e) if !stopping => {
                tracing::warn!(error = %e, "reading the order stream failed; trying again");
                stats.read_errors += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(e) => return Err(red("reading the order stream")(e)),
        };
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
