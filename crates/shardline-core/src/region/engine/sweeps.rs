//! The sweeps over the hosted shards' entities: the linger nudge and passivation, on the
//! region's own timer, so that a region's driver has one wake-up and no ticker of its own.

use super::RegionEngine;
use crate::region::command::RegionCommand;

/// The shortest time between two passivation sweeps.
const MIN_IDLE_SWEEP_MS: u64 = 500;

impl<M> RegionEngine<M> {
    /// Asks for the sweeps that are due, when a shard is hosted here, and sets the next ones.
    pub(super) fn sweep_if_due(&mut self, now: u64) {
        let hosts = self.shards.iter().any(|s| s.hosted_epoch().is_some());
        if let (Some(at), Some(every)) = (self.sweep_linger_at, self.config.linger_sweep_ms) {
            if at <= now {
                if hosts {
                    self.commands.push_back(RegionCommand::SweepLingering);
                }
                self.sweep_linger_at = Some(now + every.max(1));
            }
        }
        if let (Some(at), Some(after_ms)) = (self.sweep_idle_at, self.config.passivate_after_ms) {
            if at <= now {
                if hosts {
                    self.commands.push_back(RegionCommand::PassivateIdle { after_ms });
                }
                self.sweep_idle_at = Some(now + (after_ms / 2).max(MIN_IDLE_SWEEP_MS));
            }
        }
    }
}
