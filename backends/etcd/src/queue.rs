//! A lock's queue in etcd's key space: its key range, and the reads the
//! recipe sends into it (the keys ahead, the holder).

use std::collections::HashSet;

use etcd_client::{GetOptions, SortOrder, SortTarget, TxnOp, TxnOpResponse};

/// `/` and `%` escaped, so the range of lock `a` never holds lock `a/b`'s keys.
fn escape(key: &str) -> String {
    key.replace('%', "%25").replace('/', "%2F")
}

/// The queue of one lock: every key in `[dir, dir_end)`.
pub(crate) struct Queue {
    pub(crate) dir: String,
    pub(crate) dir_end: String,
}

impl Queue {
    pub(crate) fn new(prefix: &str, key: &str) -> Self {
        let base = format!("{prefix}/{}", escape(key));
        Self {
            dir: format!("{base}/"),
            // '0' is the byte after '/': the end of the prefix range.
            dir_end: format!("{base}0"),
        }
    }

    /// The keys queued now, newest first, at most `limit`: read inside the
    /// acquire transaction BEFORE our put, these are exactly the keys ahead
    /// of ours (none = ours is first; no key can later get a create
    /// revision below ours). Uncontended, the range is empty and this costs
    /// what a count does; contended, the waiter gets every key it must see
    /// deleted, so its turn needs no further read (see `watch_hub`).
    pub(crate) fn newest(&self, limit: i64) -> TxnOp {
        TxnOp::get(self.dir.as_str(), Some(self.newest_opts(limit)))
    }

    fn newest_opts(&self, limit: i64) -> GetOptions {
        GetOptions::new()
            .with_range(self.dir_end.as_str())
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(limit)
            .with_keys_only()
    }

    /// The holder (lowest create revision).
    pub(crate) fn first(&self) -> TxnOp {
        TxnOp::get(
            self.dir.as_str(),
            Some(
                GetOptions::new()
                    .with_range(self.dir_end.as_str())
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_limit(1)
                    .with_keys_only(),
            ),
        )
    }

    /// The keys ahead of `rev` (create revision below it), nearest first,
    /// at most `limit`.
    pub(crate) fn ahead_of(&self, rev: i64, limit: i64) -> TxnOp {
        TxnOp::get(
            self.dir.as_str(),
            Some(self.newest_opts(limit).with_max_create_revision(rev - 1)),
        )
    }
}

/// The keys of the `i`-th range response of a transaction, and whether they
/// are all the range had (the read was not cut at its limit).
pub(crate) fn range_keys(ops: &[TxnOpResponse], i: usize) -> Option<(HashSet<Vec<u8>>, bool)> {
    match ops.get(i)? {
        TxnOpResponse::Get(g) => Some((
            g.kvs().iter().map(|kv| kv.key().to_vec()).collect(),
            !g.more(),
        )),
        _ => None,
    }
}

/// The first key-value of the `i`-th range response of a transaction.
pub(crate) fn range_first(ops: &[TxnOpResponse], i: usize) -> Option<(Vec<u8>, i64)> {
    match ops.get(i)? {
        TxnOpResponse::Get(g) => g
            .kvs()
            .first()
            .map(|kv| (kv.key().to_vec(), kv.create_revision())),
        _ => None,
    }
}
