//! Runs whose workers live on several hosts. No process spawns the others
//! and no clock is shared: the run's PostgreSQL (the one that holds the
//! ledger) is the meeting point. The coordinator writes the run's row;
//! each `lockbench worker --run ID` claims a shard, starts its share of the
//! workers locally, says it is ready, waits for the coordinator's "go",
//! beats while it runs and writes its history there at the end.
//!
//! The plan stored in the database carries no secrets (the backend's
//! settings are redacted, the data URL dropped): each worker reads its
//! endpoints from its own `--config`, as a host of a real fleet would.
//!
//! Timestamps in a worker's history are its own host's CLOCK_MONOTONIC
//! and are compared only within that host; across hosts the ledger's
//! database stamps decide (see `data::LedgerReport::db_clock`).

use std::ops::Range;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Row};

use crate::coordinator::{RunOutput, WorkerDeath};
use crate::history::Event;
use crate::spec::RunPlan;
use crate::HarnessError;

/// How often a worker host says it is alive while the run goes.
pub const BEAT: Duration = Duration::from_millis(500);

/// How long a host may stay silent before the coordinator records it as
/// dead: ten missed beats (a SIGSTOPped or cut-off host looks the same).
pub const SILENT_AFTER: Duration = Duration::from_secs(5);

/// How often both sides look at the store while they wait.
const POLL: Duration = Duration::from_millis(50);

/// A join's conflict clause: a shard already taken is taken over only from
/// a host silent for longer than `SILENT_AFTER` (bound last) and only
/// before go; anything else stays with its host.
const TAKE_OVER: &str = "ON CONFLICT (run_id, shard) DO UPDATE
    SET host = EXCLUDED.host, pid = EXCLUDED.pid, joined_at = now(), ready_at = NULL,
        seen_at = now(), error = NULL
    WHERE now() - lockbench_hosts.members.seen_at > make_interval(secs => $5)
      AND NOT EXISTS (SELECT 1 FROM lockbench_hosts.runs r
                      WHERE r.run_id = lockbench_hosts.members.run_id AND r.go_at IS NOT NULL)";

/// `--shard I/N`: this host is shard I of N.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This host's index, 0-based.
    pub index: u32,
    /// How many hosts the run has.
    pub of: u32,
}

impl std::str::FromStr for Shard {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("--shard {s:?}: give I/N with 0 <= I < N, e.g. 0/2");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let index: u32 = i.trim().parse().map_err(|_| bad())?;
        let of: u32 = n.trim().parse().map_err(|_| bad())?;
        if of == 0 || index >= of {
            return Err(bad());
        }
        Ok(Shard { index, of })
    }
}

/// The worker ids shard `shard` of `hosts` runs, out of `workers` in all:
/// consecutive, and every id on exactly one host.
pub fn shard_workers(shard: u32, hosts: u32, workers: u32) -> Range<u32> {
    let at = |s: u32| {
        u32::try_from(u64::from(s) * u64::from(workers) / u64::from(hosts.max(1)))
            .unwrap_or(u32::MAX)
    };
    at(shard)..at(shard + 1)
}

/// What a host reports when its workers are done.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct HostReport {
    /// Workload counters, summed over its workers.
    pub counters: std::collections::BTreeMap<String, u64>,
    /// Workload time marks (its own clock).
    pub marks: std::collections::BTreeMap<String, u64>,
    /// Whether a worker stopped on its time limit.
    pub timed_out: bool,
    /// From its "go" to its last worker's end.
    pub wall_ms: u64,
    /// Its workers that died (its own clock).
    pub deaths: Vec<WorkerDeath>,
}

/// One host of a run, as the coordinator sees it at the end.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostOutcome {
    /// Its shard.
    pub shard: u32,
    /// The host name it gave.
    pub host: String,
    /// Its `lockbench worker` process id (on that host).
    pub pid: i64,
    /// Its worker ids.
    pub workers: Vec<u32>,
    /// `done`, `failed` (it said why) or `silent` (it stopped beating).
    pub state: String,
    /// Why it failed or went silent.
    pub message: Option<String>,
    /// What it said of itself besides (its lock settings differ from the
    /// coordinator's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Its report, when it finished.
    #[serde(skip)]
    pub report: Option<HostReport>,
    /// Its history, when it finished (its own clock).
    #[serde(skip)]
    pub history: Vec<Event>,
}

