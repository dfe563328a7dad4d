//! The coupon workload: the seed's flash sale, clicks in a seeded order,
//! each click an order transaction under the lock (or a lock-free
//! baseline), from one or more click tasks per process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distlock::{AcquireOptions, DistLock};
use lockbench_patterns::LocalFirst;
use tokio::time::Instant;

use super::{acquire_ev, data_db, release_ev, releasing_ev, Acquired, Bounds, EventLog, RunOut};
use crate::data::{self, Click, DataDb, PredeductKeys};
use crate::history::{monotonic_ns, Event};
use crate::spec::{CouponPlan, LockScope, Strategy, WorkerMsg, WorkerSpec};

/// The flash-sale click sequence: users in a seeded random order, each
/// user's clicks adjacent, dealt round-robin to the workers so that one
/// user's duplicate clicks arrive at about the same time from different
/// processes (as a user hammering "buy" does).
pub fn click_order(users: u32, clicks: u32, seed: u64) -> Vec<u64> {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let mut order: Vec<u64> = (0..u64::from(users)).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    order
        .into_iter()
        .flat_map(|u| std::iter::repeat_n(u, clicks as usize))
        .collect()
}

/// What a process's click tasks share: the history, the counters, and
/// the bought cache.
struct Shared {
    out: Mutex<RunOut>,
    /// User -> until when we remember they bought.
    bought: Mutex<HashMap<u64, Instant>>,
    done: std::sync::atomic::AtomicU64,
}

impl Shared {
    fn with<T>(&self, f: impl FnOnce(&mut RunOut) -> T) -> T {
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut out)
    }

    fn push(&self, e: Event) {
        self.with(|o| o.events.push(e));
    }

    fn bought(&self, user: u64) -> bool {
        let b = self.bought.lock().unwrap_or_else(|p| p.into_inner());
        b.get(&user).is_some_and(|until| Instant::now() < *until)
    }

    fn remember(&self, user: u64, ttl: Duration) {
        let mut b = self.bought.lock().unwrap_or_else(|p| p.into_inner());
        b.insert(user, Instant::now() + ttl);
    }
}

/// One lane's view of the run.
struct Lane<'a> {
    /// The history lane: the worker id for task 0, beyond the worker ids
    /// for the others, so the overlap checker sees every task apart.
    id: u32,
    spec: &'a WorkerSpec,
    plan: &'a CouponPlan,
    lock: &'a dyn DistLock,
    opts: AcquireOptions,
    db: Option<&'a DataDb>,
    shared: &'a Shared,
}

pub(super) async fn coupon(spec: &WorkerSpec, lock: Arc<dyn DistLock>) -> Result<RunOut, String> {
    let plan = spec
        .plan
        .coupon
        .as_ref()
        .ok_or("coupon workload without coupon parameters")?;
    let lock: Arc<dyn DistLock> = if plan.local_first {
        Arc::new(LocalFirst::new(lock))
    } else {
        lock
    };
    let workers = spec.plan.workers.max(1) as usize;
    let mine: Vec<u64> = click_order(plan.users, plan.clicks, spec.plan.seed)
        .into_iter()
        .enumerate()
        .filter(|(j, _)| j % workers == spec.worker as usize)
        .map(|(_, u)| u)
        .collect();
    let db = match plan.strategy {
        Strategy::RedisPrededuct => None,
        _ => Some(data_db(spec, plan.tasks.max(1) + 1).await?),
    };
    let keys = PredeductKeys::new(&spec.plan.key);
    let con = match plan.strategy {
        Strategy::RedisPrededuct => {
            let url = spec
                .plan
                .data_redis_url
                .as_deref()
                .ok_or("redis-prededuct needs a Redis (data_redis_url)")?;
            Some(data::redis_connect(url).await.map_err(|e| e.to_string())?)
        }
        _ => None,
    };
    let opts = AcquireOptions {
        wait: Some(Duration::from_millis(spec.plan.wait_ms)),
        lease: spec.plan.lease_ms.map(Duration::from_millis),
    };
    let shared = Shared {
        out: Mutex::new(RunOut {
            events: EventLog::create(&spec.history_path, true, mine.len() * 2 + 16)?,
            ..RunOut::default()
        }),
        bought: Mutex::new(HashMap::new()),
        done: std::sync::atomic::AtomicU64::new(0),
    };
    let bounds = Bounds::new(spec);
    let tasks = plan.tasks.max(1);
    let lanes = (0..tasks).map(|t| {
        let lane = Lane {
            id: spec.worker + t * spec.plan.workers.max(1),
            spec,
            plan,
            lock: lock.as_ref(),
            opts,
            db: db.as_ref(),
            shared: &shared,
        };
        // Task t takes every tasks-th of this process's clicks.
        let clicks: Vec<u64> = mine
            .iter()
            .copied()
            .skip(t as usize)
            .step_by(tasks as usize)
            .collect();
        let (bounds, keys, mut con) = (&bounds, &keys, con.clone());
        async move {
            for user in clicks {
                if let Some(timed_out) = bounds.stop() {
                    lane.shared.with(|o| o.timed_out = timed_out);
                    break;
                }
                let click = lane.click(user, keys, con.as_mut()).await;
                lane.tally(click);
            }
        }
    });
    futures::future::join_all(lanes).await;
    shared
        .out
        .into_inner()
        .map_err(|_| "a click task panicked".to_string())
}

