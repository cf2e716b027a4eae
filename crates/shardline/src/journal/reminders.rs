//! Durable reminders as the journal keeps them: the record types are the core's
//! ([`shardline_core::reminder`]), which also decides when a shard's owner reads and fires them.
//! A journal stores one row per (entity type, entity, name) with the shard that owns the entity,
//! indexed by (type, shard, due time, entity, name), so that the shard's owner reads its own
//! reminders due soon a page at a time instead of scanning every pending one.

pub use shardline_core::reminder::{ReminderChange, ReminderPosition, StoredReminder, MAX_DUE_MS};
