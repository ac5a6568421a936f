//! What tokenmint learns from the driver's command events: a span per MongoDB command
//! (when traces are exported) and the commands' latency by name and outcome (when
//! `telemetry.mongodb_command_metrics` is on). Either costs: with an observer installed
//! the driver copies every command document into its event, a 10 000-token insert
//! included, so neither is on by default and nothing here runs without them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use mongodb::event::EventHandler;
use mongodb::event::command::CommandEvent;

use super::metric;

/// The `command` label: the commands tokenmint sends, else `other` (a label value is a
/// series kept for the process's life; the driver's own commands are few, but a closed
/// set needs no such argument).
const COMMANDS: &[&str] = &[
    "find",
    "getMore",
    "aggregate",
    "insert",
    "update",
    "delete",
    "findAndModify",
    "count",
    "createIndexes",
    "listIndexes",
    "commitTransaction",
    "abortTransaction",
    "killCursors",
    "endSessions",
    "ping",
    "hello",
];

/// The observer of what is asked for, or `None` when nothing is (the driver then builds
/// no events at all).
pub fn observer(spans: bool, latency: bool) -> Option<EventHandler<CommandEvent>> {
    if !spans && !latency {
        return None;
    }
    // A span per command in flight, by request id; every started command ends, so this
    // holds at most the commands in flight.
    let in_flight: Arc<Mutex<HashMap<i32, tracing::Span>>> = Arc::default();
    Some(EventHandler::callback(move |event| match event {
        // Commands sent outside any span (the connection's own, the readiness probe,
        // migrations at startup) get none: each would be a trace of one span every few
        // seconds.
        CommandEvent::Started(started) if spans && !tracing::Span::current().is_none() => {
            let span = tracing::info_span!(
                "mongodb",
                otel.name = %format_args!("{} {}", started.command_name, started.db),
                otel.kind = "client",
                db.system.name = "mongodb",
                db.operation.name = %started.command_name,
                db.namespace = %started.db,
                otel.status_code = tracing::field::Empty,
            );
            lock(&in_flight).insert(started.request_id, span);
        }
        CommandEvent::Started(_) => {}
        CommandEvent::Succeeded(succeeded) => {
            if latency {
                record(&succeeded.command_name, "ok", succeeded.duration);
            }
            lock(&in_flight).remove(&succeeded.request_id);
        }
        CommandEvent::Failed(failed) => {
            if latency {
                record(&failed.command_name, "error", failed.duration);
            }
            if let Some(span) = lock(&in_flight).remove(&failed.request_id) {
                span.record("otel.status_code", "ERROR");
            }
        }
        _ => {}
    }))
}

fn record(command: &str, outcome: &'static str, took: std::time::Duration) {
    let command = COMMANDS
        .iter()
        .find(|known| **known == command)
        .copied()
        .unwrap_or("other");
    metrics::histogram!(metric::MONGODB_COMMAND_DURATION_SECONDS, "command" => command, "outcome" => outcome)
        .record(took.as_secs_f64());
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding it cannot leave the map half-updated: insert and remove are
    // single calls.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
