//! The ledger workload's data: a counter every critical section
//! increments by read-sleep-write (lost updates show an overlap) and a
//! fenced ledger that accepts only increasing tokens (stale writes show a
//! holder that had lost the lock).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, Row};

use super::{sql, DataDb, DataError};

impl DataDb {
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
    stale boolean NOT NULL, db_enter_us bigint, db_exit_us bigint);
CREATE OR REPLACE FUNCTION {s}.cs_write(k text, v bigint, tok bigint, acq bigint, w int,
    entered_us bigint)
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
  INSERT INTO {s}.ledger_log (key, worker, token, acq_ns, accepted, stale, db_enter_us,
      db_exit_us)
    VALUES (k, w, tok, acq, ok, is_stale, entered_us,
      (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
  RETURN ok;
END $$;
"#
            ),
        )
        .await?;
        // A run id used before (`--run` again) starts from nothing: its
        // old rows were counted into the new verdict (a correct lock's
        // run read "stale writes accepted").
        for q in [
            format!("DELETE FROM {s}.ledger_log WHERE key = $1"),
            format!(
                "INSERT INTO {s}.counter VALUES ($1, 0) ON CONFLICT (key) DO UPDATE SET value = 0"
            ),
            format!(
                "INSERT INTO {s}.ledger (key) VALUES ($1) ON CONFLICT (key) \
                 DO UPDATE SET last_token = NULL, newest_acq_ns = 0"
            ),
        ] {
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
    /// The database stamps the section too: `clock_timestamp()` when the
    /// read runs (after the acquire returned) and when the write runs
    /// (before the release is sent). Both stamps come from the one
    /// database clock, so two sections whose stamped intervals intersect
    /// overlapped whatever the workers' hosts' clocks say. `by_db_clock`:
    /// tell stale writes by the database's entry stamp (workers on several
    /// hosts) rather than by `acquired_ns`.
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
        by_db_clock: bool,
    ) -> Result<bool, DataError> {
        let s = &self.schema;
        let (v, entered_us): (i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT value, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
             FROM {s}.counter WHERE key = $1"
        )))
        .bind(key)
        .fetch_one(&self.pool)
        .await
        .map_err(sql("reading the counter"))?;
        if !hold.is_zero() {
            tokio::time::sleep(hold).await;
        }
        let tok = token.map(|t| i64::try_from(t).unwrap_or(i64::MAX));
        // A write is stale when a later section has written already:
        // "later" by the acquire's completion on the hosts' one clock, or,
        // when the workers' hosts share no clock, by the database's stamp
        // of the section's entry.
        let acq = if by_db_clock {
            entered_us.saturating_mul(1000)
        } else {
            i64::try_from(acquired_ns).unwrap_or(i64::MAX)
        };
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT {s}.cs_write($1, $2, $3, $4, $5, $6)"
        )))
        .bind(key)
        .bind(v + 1)
        .bind(tok)
        .bind(acq)
        .bind(i32::try_from(worker).unwrap_or(i32::MAX))
        .bind(entered_us)
        .fetch_one(&self.pool)
        .await
        .map_err(sql("writing the counter and the ledger"))
    }

    /// The check that needs no shared clock: sections of `key` whose
    /// database-stamped intervals intersect (touching ends do not).
    ///
    /// # Errors
    /// SQL failures.
    pub async fn check_db_clock(&self, key: &str) -> Result<DbClockCheck, DataError> {
        let s = &self.schema;
        // Ordered by entry, a section overlaps an earlier one exactly when
        // it entered before the latest exit among those before it: one pass,
        // not a self-join over every pair.
        let (sections, violations, max_us): (i64, i64, i64) =
            sqlx::query_as(AssertSqlSafe(format!(
                "SELECT count(*), count(*) FILTER (WHERE db_enter_us < prev_exit),
                        coalesce(max(LEAST(prev_exit, db_exit_us) - db_enter_us)
                                 FILTER (WHERE db_enter_us < prev_exit), 0)::bigint
                 FROM (SELECT db_enter_us, db_exit_us,
                              max(db_exit_us) OVER (ORDER BY db_enter_us, id
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_exit
                       FROM {s}.ledger_log WHERE key = $1 AND db_enter_us IS NOT NULL) t"
            )))
            .bind(key)
            .fetch_one(&self.pool)
            .await
            .map_err(sql("checking the sections' database stamps"))?;
        let u = |v: i64| u64::try_from(v).unwrap_or(0);
        Ok(DbClockCheck {
            sections: u(sections),
            violations: u(violations),
            max_overlap_ms: u(max_us) as f64 / 1000.0,
        })
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
                    count(*) FILTER (WHERE stale AND accepted), count(*) FILTER (WHERE stale),
                    count(*) FILTER (WHERE NOT stale AND NOT accepted)
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
        let db_clock = self.check_db_clock(key).await?;
        let acknowledged = n(0)?;
        let counter_final = u64::try_from(counter).unwrap_or(0);
        let stale_writes_accepted = n(3)?;
        let current_writes_rejected = n(5)?;
        let lost_updates = acknowledged.saturating_sub(counter_final);
        Ok(LedgerReport {
            fenceable,
            writes: acknowledged,
            accepted: n(1)?,
            rejected: n(2)?,
            stale_writes_accepted,
            stale_writes_unfenced: n(4)?,
            current_writes_rejected,
            acknowledged,
            counter_final,
            lost_updates,
            db_clock: Some(db_clock),
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
    /// Writes the fence refused though no later acquisition had written
    /// yet: a token not above an earlier holder's. Tokens that went
    /// backwards (a crash that lost the counter) show here, and so does a
    /// holder whose acquire reply came after a later holder's (its write
    /// is then stale by grant, not by the order the replies came in): the
    /// history's `token_regressions` tells the two apart. 0 in results
    /// from before.
    #[serde(default)]
    pub current_writes_rejected: u64,
    /// Critical sections whose counter write was acknowledged.
    pub acknowledged: u64,
    /// The counter at the end.
    pub counter_final: u64,
    /// acknowledged - counter_final: increments lost to an overlapping
    /// read-modify-write.
    pub lost_updates: u64,
    /// Overlapping sections by the database's own clock (no shared clock
    /// between the workers needed). `None` in results from before it.
    #[serde(default)]
    pub db_clock: Option<DbClockCheck>,
    /// `ok`, `lost updates`, `stale writes accepted` or `unfenceable`
    /// (the resource's verdict: overlapping holders whose writes fencing
    /// refused leave it `ok`; [`LedgerReport::db_clock`] counts them).
    pub verdict: String,
}

/// The database-clock check of the ledger's critical sections.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DbClockCheck {
    /// Sections stamped (one per acknowledged write).
    pub sections: u64,
    /// Sections that entered before an earlier-entered one had left: each
    /// a proven double holding.
    pub violations: u64,
    /// The longest such overlap, in milliseconds.
    pub max_overlap_ms: f64,
}
