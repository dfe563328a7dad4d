//! Runs whose workers live on several hosts: `lockbench run --hosts N`
//! coordinates, `lockbench worker --run ID` on each host runs its share.
//! They meet in the run's PostgreSQL (`harness::hosts`); nothing is
//! spawned across hosts and no clock is shared. Each host's history is
//! checked on its own clock; across hosts the ledger's database stamps
//! decide, and the fenced ledger and the lost-update counter need no
//! clock at all.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use harness::checker::{check_overlap, OverlapReport};
use harness::coordinator::{self, RunOutput, RunPlan, WorkerDeath};
use harness::history::Event;
use harness::hosts::{shard_workers, HostOutcome, HostsRecord, RunStore, Shard, BEAT};
use lockbench_registry::{self as registry, Descriptor, Settings};

/// `lockbench worker --run ID`: one host of a multi-host run.
#[derive(Debug, Clone, clap::Args)]
pub struct HostArgs {
    /// The run to join (the coordinator's `lockbench run --hosts N --run
    /// ID`). Without it, `worker` is the internal per-process worker that
    /// takes its orders on stdin.
    #[arg(long)]
    pub run: Option<String>,
    /// TOML config file with this host's endpoints: the lock's servers and
    /// `[postgres] url`, the run's PostgreSQL where the hosts meet.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Take shard I of N (a Kubernetes Indexed Job's index); by default
    /// the lowest free one. N must be the run's --hosts.
    #[arg(long)]
    pub shard: Option<Shard>,
    /// Seconds to wait for the run to be opened, and for its go.
    #[arg(long, default_value_t = 60)]
    pub join_timeout: u64,
    /// The name this host gives itself in the run [default: its hostname].
    #[arg(long)]
    pub host: Option<String>,
}

/// The `LOCKBENCH_CLOCK_SKEW_MS` a worker host was given, checked: every
/// time stamp its processes write is moved by it, to simulate a host whose
/// clock is not the others'.
///
/// # Errors
/// A value that is not a whole number of milliseconds, naming the variable.
pub fn check_skew() -> anyhow::Result<()> {
    if let Ok(v) = std::env::var(harness::history::SKEW_ENV) {
        v.trim().parse::<i64>().map_err(|_| {
            anyhow::anyhow!(
                "{}={v:?}: give a whole number of milliseconds, e.g. 500 or -500",
                harness::history::SKEW_ENV
            )
        })?;
    }
    Ok(())
}

/// The run's PostgreSQL, from the `[postgres]` table (or its environment):
/// the one place every host of the run can meet.
pub(crate) fn meeting_url(settings: &Settings) -> anyhow::Result<String> {
    let pg = &lockbench_postgres::PG_ROW;
    let v = settings.for_backend(pg, None)?;
    anyhow::ensure!(
        pg.configured_endpoint(&v).is_some(),
        "a multi-host run meets in its PostgreSQL: set [postgres] url in --config (or LOCKBENCH_PG_URL), the same on every host"
    );
    crate::run::url_of(&v)
}

