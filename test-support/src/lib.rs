//! The harness shared by every tokenmint test binary (`tests/api`, `crash`, `failover`,
//! `soak`, `metrics`, …), so that a fix to how tests start mongod, spawn the service or
//! read tokens back lands once.
//!
//! - [`mongod`]: the test mongod (a single-node replica set, so transactions work), one
//!   per test binary, and database handles on it;
//! - [`app`]: the service in-process on port 0, one randomly named database per test;
//! - [`service`]: the real `tokenmint` binary as a child process, for tests that kill it;
//! - [`failpoint`]: MongoDB failing one command at the step a test chooses;
//! - [`change_streams`]: the change streams an app holds open, as mongod lists them;
//! - [`answers`]: reading and asserting HTTP answers and the tokens stored behind them;
//! - [`shard_keys`]: the shard keys, and the check every test app makes of its writes.
//!
//! Everything is re-exported at the root: `use tokenmint_test_support::*;`.

pub mod answers;
pub mod app;
pub mod change_streams;
pub mod failpoint;
pub mod mongod;
pub mod service;
pub mod shard_keys;

pub use answers::*;
pub use app::*;
pub use change_streams::*;
pub use failpoint::*;
pub use mongod::*;
pub use service::*;
