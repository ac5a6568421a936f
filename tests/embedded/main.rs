//! The embedded mode end to end, with the real binary: `tokenmint serve` with no
//! `mongo.uri` starts its own mongod on a data directory, serves, stops it on SIGTERM,
//! and a second start on the same directory finds the data again. Operator commands run
//! beside it use its mongod and leave it running; the development key survives restarts;
//! `keys new` prints a usable entry; production refuses the embedded mongod; a failed
//! start stops mongod cleanly; slow clients are cut off; `/readyz` turns 503 as soon as
//! shutdown begins; a Ctrl-C to the service's process group drains before mongod stops.
//!
//! The tests are in [`lifecycle`] (start, restart, stop), [`commands`] (operator commands
//! beside a running service, production's refusal) and [`keys`]; the binary as they run
//! it is in `server.rs`, the data directory's configuration and checks in `data_dir.rs`.

mod commands;
mod data_dir;
mod keys;
mod lifecycle;
mod server;

/// The admin key every configured service here accepts.
const KEY: &str = "embedded-test-admin-key";