/// What the summary says of a run across hosts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostsRecord {
    /// The run's id, as the hosts joined it.
    pub run_id: String,
    /// Every host: its shard, name, pid, workers and how it ended.
    pub members: Vec<HostOutcome>,
    /// The overlap check within each host, on its own clock, merged: the
    /// run's `violations`.
    pub per_host: crate::checker::OverlapReport,
    /// The same checker over every host's stamps at once, as if the hosts
    /// shared a clock. They do not: kept to show what that check would
    /// have claimed, never a verdict.
    pub naive_cross_host_violations: u64,
}

/// The coordination tables in the run's PostgreSQL.
#[derive(Debug, Clone)]
pub struct RunStore {
    pool: PgPool,
    /// A host's own (name, pid) once it joined: its updates touch its
    /// shard's row only while the row is still its own (another host may
    /// have taken the shard over while it was silent).
    me: std::sync::Arc<std::sync::Mutex<Option<(String, i64)>>>,
}

fn db(what: &'static str) -> impl FnOnce(sqlx::Error) -> HarnessError {
    move |e| HarnessError::Hosts(format!("{what}: {e}"))
}

fn hosts_err(m: impl Into<String>) -> HarnessError {
    HarnessError::Hosts(m.into())
}

impl RunStore {
    /// Connects to the run's PostgreSQL and makes sure the tables exist.
    ///
    /// # Errors
    /// An unreachable server or a bad URL (named, password hidden).
    pub async fn connect(url: &str) -> Result<Self, HarnessError> {
        let shown = distlock::redact_url(url);
        let opts: sqlx::postgres::PgConnectOptions = url
            .parse()
            .map_err(|e| hosts_err(format!("the run's PostgreSQL {shown}: {e}")))?;
        let host = distlock::bare_host(opts.get_host()).to_owned();
        let opts = opts.host(&host);
        let pool = match PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(opts.clone())
            .await
        {
            Ok(p) => p,
            Err(e) => {
                let why = crate::data::why_not_connected(&opts, e).await;
                return Err(hosts_err(format!("the run's PostgreSQL {shown}: {why}")));
            }
        };
        // Two hosts may create the tables at once: one transaction-level
        // advisory lock makes the DDL run once at a time.
        let mut tx = pool.begin().await.map_err(db("creating the run tables"))?;
        sqlx::query("SELECT pg_advisory_xact_lock(7406611)")
            .execute(&mut *tx)
            .await
            .map_err(db("creating the run tables"))?;
        sqlx::raw_sql(
            r"
CREATE SCHEMA IF NOT EXISTS lockbench_hosts;
CREATE TABLE IF NOT EXISTS lockbench_hosts.runs (
    run_id text PRIMARY KEY, hosts int NOT NULL, plan text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(), go_at timestamptz,
    ended_at timestamptz);
CREATE TABLE IF NOT EXISTS lockbench_hosts.members (
    run_id text NOT NULL REFERENCES lockbench_hosts.runs, shard int NOT NULL,
    host text NOT NULL, pid bigint NOT NULL, joined_at timestamptz NOT NULL DEFAULT now(),
    ready_at timestamptz, seen_at timestamptz NOT NULL DEFAULT now(), done_at timestamptz,
    error text, report text, history text, PRIMARY KEY (run_id, shard));
ALTER TABLE lockbench_hosts.runs ADD COLUMN IF NOT EXISTS seen_at timestamptz;
ALTER TABLE lockbench_hosts.members ADD COLUMN IF NOT EXISTS note text;
",
        )
        .execute(&mut *tx)
        .await
        .map_err(db("creating the run tables"))?;
        tx.commit().await.map_err(db("creating the run tables"))?;
        Ok(Self {
            pool,
            me: Default::default(),
        })
    }

