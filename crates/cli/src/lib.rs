//! The library side of the `lockbench` binary: the one registry of
//! backends (name -> topology, capabilities, how to connect, raw floor and
//! peers), shared by the CLI and the criterion benches.

pub mod registry;
pub mod servers;
