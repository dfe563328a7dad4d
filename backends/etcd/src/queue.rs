//! A lock's queue in etcd's key space: its key range, and the reads the
//! recipe sends into it (count, holder, the key just ahead).

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

    /// How many keys are queued: read inside the acquire transaction BEFORE
    /// our put, zero means nobody is ahead of us. Count-only is served from
    /// the index alone, with no read of the key-value store.
    pub(crate) fn count(&self) -> TxnOp {
        TxnOp::get(
            self.dir.as_str(),
            Some(
                GetOptions::new()
                    .with_range(self.dir_end.as_str())
                    .with_count_only(),
            ),
        )
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

    /// The key just ahead of `rev` (highest create revision below it).
    pub(crate) fn ahead_of(&self, rev: i64) -> TxnOp {
        TxnOp::get(
            self.dir.as_str(),
            Some(
                GetOptions::new()
                    .with_range(self.dir_end.as_str())
                    .with_sort(SortTarget::Create, SortOrder::Descend)
                    .with_max_create_revision(rev - 1)
                    .with_limit(1)
                    .with_keys_only(),
            ),
        )
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
