//! The demo application of the `shardline` binary: its entity types, shared with the tests.

pub mod account;
pub mod membership;

use std::time::Duration;

use shardline::EntitySettings;

pub use account::{Account, AccountCmd, AccountReply, Echo};

/// Settings of the demo's account type.
pub fn account_settings(shards: u32) -> EntitySettings {
    EntitySettings::new("account")
        .shards(shards)
        .ask_timeout(Duration::from_secs(5))
        .hand_off_timeout(Duration::from_secs(5))
}