/// A setting's value for a message (redacted already), or "unset".
fn show(v: Option<&serde_json::Value>) -> String {
    v.map_or_else(|| "unset".to_string(), ToString::to_string)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// `lockbench worker --run ID`: joins the run, runs this host's share of
/// its workers, writes their history to the run's PostgreSQL.
///
/// # Errors
/// No such run, a bad config, a worker that cannot connect; each is also
/// written to the run, so the coordinator names it.
pub async fn serve_host(a: &HostArgs, run_id: &str) -> anyhow::Result<ExitCode> {
    // At once, as the coordinator does: a bad id waited out the join
    // timeout looking for a run nobody could have opened.
    crate::run::check_run_id(run_id)?;
    check_skew()?;
    let settings = match &a.config {
        Some(p) => Settings::from_file(p)?,
        None => Settings::default(),
    };
    let url = meeting_url(&settings)?;
    let store = RunStore::connect(&url).await?;
    let host = a.host.clone().unwrap_or_else(hostname);
    let wait = Duration::from_secs(a.join_timeout);
    let (shard, hosts, plan) = store
        .join(run_id, a.shard, &host, std::process::id(), wait)
        .await?;
    eprintln!("lockbench worker: joined run {run_id} as shard {shard}/{hosts} ({host})");
    let live = coordinator::LiveWorkers::default();
    let beat = {
        let (store, run, live) = (store.clone(), run_id.to_string(), live.clone());
        tokio::spawn(async move {
            // Since when the store has answered every beat promptly.
            let mut responsive_since = std::time::Instant::now();
            loop {
                // A missed beat is retried at the next; the coordinator
                // waits ten before it gives up on this host.
                let t = std::time::Instant::now();
                let beat = store.beat(&run, shard).await;
                // A slow or failed beat: the database stalled or restarted,
                // and the coordinator's beats were late for the same cause.
                if beat.is_err() || t.elapsed() > BEAT * 2 {
                    responsive_since = std::time::Instant::now();
                }
                let over = match beat {
                    Ok(()) => store.run_over(&run, responsive_since).await.ok().flatten(),
                    Err(_) => None,
                };
                // Nobody will collect what the workers do from now on:
                // they stop (a coordinator killed or interrupted left
                // hosts running for the rest of --duration).
                if let Some(why) = over {
                    live.stop(why);
                }
                tokio::time::sleep(BEAT).await;
            }
        })
    };
    let r = run_share(&store, &settings, run_id, shard, hosts, plan, wait, &live).await;
    beat.abort();
    match r {
        Ok((n, None)) => {
            eprintln!(
                "lockbench worker: shard {shard}/{hosts} done, {n} events written to the run"
            );
            Ok(ExitCode::SUCCESS)
        }
        Ok((n, Some(why))) => {
            eprintln!(
                "lockbench worker: shard {shard}/{hosts} stopped early: {why}; its {n} events were not written to the run"
            );
            Ok(ExitCode::FAILURE)
        }
        Err(e) => {
            let _ = store.fail(run_id, shard, &crate::output::causes(&e)).await;
            Err(e)
        }
    }
}

/// Runs this host's share; returns the events written and, if the workers
/// were stopped early, why.
#[allow(clippy::too_many_arguments)] // the run, this host's place in it, and its live workers
async fn run_share(
    store: &RunStore,
    settings: &Settings,
    run_id: &str,
    shard: u32,
    hosts: u32,
    mut plan: RunPlan,
    wait: Duration,
    live: &coordinator::LiveWorkers,
) -> anyhow::Result<(usize, Option<String>)> {
    let backend = registry::find(&plan.backend)?;
    // This host's own endpoints: the stored plan carries no secrets.
    let cfg = settings.for_backend(backend, None)?;
    anyhow::ensure!(
        backend.configured_endpoint(&cfg).is_some(),
        "{}: this host needs the lock's endpoint in its --config (table [{}]), the servers the coordinator uses",
        backend.name(),
        backend.family()
    );
    // The stored plan holds the coordinator's settings, redacted. A host
    // locking other servers (another Redis database) ran unnoticed, and
    // the lock was blamed for the lost updates; the same servers under
    // other names (the compose network's service names) are legitimate,
    // so it is said, on this host and in the run's results, not refused.
    let mine = backend.redacted(&cfg);
    if mine != plan.backend_config {
        let differ: Vec<String> = match (mine.as_object(), plan.backend_config.as_object()) {
            (Some(a), Some(b)) => a
                .keys()
                .chain(b.keys())
                .filter(|k| a.get(*k) != b.get(*k))
                .map(|k| format!("{k}: {} here, {} there", show(a.get(k)), show(b.get(k))))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect(),
            _ => vec!["the whole table".into()],
        };
        let note = format!(
            "its [{}] settings are not the coordinator's ({}): unless these are the same servers under other names, it locked elsewhere",
            backend.family(),
            differ.join("; ")
        );
        eprintln!("lockbench worker: warning: {note}");
        store.note(run_id, shard, &note).await?;
    }
    plan.backend_config = cfg.clone();
    plan.data_pg_url = Some(crate::run::url_of(&crate::run::data_settings(
        settings,
        &lockbench_postgres::PG_ROW,
        backend,
        &cfg,
    )?)?);
    let ids = shard_workers(shard, hosts, plan.workers);
    anyhow::ensure!(
        !ids.is_empty(),
        "shard {shard}/{hosts}: the run's {} workers leave none for this host",
        plan.workers
    );
    let dir = tempfile::tempdir().context("a directory for this host's histories")?;
    let exe = std::env::current_exe().context("locating the lockbench binary for workers")?;
    let gate = async {
        store.ready(run_id, shard).await?;
        // The coordinator waits for the slowest host up to its own join
        // timeout; wait a little longer than that for its go.
        store
            .wait_go(run_id, shard, wait * 2 + Duration::from_secs(10))
            .await
    };
    let out = coordinator::run_gated(
        &plan,
        &exe,
        &["worker".to_string()],
        dir.path(),
        live,
        ids,
        gate,
        |_| {},
    )
    .await?;
    if let Some(why) = &out.stopped {
        // Cut short: what the workers did is not this shard's share, and
        // must not be collected as if it were.
        let _ = store
            .fail(run_id, shard, &format!("stopped early: {why}"))
            .await;
        return Ok((out.history.len(), out.stopped));
    }
    store.finish(run_id, shard, &out).await?;
    Ok((out.history.len(), None))
}

/// The coordinator's side of `lockbench run --hosts N`: opens the run in
/// its PostgreSQL (`meet_url`), waits for every host, says go, and merges
/// what they wrote. Returns the merged output and what results.json says
/// of the hosts.
///
/// # Errors
/// A host that never comes (naming the missing shards), a host that
/// cannot get ready (with its reason), SQL failures.
pub async fn coordinate(
    plan: &RunPlan,
    backend: &dyn Descriptor,
    meet_url: &str,
    run_id: &str,
    hosts: u32,
    join_timeout: Duration,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<(RunOutput, HostsRecord)> {
    let store = RunStore::connect(meet_url).await?;
    let mut stored = plan.clone();
    stored.backend_config = backend.redacted(&plan.backend_config);
    stored.data_pg_url = None;
    stored.data_redis_url = None;
    store.create_run(run_id, hosts, &stored).await?;
    let r = follow(&store, plan, run_id, hosts, join_timeout, bar).await;
    if r.is_err() {
        // The hosts stop at once, not when they miss our beats.
        let _ = store.end(run_id).await;
    }
    r
}

/// [`coordinate`] once the run is open: waits for the hosts, says go,
/// collects what they wrote.
async fn follow(
    store: &RunStore,
    plan: &RunPlan,
    run_id: &str,
    hosts: u32,
    join_timeout: Duration,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<(RunOutput, HostsRecord)> {
    eprintln!(
        "lockbench run: run {run_id} is open for {hosts} hosts (up to {} s); on each: lockbench worker --run {run_id} --config FILE",
        join_timeout.as_secs()
    );
    bar.set_message(format!("{run_id}: waiting for {hosts} hosts"));
    store
        .wait_ready(run_id, hosts, join_timeout, |n| {
            bar.set_message(format!("{run_id}: {n} of {hosts} hosts ready"));
        })
        .await?;
    let started = std::time::Instant::now();
    store.go(run_id).await?;
    bar.set_message(format!("{run_id}: running on {hosts} hosts"));
    let limit = Duration::from_secs(plan.max_secs + 30);
    let members = store
        .collect(run_id, hosts, plan.workers, limit, |n| {
            bar.set_message(format!("{run_id}: {n} of {hosts} hosts finished"));
        })
        .await?;
    let wall = started.elapsed();
    Ok(merge(run_id, members, wall))
}

/// One output from every host's: each history on its own clock, a death
/// for every worker of a host that failed or went silent.
fn merge(run_id: &str, members: Vec<HostOutcome>, wall: Duration) -> (RunOutput, HostsRecord) {
    let mut out = RunOutput {
        history: Vec::new(),
        floor_ns: Vec::new(),
        peers_ns: Default::default(),
        paired_ns: Vec::new(),
        timed: Vec::new(),
        warmup: Duration::ZERO,
        timed_out: false,
        wall,
        started_ns: 0,
        counters: Default::default(),
        marks: Default::default(),
        deaths: Vec::new(),
        stopped: None,
    };
    let mut per_host: Vec<OverlapReport> = Vec::new();
    for m in &members {
        per_host.push(check_overlap(&m.history));
        out.history.extend(m.history.iter().cloned());
        match &m.report {
            Some(r) => {
                for (k, v) in &r.counters {
                    *out.counters.entry(k.clone()).or_default() += v;
                }
                out.timed_out |= r.timed_out;
                out.deaths.extend(r.deaths.iter().cloned());
            }
            None => {
                let why = m.message.clone().unwrap_or_else(|| m.state.clone());
                for &w in &m.workers {
                    out.deaths.push(WorkerDeath {
                        worker: w,
                        at_ns: 0,
                        message: format!("host {} (shard {}) {}: {why}", m.host, m.shard, m.state),
                        injected: false,
                    });
                    // It ends where its (unknown) history ends.
                    out.history.push(Event::exit(w, 0));
                }
            }
        }
    }
    let naive = check_overlap(&out.history);
    out.history.sort_by_key(|e| (e.worker, e.invoke_ns));
    let record = HostsRecord {
        run_id: run_id.to_string(),
        members,
        per_host: OverlapReport::merged(per_host),
        naive_cross_host_violations: naive.violations,
    };
    (out, record)
}
