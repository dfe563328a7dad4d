//! Shared set-up for lockbench's criterion benches (`cargo bench`).
//!
//! Benches start their own servers through `fleet`, so nothing needs to be
//! running beforehand, and never time against a server a previous bench
//! left behind: every fleet binds fresh ports in its own temp dir and is
//! torn down before the next one starts.
