//! The demo's alarms (`shardline node --alarms`): an event-sourced entity with durable reminders. Setting an alarm stores an
//! event whose reminder is written in the same transaction; when it is due, wherever the alarm's
//! shard lives then, the reminder runs `Ring`, applied once under the firing's id even when the
//! firing is delivered again after a crash.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardline::entity::{EventSourcedHandle, EventSourcedSettings, Remind};
use shardline::journal::Journal;
use shardline::{Cluster, ConfigError, EntityId, EntitySettings, EventSourced, Reminder, When};

/// What an alarm is asked.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum AlarmCmd {
    /// Ring `name` once, `after_ms` from now.
    Set { name: String, after_ms: u64 },
    /// Ring the alarm `name` (what its reminder runs).
    Ring { name: String },
    /// How many times each alarm rang.
    Rings,
}

/// What an alarm stores.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum AlarmEvent {
    /// Set, with its reminder.
    Set { name: String, after_ms: u64 },
    /// Rang.
    Rang { name: String },
}

/// An entity of alarms: how many times each rang.
#[derive(Default, Serialize, Deserialize)]
pub struct Alarm {
    rang: BTreeMap<String, u32>,
}

impl EventSourced for Alarm {
    type Command = AlarmCmd;
    type Event = AlarmEvent;
    type Reply = BTreeMap<String, u32>;
    const EVENT_TYPE: &'static str = "alarm";

    fn empty(_id: &EntityId) -> Self {
        Alarm::default()
    }

    fn apply(&mut self, e: &AlarmEvent) {
        if let AlarmEvent::Rang { name } = e {
            *self.rang.entry(name.clone()).or_default() += 1;
        }
    }

    fn decide(&self, cmd: AlarmCmd) -> (Vec<AlarmEvent>, BTreeMap<String, u32>) {
        let events = match cmd {
            AlarmCmd::Set { name, after_ms } => vec![AlarmEvent::Set { name, after_ms }],
            // Counted every time it runs: only the firing's id keeps a repeated delivery from
            // counting twice.
            AlarmCmd::Ring { name } => vec![AlarmEvent::Rang { name }],
            AlarmCmd::Rings => vec![],
        };
        let mut after = Alarm { rang: self.rang.clone() };
        events.iter().for_each(|e| after.apply(e));
        (events, after.rang)
    }

    fn reminders(e: &AlarmEvent) -> Vec<Remind> {
        match e {
            AlarmEvent::Set { name, after_ms } => {
                vec![Remind::set(name.clone(), When::After(Duration::from_millis(*after_ms)))]
            }
            AlarmEvent::Rang { .. } => vec![],
        }
    }

    fn on_reminder(&self, r: &Reminder) -> Option<AlarmCmd> {
        Some(AlarmCmd::Ring { name: r.name().to_string() })
    }
}

/// The handle of the demo's alarms.
pub type Alarms = EventSourcedHandle<Alarm>;

/// Registers the alarm type: hosted with its reminders in `journal` on a node, routed only on a
/// proxy (None).
pub async fn register_alarms(
    cluster: &Cluster,
    shards: u32,
    journal: Option<std::sync::Arc<dyn Journal>>,
) -> Result<Alarms, ConfigError> {
    let settings = EntitySettings::new("alarm").shards(shards).ask_timeout(Duration::from_secs(5));
    let settings = match journal {
        Some(j) => settings.journal(j).reminders(),
        None => settings,
    };
    cluster.register_event_sourced::<Alarm>(settings, EventSourcedSettings::default()).await
}
