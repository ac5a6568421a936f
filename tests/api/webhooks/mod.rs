//! Webhooks: [`signatures`] (rotation and every refusal), [`delivery`] (each event has
//! one effect, whatever the duplicates, order or concurrency), [`effects`] (what a
//! refund, bad metadata or a checkout request waiting for the payment lead to) and
//! [`replays`] (terminal states and fixed token parameters).

mod delivery;
mod effects;
mod replays;
mod signatures;