    /// The coordinator opens run `run_id` for `hosts` hosts.
    ///
    /// # Errors
    /// A run of that id exists already (named: pick another `--run`).
    pub async fn create_run(
        &self,
        run_id: &str,
        hosts: u32,
        plan: &RunPlan,
    ) -> Result<(), HarnessError> {
        let plan = serde_json::to_string(plan).map_err(|e| hosts_err(e.to_string()))?;
        let hosts = i32::try_from(hosts).map_err(|_| hosts_err("--hosts is too large"))?;
        let r = sqlx::query(
            "INSERT INTO lockbench_hosts.runs (run_id, hosts, plan) VALUES ($1, $2, $3)
             ON CONFLICT DO NOTHING",
        )
        .bind(run_id)
        .bind(hosts)
        .bind(plan)
        .execute(&self.pool)
        .await
        .map_err(db("creating the run"))?;
        if r.rows_affected() == 0 {
            return Err(hosts_err(format!(
                "--run {run_id}: a run of that id exists already in this database; give a new one"
            )));
        }
        Ok(())
    }

    /// A worker host joins run `run_id`, waiting up to `wait` for the
    /// coordinator to open it; takes `shard` or the lowest free one.
    /// Returns (its shard, the number of hosts, the stored plan).
    ///
    /// # Errors
    /// No such run within `wait`, a shard that does not fit the run, a run
    /// whose shards are all taken or that has begun.
    pub async fn join(
        &self,
        run_id: &str,
        shard: Option<Shard>,
        host: &str,
        pid: u32,
        wait: Duration,
    ) -> Result<(u32, u32, RunPlan), HarnessError> {
        let t0 = Instant::now();
        let (hosts, plan, begun) = loop {
            let row = sqlx::query(
                "SELECT hosts, plan, go_at IS NOT NULL FROM lockbench_hosts.runs WHERE run_id = $1",
            )
            .bind(run_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(db("looking for the run"))?;
            if let Some(r) = row {
                let hosts: i32 = r.try_get(0).map_err(db("reading the run"))?;
                let plan: String = r.try_get(1).map_err(db("reading the run"))?;
                let begun: bool = r.try_get(2).map_err(db("reading the run"))?;
                break (hosts, plan, begun);
            }
            if t0.elapsed() >= wait {
                return Err(hosts_err(format!(
                    "--run {run_id}: no such run was opened within {} s; start `lockbench run --hosts N --run {run_id}` first, against the same PostgreSQL",
                    wait.as_secs()
                )));
            }
            tokio::time::sleep(POLL * 4).await;
        };
        if begun {
            return Err(hosts_err(format!(
                "--run {run_id}: the run has begun already; a late host cannot join it"
            )));
        }
        let hosts_u = u32::try_from(hosts).unwrap_or(0);
        let plan: RunPlan =
            serde_json::from_str(&plan).map_err(|e| hosts_err(format!("the run's plan: {e}")))?;
        let pid = i64::from(pid);
        let claimed: Option<i32> = match shard {
            Some(s) => {
                if s.of != hosts_u {
                    return Err(hosts_err(format!(
                        "--shard {}/{}: run {run_id} has {hosts} hosts, not {}",
                        s.index, s.of, s.of
                    )));
                }
                let idx = i32::try_from(s.index).unwrap_or(i32::MAX);
                sqlx::query_scalar(AssertSqlSafe(format!(
                    "INSERT INTO lockbench_hosts.members (run_id, shard, host, pid)
                     VALUES ($1, $2, $3, $4) {TAKE_OVER} RETURNING shard"
                )))
                .bind(run_id)
                .bind(idx)
                .bind(host)
                .bind(pid)
                .bind(SILENT_AFTER.as_secs_f64())
                .fetch_optional(&self.pool)
                .await
                .map_err(db("joining the run"))?
            }
            None => {
                // Two hosts may race for the same free shard: the loser's
                // insert does nothing and it tries the next one.
                let mut got = None;
                for _ in 0..hosts.max(1) {
                    got = sqlx::query_scalar(
                        "INSERT INTO lockbench_hosts.members (run_id, shard, host, pid)
                         SELECT $1, s, $3, $4 FROM generate_series(0, $2 - 1) s
                         WHERE s NOT IN (SELECT shard FROM lockbench_hosts.members WHERE run_id = $1)
                         ORDER BY s LIMIT 1 ON CONFLICT DO NOTHING RETURNING shard",
                    )
                    .bind(run_id)
                    .bind(hosts)
                    .bind(host)
                    .bind(pid)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(db("joining the run"))?;
                    if got.is_some() {
                        break;
                    }
                }
                // None free: the shard of a host that went silent before
                // go (killed while it waited) is taken over, so its
                // replacement, a restarted pod, is let in.
                if got.is_none() {
                    got = sqlx::query_scalar(AssertSqlSafe(format!(
                        "INSERT INTO lockbench_hosts.members (run_id, shard, host, pid)
                         SELECT $1, shard, $2, $3 FROM lockbench_hosts.members
                         WHERE run_id = $1 AND now() - seen_at > make_interval(secs => $4)
                         ORDER BY shard LIMIT 1
                         {TAKE_OVER} RETURNING shard"
                    )))
                    .bind(run_id)
                    .bind(host)
                    .bind(pid)
                    .bind(SILENT_AFTER.as_secs_f64())
                    .bind(SILENT_AFTER.as_secs_f64())
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(db("joining the run"))?;
                }
                got
            }
        };
        let Some(shard) = claimed else {
            let taken = match shard {
                Some(s) => format!("shard {} is taken by another host", s.index),
                None => format!("all {hosts} shards are taken"),
            };
            return Err(hosts_err(format!("--run {run_id}: {taken}")));
        };
        if let Ok(mut me) = self.me.lock() {
            *me = Some((host.to_string(), pid));
        }
        Ok((u32::try_from(shard).unwrap_or(0), hosts_u, plan))
    }

    /// (name, pid) this store joined as; an empty name (matching no row)
    /// before a join.
    fn me(&self) -> (String, i64) {
        self.me
            .lock()
            .ok()
            .and_then(|m| m.clone())
            .unwrap_or_default()
    }

    /// The error of a host whose shard another host took over.
    fn taken_over(run_id: &str, shard: u32) -> HarnessError {
        hosts_err(format!(
            "--run {run_id}: shard {shard} was taken over by another host while this one was silent (over {} s before go)",
            SILENT_AFTER.as_secs()
        ))
    }

    /// This host's workers are connected and waiting.
    ///
    /// # Errors
    /// SQL failures.
    pub async fn ready(&self, run_id: &str, shard: u32) -> Result<(), HarnessError> {
        self.member_update(
            "UPDATE lockbench_hosts.members SET ready_at = now(), seen_at = now()
             WHERE run_id = $1 AND shard = $2",
            run_id,
            shard,
        )
        .await
    }

    /// Waits for the coordinator's "go".
    ///
    /// # Errors
    /// No go within `wait`, or the run ended without one.
    pub async fn wait_go(
        &self,
        run_id: &str,
        shard: u32,
        wait: Duration,
    ) -> Result<(), HarnessError> {
        let (host, pid) = self.me();
        let t0 = Instant::now();
        let (mut responsive_since, mut last_ok) = (t0, t0);
        loop {
            if last_ok.elapsed() > BEAT * 2 {
                responsive_since = Instant::now();
            }
            last_ok = Instant::now();
            let r = sqlx::query(
                "SELECT go_at IS NOT NULL,
                        EXISTS (SELECT 1 FROM lockbench_hosts.members
                                WHERE run_id = $1 AND shard = $2 AND host = $3 AND pid = $4)
                 FROM lockbench_hosts.runs WHERE run_id = $1",
            )
            .bind(run_id)
            .bind(i32::try_from(shard).unwrap_or(i32::MAX))
            .bind(&host)
            .bind(pid)
            .fetch_one(&self.pool)
            .await
            .map_err(db("waiting for go"))?;
            let go: bool = r.try_get(0).map_err(db("waiting for go"))?;
            let mine: bool = r.try_get(1).map_err(db("waiting for go"))?;
            // Silent for long enough (a SIGSTOP, a sleeping laptop), its
            // shard went to another host: running it too would double it.
            if !mine {
                return Err(Self::taken_over(run_id, shard));
            }
            if go {
                return Ok(());
            }
            if let Some(why) = self.run_over(run_id, responsive_since).await? {
                return Err(hosts_err(format!("--run {run_id}: {why} before it began")));
            }
            if t0.elapsed() >= wait {
                return Err(hosts_err(format!(
                    "--run {run_id}: no go from the coordinator within {} s",
                    wait.as_secs()
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// This host is alive.
    ///
    /// # Errors
    /// SQL failures.
    pub async fn beat(&self, run_id: &str, shard: u32) -> Result<(), HarnessError> {
        self.member_update(
            "UPDATE lockbench_hosts.members SET seen_at = now() WHERE run_id = $1 AND shard = $2",
            run_id,
            shard,
        )
        .await
    }

    /// The coordinator is alive.
    ///
    /// # Errors
    /// SQL failures.
    pub async fn beat_run(&self, run_id: &str) -> Result<(), HarnessError> {
        sqlx::query("UPDATE lockbench_hosts.runs SET seen_at = now() WHERE run_id = $1")
            .bind(run_id)
            .execute(&self.pool)
            .await
            .map_err(db("beating for the run"))?;
        Ok(())
    }

    /// Why a host should stop: the coordinator ended the run, or has not
    /// beaten for [`SILENT_AFTER`] (killed, interrupted, cut off) while
    /// this store answered us without a break since `responsive_since`:
    /// after a stall of the database itself every beat is late, and that
    /// is nobody's silence. `None` while the run goes on.
    ///
    /// # Errors
    /// SQL failures.
    pub async fn run_over(
        &self,
        run_id: &str,
        responsive_since: Instant,
    ) -> Result<Option<String>, HarnessError> {
        let r = sqlx::query(
            "SELECT ended_at IS NOT NULL,
                    coalesce(now() - seen_at > make_interval(secs => $2), false)
             FROM lockbench_hosts.runs WHERE run_id = $1",
        )
        .bind(run_id)
        .bind(SILENT_AFTER.as_secs_f64())
        .fetch_one(&self.pool)
        .await
        .map_err(db("looking at the run"))?;
        let ended: bool = r.try_get(0).map_err(db("looking at the run"))?;
        let silent: bool = r.try_get(1).map_err(db("looking at the run"))?;
        Ok(if ended {
            Some("the coordinator ended the run".into())
        } else if silent && responsive_since.elapsed() >= SILENT_AFTER {
            Some(format!(
                "the coordinator stopped reporting (no beat for {} s: killed, interrupted or cut off)",
                SILENT_AFTER.as_secs()
            ))
        } else {
            None
        })
    }

    /// This host's workers are done: its history and report.
    ///
    /// # Errors
    /// SQL failures.
    pub async fn finish(
        &self,
        run_id: &str,
        shard: u32,
        out: &RunOutput,
    ) -> Result<(), HarnessError> {
        let mut text = Vec::new();
        crate::history::write_jsonl(&mut text, &out.history)
            .map_err(|e| hosts_err(e.to_string()))?;
        let text = String::from_utf8(text).map_err(|e| hosts_err(e.to_string()))?;
        let report = HostReport {
            counters: out.counters.clone(),
            marks: out.marks.clone(),
            timed_out: out.timed_out,
            wall_ms: distlock::millis(out.wall),
            deaths: out.deaths.clone(),
        };
        let report = serde_json::to_string(&report).map_err(|e| hosts_err(e.to_string()))?;
        let r = sqlx::query(
            "UPDATE lockbench_hosts.members SET done_at = now(), seen_at = now(), report = $3, history = $4
             WHERE run_id = $1 AND shard = $2 AND host = $5 AND pid = $6
               AND NOT EXISTS (SELECT 1 FROM lockbench_hosts.runs
                               WHERE run_id = $1 AND ended_at IS NOT NULL)",
        )
        .bind(run_id)
        .bind(i32::try_from(shard).unwrap_or(i32::MAX))
        .bind(report)
        .bind(text)
        .bind(self.me().0)
        .bind(self.me().1)
        .execute(&self.pool)
        .await
        .map_err(db("writing this host's history"))?;
        if r.rows_affected() == 0 {
            return Err(hosts_err(format!(
                "--run {run_id}: the run ended before this host finished (the coordinator gave up on it), or another host took its shard: its history was not collected"
            )));
        }
        Ok(())
    }

    /// Something the coordinator should say of this host besides how it
    /// ended.
    ///
    /// # Errors
    /// SQL failures, or a shard no longer this host's.
    pub async fn note(&self, run_id: &str, shard: u32, text: &str) -> Result<(), HarnessError> {
        let (host, pid) = self.me();
        sqlx::query(
            "UPDATE lockbench_hosts.members SET note = $3
             WHERE run_id = $1 AND shard = $2 AND host = $4 AND pid = $5",
        )
        .bind(run_id)
        .bind(i32::try_from(shard).unwrap_or(i32::MAX))
        .bind(text)
        .bind(host)
        .bind(pid)
        .execute(&self.pool)
        .await
        .map_err(db("noting this host's settings"))?;
        Ok(())
    }

    /// This host gave up: `message` says why.
    ///
    /// # Errors
    /// SQL failures.
    pub async fn fail(&self, run_id: &str, shard: u32, message: &str) -> Result<(), HarnessError> {
        let (host, pid) = self.me();
        sqlx::query(
            "UPDATE lockbench_hosts.members SET error = $3, seen_at = now()
             WHERE run_id = $1 AND shard = $2 AND host = $4 AND pid = $5",
        )
        .bind(run_id)
        .bind(i32::try_from(shard).unwrap_or(i32::MAX))
        .bind(message)
        .bind(host)
        .bind(pid)
        .execute(&self.pool)
        .await
        .map_err(db("recording this host's failure"))?;
        Ok(())
    }

    async fn member_update(&self, q: &str, run_id: &str, shard: u32) -> Result<(), HarnessError> {
        let (host, pid) = self.me();
        let r = sqlx::query(sqlx::AssertSqlSafe(format!(
            "{q} AND host = $3 AND pid = $4"
        )))
        .bind(run_id)
        .bind(i32::try_from(shard).unwrap_or(i32::MAX))
        .bind(host)
        .bind(pid)
        .execute(&self.pool)
        .await
        .map_err(db("updating this host's row"))?;
        if r.rows_affected() == 0 {
            return Err(Self::taken_over(run_id, shard));
        }
        Ok(())
    }

    /// The coordinator waits up to `wait` for all `hosts` hosts to be
    /// ready; `on_join` hears how many are.
    ///
    /// # Errors
    /// Hosts missing at the deadline (naming the shards that did not come
    /// and the hosts that did), or a host that failed while getting ready.
    pub async fn wait_ready(
        &self,
        run_id: &str,
        hosts: u32,
        wait: Duration,
        mut on_join: impl FnMut(u32),
    ) -> Result<(), HarnessError> {
        let t0 = Instant::now();
        loop {
            self.beat_run(run_id).await?;
            let rows = sqlx::query(
                "SELECT shard, host, ready_at IS NOT NULL, error,
                        now() - seen_at > make_interval(secs => $2)
                 FROM lockbench_hosts.members WHERE run_id = $1 ORDER BY shard",
            )
            .bind(run_id)
            .bind(SILENT_AFTER.as_secs_f64())
            .fetch_all(&self.pool)
            .await
            .map_err(db("waiting for the hosts"))?;
            let mut ready = Vec::new();
            let mut joined = Vec::new();
            for r in &rows {
                let shard: i32 = r.try_get(0).map_err(db("reading the hosts"))?;
                let host: String = r.try_get(1).map_err(db("reading the hosts"))?;
                let is_ready: bool = r.try_get(2).map_err(db("reading the hosts"))?;
                let error: Option<String> = r.try_get(3).map_err(db("reading the hosts"))?;
                let silent: bool = r.try_get(4).map_err(db("reading the hosts"))?;
                if let Some(e) = error {
                    // The hosts that are ready would wait for a go that
                    // never comes.
                    self.end(run_id).await?;
                    return Err(hosts_err(format!(
                        "host {host} (shard {shard}) could not get ready: {e}"
                    )));
                }
                // A host that was ready and then stopped beating (killed
                // while it waited) is not: a go now would run without its
                // workers. Its shard is free for a replacement to take.
                if silent {
                    joined.push(format!(
                        "shard {shard} on {host} (silent: stopped reporting)"
                    ));
                    continue;
                }
                if is_ready {
                    ready.push(shard);
                }
                joined.push(format!("shard {shard} on {host}"));
            }
            on_join(u32::try_from(ready.len()).unwrap_or(0));
            if ready.len() >= hosts as usize && self.beating_since_now(run_id, ready.len()).await? {
                return Ok(());
            }
            if t0.elapsed() >= wait {
                let missing: Vec<String> = (0..i32::try_from(hosts).unwrap_or(0))
                    .filter(|s| !ready.contains(s))
                    .map(|s| s.to_string())
                    .collect();
                self.end(run_id).await?;
                return Err(hosts_err(format!(
                    "{} of {hosts} hosts ready within {} s; not ready: shard {} (joined: {}). Start `lockbench worker --run {run_id} --config FILE` on each host",
                    ready.len(),
                    wait.as_secs(),
                    missing.join(", "),
                    if joined.is_empty() { "none".to_string() } else { joined.join(", ") }
                )));
            }
            tokio::time::sleep(POLL * 2).await;
        }
    }

    /// Whether `ready` ready hosts all beat again after now (within three
    /// beats): a host killed while it waited is ready on paper until it
    /// has been silent for [`SILENT_AFTER`]; a go before then ran without
    /// its workers.
    async fn beating_since_now(&self, run_id: &str, ready: usize) -> Result<bool, HarnessError> {
        let now: String = sqlx::query_scalar("SELECT now()::text")
            .fetch_one(&self.pool)
            .await
            .map_err(db("reading the database's clock"))?;
        let t0 = Instant::now();
        while t0.elapsed() < BEAT * 3 {
            tokio::time::sleep(POLL * 2).await;
            let beating: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM lockbench_hosts.members
                 WHERE run_id = $1 AND ready_at IS NOT NULL AND error IS NULL
                   AND seen_at > $2::timestamptz",
            )
            .bind(run_id)
            .bind(&now)
            .fetch_one(&self.pool)
            .await
            .map_err(db("waiting for the hosts' beats"))?;
            if usize::try_from(beating).unwrap_or(0) >= ready {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Says "go" to every host.
    ///
    /// # Errors
    /// SQL failures.
    pub async fn go(&self, run_id: &str) -> Result<(), HarnessError> {
        sqlx::query("UPDATE lockbench_hosts.runs SET go_at = now() WHERE run_id = $1")
            .bind(run_id)
            .execute(&self.pool)
            .await
            .map_err(db("saying go"))?;
        Ok(())
    }

    /// Marks the run over (hosts still waiting for go give up).
    ///
    /// # Errors
    /// SQL failures.
    pub async fn end(&self, run_id: &str) -> Result<(), HarnessError> {
        sqlx::query("UPDATE lockbench_hosts.runs SET ended_at = now() WHERE run_id = $1")
            .bind(run_id)
            .execute(&self.pool)
            .await
            .map_err(db("ending the run"))?;
        Ok(())
    }

    /// Waits until every host has finished, failed or gone silent for
    /// [`SILENT_AFTER`] (by the database's clock), at most `limit`; then
    /// returns each host's outcome. `workers` is the run's worker count.
    ///
    /// # Errors
    /// SQL failures, or a history a host wrote that does not parse.
    pub async fn collect(
        &self,
        run_id: &str,
        hosts: u32,
        workers: u32,
        limit: Duration,
        mut on_done: impl FnMut(u32),
    ) -> Result<Vec<HostOutcome>, HarnessError> {
        let t0 = Instant::now();
        // Since when the store has answered every poll promptly: a host is
        // silent only if its beat is late while we could hear it.
        let mut responsive_since = Instant::now();
        let mut last_ok = Instant::now();
        loop {
            let polled = async {
                self.beat_run(run_id).await?;
                sqlx::query(
                    "SELECT shard, host, pid, done_at IS NOT NULL, error,
                            now() - seen_at > make_interval(secs => $2), seen_at::text, note
                     FROM lockbench_hosts.members WHERE run_id = $1 ORDER BY shard",
                )
                .bind(run_id)
                .bind(SILENT_AFTER.as_secs_f64())
                .fetch_all(&self.pool)
                .await
                .map_err(db("following the hosts"))
            }
            .await;
            let rows = match polled {
                Ok(rows) => rows,
                // A stalled or restarting database is waited through (the
                // hosts beat into it once it is back), up to the limit.
                Err(e) if t0.elapsed() < limit => {
                    tracing::warn!(error = %e, "the run's PostgreSQL did not answer; trying again");
                    responsive_since = Instant::now();
                    tokio::time::sleep(POLL * 4).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if last_ok.elapsed() > BEAT * 2 {
                responsive_since = Instant::now();
            }
            last_ok = Instant::now();
            let heard = responsive_since.elapsed() >= SILENT_AFTER;
            let over = t0.elapsed() >= limit;
            let mut settled = 0u32;
            let mut outcomes = Vec::new();
            for r in &rows {
                let shard: i32 = r.try_get(0).map_err(db("reading the hosts"))?;
                let host: String = r.try_get(1).map_err(db("reading the hosts"))?;
                let pid: i64 = r.try_get(2).map_err(db("reading the hosts"))?;
                let done: bool = r.try_get(3).map_err(db("reading the hosts"))?;
                let error: Option<String> = r.try_get(4).map_err(db("reading the hosts"))?;
                let silent = heard && r.try_get::<bool, _>(5).map_err(db("reading the hosts"))?;
                let seen: String = r.try_get(6).map_err(db("reading the hosts"))?;
                let note: Option<String> = r.try_get(7).map_err(db("reading the hosts"))?;
                let shard_u = u32::try_from(shard).unwrap_or(0);
                let (state, message) = if done {
                    ("done", None)
                } else if let Some(e) = error {
                    ("failed", Some(e))
                } else if silent {
                    (
                        "silent",
                        Some(format!(
                            "stopped reporting (last seen {seen}); its history is lost, the database checks still cover its sections"
                        )),
                    )
                } else if over {
                    (
                        "silent",
                        Some(format!("still running after {} s", limit.as_secs())),
                    )
                } else {
                    ("running", None)
                };
                if state != "running" {
                    settled += 1;
                }
                outcomes.push(HostOutcome {
                    shard: shard_u,
                    host,
                    pid,
                    workers: shard_workers(shard_u, hosts, workers).collect(),
                    state: state.to_string(),
                    message,
                    note,
                    report: None,
                    history: Vec::new(),
                });
            }
            on_done(settled);
            if settled >= hosts {
                self.end(run_id).await?;
                for o in outcomes.iter_mut().filter(|o| o.state == "done") {
                    let r = sqlx::query(
                        "SELECT report, history FROM lockbench_hosts.members WHERE run_id = $1 AND shard = $2",
                    )
                    .bind(run_id)
                    .bind(i32::try_from(o.shard).unwrap_or(i32::MAX))
                    .fetch_one(&self.pool)
                    .await
                    .map_err(db("reading a host's history"))?;
                    let report: Option<String> =
                        r.try_get(0).map_err(db("reading a host's history"))?;
                    let text: Option<String> =
                        r.try_get(1).map_err(db("reading a host's history"))?;
                    o.report =
                        match report {
                            Some(v) => Some(serde_json::from_str(&v).map_err(|e| {
                                hosts_err(format!("shard {}'s report: {e}", o.shard))
                            })?),
                            None => None,
                        };
                    let name = format!("shard {}'s history", o.shard);
                    o.history = crate::history::parse_jsonl(
                        std::io::Cursor::new(text.unwrap_or_default()),
                        &name,
                    )?;
                }
                return Ok(outcomes);
            }
            tokio::time::sleep(POLL * 2).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_split_the_workers_without_gap_or_overlap() {
        for hosts in 1..6 {
            for workers in hosts..20 {
                let all: Vec<u32> = (0..hosts)
                    .flat_map(|s| shard_workers(s, hosts, workers))
                    .collect();
                assert_eq!(
                    all,
                    (0..workers).collect::<Vec<_>>(),
                    "{hosts} hosts, {workers} workers"
                );
            }
        }
        assert_eq!(shard_workers(1, 2, 4), 2..4);
    }

    #[test]
    fn a_shard_is_i_of_n() {
        assert_eq!("1/2".parse::<Shard>(), Ok(Shard { index: 1, of: 2 }));
        for bad in ["2/2", "1", "a/2", "0/0", "-1/2"] {
            let e = bad.parse::<Shard>().unwrap_err();
            assert!(e.contains("--shard"), "{bad}: {e}");
        }
    }
}
