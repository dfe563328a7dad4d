//! The coupon workload's data: the seed's voucher and orders, the order
//! transaction a lock protects (or the lock-free SQL baseline), and the
//! invariants checked by SQL after the run.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, Row};

use super::{sql, DataDb, DataError};
use crate::spec::{CouponPlan, Ordering, Strategy};

impl DataDb {
    /// Creates `voucher` and `voucher_order`, with or without the unique
    /// (user, voucher) index. `voucher` has one row per stock segment (ids
    /// 1..=N, the stock split as evenly as it goes; one row, id 1, unless
    /// the plan is segmented); every order is of voucher 1 and names its
    /// segment.
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
    voucher_id bigint NOT NULL, created_ns bigint NOT NULL, segment bigint NOT NULL DEFAULT 1);
{index}
INSERT INTO {s}.voucher VALUES {rows};
"#,
                rows = segment_rows(plan)
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
        self.order_locked_in(user, 1).await
    }

    /// [`DataDb::order_locked`] on one stock segment (1-based): sold out
    /// means this segment is empty.
    ///
    /// # Errors
    /// SQL failures.
    pub async fn order_locked_in(&self, user: u64, segment: u32) -> Result<Pending, DataError> {
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
        match self.decrement_and_insert(&mut tx, uid, segment).await {
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
        match self.decrement_and_insert(&mut tx, uid, 1).await {
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
        segment: u32,
    ) -> Result<bool, DataError> {
        let s = &self.schema;
        let left: Option<i32> = sqlx::query_scalar(AssertSqlSafe(format!(
            "UPDATE {s}.voucher SET stock = stock - 1, min_stock = LEAST(min_stock, stock - 1)
             WHERE id = $1 AND stock > 0 RETURNING stock"
        )))
        .bind(i64::from(segment))
        .fetch_optional(&mut **tx)
        .await
        .map_err(sql("decrementing the stock"))?;
        if left.is_none() {
            return Ok(false);
        }
        let now = i64::try_from(crate::history::monotonic_ns()).unwrap_or(i64::MAX);
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {s}.voucher_order (user_id, voucher_id, created_ns, segment) VALUES ($1, 1, $2, $3)"
        )))
        .bind(uid)
        .bind(now)
        .bind(i64::from(segment))
        .execute(&mut **tx)
        .await
        .map_err(sql("inserting the order"))?;
        Ok(true)
    }

    /// The coupon invariants, by SQL after the run, over every segment:
    /// no segment's stock ever below 0 (so the total never is), one order
    /// per user across segments, and conservation both in total and in
    /// each segment.
    ///
    /// # Errors
    /// SQL failures.
    pub async fn check_coupon(&self) -> Result<CouponCheck, DataError> {
        let s = &self.schema;
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT sum(v.initial)::int, sum(v.stock)::int, min(v.min_stock),
                    (SELECT count(*) FROM {s}.voucher_order o WHERE o.voucher_id = 1),
                    (SELECT count(*) FROM (SELECT user_id FROM {s}.voucher_order
                        WHERE voucher_id = 1 GROUP BY user_id HAVING count(*) > 1) d),
                    (SELECT count(*) - count(DISTINCT user_id) FROM {s}.voucher_order
                        WHERE voucher_id = 1),
                    count(*) FILTER (WHERE (SELECT count(*) FROM {s}.voucher_order o
                        WHERE o.voucher_id = 1 AND o.segment = v.id) <> v.initial - v.stock),
                    count(*)
             FROM {s}.voucher v"
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
        let (unbalanced, segments) = (i64_at(6)?, i64_at(7)?);
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
            orders_match_stock: orders == initial - remaining && unbalanced == 0,
            segments,
            unbalanced_segments: unbalanced,
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
    /// Invariant 3: orders = initial stock - remaining stock, in total and
    /// in every segment.
    pub orders_match_stock: bool,
    /// Stock segments (rows of `voucher`).
    #[serde(default = "one_segment")]
    pub segments: i64,
    /// Segments whose orders do not match their stock taken.
    #[serde(default)]
    pub unbalanced_segments: i64,
}

fn one_segment() -> i64 {
    1
}

/// `(id, stock, initial, min_stock)` rows: the plan's stock over its
/// segments, the first ones taking the remainder.
fn segment_rows(plan: &CouponPlan) -> String {
    let n = if plan.strategy == Strategy::Segmented {
        plan.segments.max(1)
    } else {
        1
    };
    (0..n)
        .map(|i| {
            let share = plan.stock / n + u32::from(i < plan.stock % n);
            format!("({}, {share}, {share}, {share})", i + 1)
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The segment (1-based) a user's click tries first: a fixed hash, so one
/// user's duplicate clicks meet on the same segment's lock.
pub fn home_segment(user: u64, segments: u32) -> u32 {
    let n = u64::from(segments.max(1));
    let h = user.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    u32::try_from(h % n).unwrap_or(0) + 1
}

impl CouponCheck {
    /// All three invariants hold.
    pub fn valid(&self) -> bool {
        self.stock_never_negative && self.one_order_per_user && self.orders_match_stock
    }
}

/// Whether the strategy takes the lock under test.
pub fn uses_lock(plan: &CouponPlan) -> bool {
    matches!(plan.strategy, Strategy::Lock | Strategy::Segmented)
}

/// Whether the lock is released before COMMIT (the seed's bug).
pub fn unlocks_first(plan: &CouponPlan) -> bool {
    plan.ordering == Ordering::UnlockThenCommit
}
