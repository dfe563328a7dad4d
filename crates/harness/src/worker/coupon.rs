//! The coupon workload: the seed's flash sale, clicks in a seeded order,
//! each click an order transaction under the lock (or a lock-free
//! baseline).

use std::time::Duration;

use distlock::{AcquireOptions, DistLock};

use super::{acquire_rec, data_db, release_rec, Acquired, Bounds, EventLog, RunOut};
use crate::data::{self, Click, DataDb, PredeductKeys};
use crate::history::monotonic_ns;
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

pub(super) async fn coupon(spec: &WorkerSpec, lock: &dyn DistLock) -> Result<RunOut, String> {
    let plan = spec
        .plan
        .coupon
        .as_ref()
        .ok_or("coupon workload without coupon parameters")?;
    let workers = spec.plan.workers.max(1) as usize;
    let mine: Vec<u64> = click_order(plan.users, plan.clicks, spec.plan.seed)
        .into_iter()
        .enumerate()
        .filter(|(j, _)| j % workers == spec.worker as usize)
        .map(|(_, u)| u)
        .collect();
    let db = match plan.strategy {
        Strategy::RedisPrededuct => None,
        _ => Some(data_db(spec, 2).await?),
    };
    let keys = PredeductKeys::new(&spec.plan.key);
    let mut con = match plan.strategy {
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
    let delay = Duration::from_millis(plan.commit_delay_ms);
    let mut out = RunOut {
        events: EventLog::create(&spec.history_path, true, mine.len() * 2 + 16)?,
        ..RunOut::default()
    };
    let bounds = Bounds::new(spec);
    for (i, user) in mine.into_iter().enumerate() {
        if let Some(timed_out) = bounds.stop() {
            out.timed_out = timed_out;
            break;
        }
        let click = match (plan.strategy, &db, &mut con) {
            (Strategy::Lock, Some(db), _) => {
                let key = match plan.lock_scope {
                    LockScope::Voucher => format!("{}:voucher:1", spec.plan.key),
                    LockScope::UserVoucher => format!("{}:voucher:1:user:{user}", spec.plan.key),
                };
                locked_click(
                    spec.worker,
                    &key,
                    lock,
                    opts,
                    db,
                    user,
                    plan,
                    delay,
                    &mut out,
                )
                .await
            }
            (Strategy::SqlAtomic, Some(db), _) => db.order_atomic(user).await.map(Some),
            (Strategy::RedisPrededuct, _, Some(con)) => {
                data::prededuct_click(con, &keys, user).await.map(Some)
            }
            _ => return Err("coupon strategy without its data store".into()),
        };
        out.count("clicks");
        match click {
            Ok(Some(c)) => {
                out.count(c.counter());
                if c == Click::Ordered {
                    out.marks.insert("last_order_ns".into(), monotonic_ns());
                }
            }
            Ok(None) => out.count("rejected_lock_timeout"),
            Err(e) => {
                tracing::warn!(error = %e, "click failed");
                out.count("errors");
            }
        }
        if i % 10 == 9 {
            super::say(&WorkerMsg::Progress { done: i as u64 + 1 });
        }
    }
    Ok(out)
}

/// One click under the lock: `None` when the lock was not obtained.
#[allow(clippy::too_many_arguments)]
async fn locked_click(
    worker: u32,
    key: &str,
    lock: &dyn DistLock,
    opts: AcquireOptions,
    db: &DataDb,
    user: u64,
    plan: &CouponPlan,
    delay: Duration,
    out: &mut RunOut,
) -> Result<Option<Click>, data::DataError> {
    let Some(Acquired { guard, .. }) = acquire_rec(worker, key, lock, opts, &mut out.events).await
    else {
        return Ok(None);
    };
    let pending = match db.order_locked(user).await {
        Ok(p) => p,
        Err(e) => {
            release_rec(worker, key, guard, None, &mut out.events).await;
            return Err(e);
        }
    };
    let click = if data::unlocks_first(plan) {
        release_rec(worker, key, guard, None, &mut out.events).await;
        pending.commit(delay).await
    } else {
        let c = pending.commit(delay).await;
        release_rec(worker, key, guard, None, &mut out.events).await;
        c
    };
    click.map(Some)
}
