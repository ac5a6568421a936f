//! Webhooks: [`signatures`] (rotation and every refusal), [`delivery`] (each event has
//! one effect, whatever the duplicates, order or concurrency) and [`effects`] (what a
//! refund, bad metadata or a checkout request waiting for the payment lead to).

mod delivery;
mod effects;
mod signatures;
