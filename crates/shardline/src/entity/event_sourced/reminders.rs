//! Durable reminders of event-sourced entities: set by their events, in the events'
//! transaction, and fired as a command applied once.

use std::time::SystemTime;

use super::{journal_error, persistence_id, EventSourced, Persist, PersistError, Persistent};
use crate::entity::{EntityContext, RequestId};
use crate::error::Error;
use crate::journal::ReminderChange;
use crate::sharding::reminder::{stored, Reminder, When};

/// A change an event makes to its entity's durable reminders
/// ([`EventSourced::reminders`]).
///
/// ```
/// use std::time::Duration;
/// use shardline::entity::Remind;
/// use shardline::When;
///
/// let set = Remind::set("expire", When::After(Duration::from_secs(24 * 3600)));
/// let cancel = Remind::cancel("expire");
/// assert_ne!(set, cancel);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Remind {
    /// Sets the reminder `name`, replacing one of that name.
    Set {
        /// Its name (never empty).
        name: String,
        /// When it fires.
        when: When,
    },
    /// Cancels the reminder `name`.
    Cancel {
        /// Its name.
        name: String,
    },
}

impl Remind {
    /// Sets the reminder `name`.
    pub fn set(name: impl Into<String>, when: When) -> Self {
        Remind::Set { name: name.into(), when }
    }

    /// Cancels the reminder `name`.
    pub fn cancel(name: impl Into<String>) -> Self {
        Remind::Cancel { name: name.into() }
    }
}

/// The reminder changes of a command's events, as the journal stores them with the events.
pub(super) fn changes<T: EventSourced>(
    ctx: &EntityContext,
    events: &[T::Event],
) -> Result<Vec<ReminderChange>, PersistError> {
    let now = SystemTime::now();
    let mut out = Vec::new();
    for e in events {
        for r in T::reminders(e) {
            if !ctx.has_reminders() {
                return Err(PersistError::NotApplied(format!(
                    "an event of {} sets a reminder, but the type keeps none: give its settings .reminders()",
                    ctx.type_key()
                )));
            }
            let id = ctx.id().as_str();
            out.push(match r {
                Remind::Set { name, when } => ReminderChange::Set(
                    stored(id, &name, when, now).map_err(|e| PersistError::NotApplied(e.to_string()))?,
                ),
                Remind::Cancel { name } => ReminderChange::Cancel { entity_id: id.to_string(), name },
            });
        }
    }
    Ok(out)
}

impl<T: EventSourced> Persistent<T> {
    /// A due reminder: the command [`EventSourced::on_reminder`] picks, applied under the
    /// firing's id.
    pub(super) async fn run_reminder(&mut self, ctx: &mut EntityContext, reminder: Reminder) -> Result<(), Error> {
        if self.state.is_none() {
            ctx.claim_shard().await.map_err(|e| Error::from(journal_error(e)))?;
            let pid = persistence_id(ctx.type_key(), self.id.as_str());
            self.recover(ctx, &pid).await?;
        }
        let Some((state, _)) = &self.state else {
            return Err(Error::Unavailable("not recovered".into()));
        };
        let Some(command) = state.on_reminder(&reminder) else { return Ok(()) };
        let msg = Persist { request_id: Some(RequestId::new(reminder.firing_id())), command };
        self.firing = Some(reminder.ack(self.id.as_str()));
        let run = self.run(ctx, msg).await;
        self.firing = None;
        run?;
        Ok(())
    }
}