impl Lane<'_> {
    /// Releases and records it, the intent on disk first (see
    /// `EventLog::releasing`).
    async fn release(&self, key: &str, guard: distlock::Guard, lost: Option<u64>) {
        let intent = releasing_ev(self.id, key, &guard, lost);
        self.shared.with(|o| o.events.releasing(&intent));
        let event = release_ev(intent, guard).await;
        self.shared.push(event);
    }

    async fn click(
        &self,
        user: u64,
        keys: &PredeductKeys,
        con: Option<&mut redis::aio::ConnectionManager>,
    ) -> Result<Option<Click>, data::DataError> {
        let plan = self.plan;
        if plan.bought_cache_ms.is_some() && self.shared.bought(user) {
            // Known to have bought: refused without the lock (or the
            // database). The unique index would refuse it anyway.
            self.shared.with(|o| o.count("bought_cache_hits"));
            return Ok(Some(Click::Duplicate));
        }
        let key = &self.spec.plan.key;
        let click = match (plan.strategy, self.db, con) {
            (Strategy::Lock, Some(db), _) => {
                let key = match plan.lock_scope {
                    LockScope::Voucher => format!("{key}:voucher:1"),
                    LockScope::UserVoucher => format!("{key}:voucher:1:user:{user}"),
                };
                self.locked(&key, db, user, 1).await
            }
            (Strategy::Segmented, Some(db), _) => self.segmented(db, user).await,
            (Strategy::SqlAtomic, Some(db), _) => db.order_atomic(user).await.map(Some),
            (Strategy::RedisPrededuct, _, Some(con)) => {
                data::prededuct_click(con, keys, user).await.map(Some)
            }
            _ => {
                return Err(data::DataError::Config(
                    "coupon strategy without its data store".into(),
                ))
            }
        };
        if let (Some(ttl), Ok(Some(Click::Ordered | Click::Duplicate))) =
            (plan.bought_cache_ms, &click)
        {
            self.shared.remember(user, Duration::from_millis(ttl));
        }
        click
    }

    /// Segment by segment from the user's own, until one has stock: each
    /// under that segment's lock.
    async fn segmented(&self, db: &DataDb, user: u64) -> Result<Option<Click>, data::DataError> {
        let n = self.plan.segments.max(1);
        let home = data::home_segment(user, n);
        let mut timed_out = false;
        for i in 0..n {
            let seg = (home - 1 + i) % n + 1;
            let key = format!("{}:voucher:1:seg:{seg}", self.spec.plan.key);
            match self.locked(&key, db, user, seg).await? {
                Some(Click::SoldOut) => continue,
                None => timed_out = true,
                decided => return Ok(decided),
            }
        }
        // A segment we could not lock may still have had stock.
        Ok((!timed_out).then_some(Click::SoldOut))
    }

    /// One order transaction on `segment` under `key`: `None` when the
    /// lock was not obtained.
    async fn locked(
        &self,
        key: &str,
        db: &DataDb,
        user: u64,
        segment: u32,
    ) -> Result<Option<Click>, data::DataError> {
        let (event, acquired) = acquire_ev(self.id, key, self.lock, self.opts).await;
        let trips = event.round_trips.map(u64::from);
        // Not obtained for another reason than the wait running out (the
        // server refused or broke): counted apart, not as contention.
        let failed = event
            .error
            .as_ref()
            .is_some_and(|e| e.kind != distlock::ErrorKind::Timeout);
        self.shared.with(|o| {
            o.events.push(event);
            o.count("lock_acquires");
            o.add("lock_round_trips", trips.unwrap_or(0));
            if failed {
                o.count("lock_errors");
            }
        });
        let Some(Acquired { guard, .. }) = acquired else {
            return Ok(None);
        };
        // Holder faults pick their victim by this (they never landed on
        // the sale: "no worker held the lock", and the run read HOLD).
        let announce = self.spec.plan.announce_holds;
        let watch = super::holding(announce, &guard);
        let pending = match db.order_locked_in(user, segment).await {
            Ok(p) => p,
            Err(e) => {
                let lost = super::leaving(announce, watch, &guard).await;
                self.release(key, guard, lost).await;
                return Err(e);
            }
        };
        let delay = Duration::from_millis(self.plan.commit_delay_ms);
        let click = if data::unlocks_first(self.plan) {
            let lost = super::leaving(announce, watch, &guard).await;
            self.release(key, guard, lost).await;
            pending.commit(delay).await
        } else {
            let c = pending.commit(delay).await;
            let lost = super::leaving(announce, watch, &guard).await;
            self.release(key, guard, lost).await;
            c
        };
        click.map(Some)
    }

    fn tally(&self, click: Result<Option<Click>, data::DataError>) {
        self.shared.with(|o| {
            o.count("clicks");
            match click {
                Ok(Some(c)) => {
                    o.count(c.counter());
                    if c == Click::Ordered {
                        o.marks.insert("last_order_ns".into(), monotonic_ns());
                    }
                }
                Ok(None) => o.count("rejected_lock_timeout"),
                Err(e) => {
                    tracing::warn!(error = %e, "click failed");
                    o.count("errors");
                }
            }
        });
        let done = self
            .shared
            .done
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        if done.is_multiple_of(10) {
            super::say(&WorkerMsg::Progress { done });
        }
    }
}
