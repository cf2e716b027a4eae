//! Proof that a member's process is gone, from its address.
//!
//! Silence proves nothing: a member that does not answer may be crashed, paused, or cut off
//! while it runs on, so the resolver waits for both sides to decide and a margin for the losing
//! one to stop. But a host that answers "nothing listens here" (a refused connection), or a
//! different node answering at the member's address, proves that the member's process no longer
//! holds its port: it has crashed or exited, and hosts nothing. Such a member is downed at once
//! and shown down without the margin, so a crashed process whose host still runs (the common
//! case: a killed pod, a panic, an OOM kill) is replaced in about the time it takes to suspect
//! it, with or without a resolver.
//!
//! Every member checks for itself (a proof is not gossiped): the member that proves it first
//! downs it through SWIM, and the others, which then hold it down with a margin, check its
//! address too before they drop the margin. One check per member per probe period.
//!
//! What this trusts: that a node's listener lives as long as it hosts anything (it closes only
//! after its shards stopped: a crash, a completed leave), and that nothing between the members
//! rejects connections on a live member's behalf. A firewall rule that *rejects* (answers with
//! a reset or "port unreachable") rather than drops makes a live member look gone; partition
//! members with rules that drop.

use super::{status_fresh, GossipEngine, GossipEvent};
use crate::gossip::identity::GossipId;
use crate::id::NodeId;

/// What a connection to a member's address found ([`GossipEngine::handle_address`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AddressAnswer {
    /// The host refused the connection: nothing listens at the address.
    Refused,
    /// A node answered the handshake: the member itself (which proves nothing about whether its
    /// probes get through), or another node, which holds the address now.
    Node(NodeId),
    /// No answer in time, or an error that says nothing about the process: proves nothing.
    Silent,
}

impl GossipEngine {
    /// What answered at `member`'s address (see [`AddressAnswer`]). A refusal, or another node
    /// answering, proves `member` gone: it is downed (SWIM spreads it) and shown down at once.
    pub fn handle_address(&mut self, now: u64, member: &GossipId, answer: AddressAnswer) {
        let Some(node) = member.node.clone() else { return };
        let evidence = match answer {
            _ if node == self.node || self.declared_down => None,
            AddressAnswer::Refused => Some("its host refused a connection to its address"),
            AddressAnswer::Node(other) if other != node => Some("another node answers at its address"),
            AddressAnswer::Node(_) => None,
            #[cfg(feature = "fault-injection")]
            AddressAnswer::Silent if self.config.fault_silence_proves_gone => Some("silence (fault injected)"),
            AddressAnswer::Silent => None,
        };
        let Some(evidence) = evidence else { return };
        if !self.gone.insert(node.clone()) {
            return;
        }
        self.log(GossipEvent::MemberGone { node: node.clone(), evidence });
        let known = self.foca.iter_members().any(|m| m.id() == member && m.state() != foca::State::Down);
        if known {
            let down = std::iter::once(foca::Member::down(member.clone()));
            if let Err(error) = self.foca.apply_many(down, true, &mut self.runtime) {
                self.log(GossipEvent::BadData { error: error.to_string() });
            }
        }
        self.after(now);
    }

    /// Asks for the addresses of members that may be gone: suspected by SWIM, whose statuses
    /// stopped (the resolver counts them unreachable), or downed by another member while this
    /// one still holds them for the margin. Each at most once per probe period.
    pub(super) fn check_addresses(&mut self, now: u64) {
        if self.declared_down {
            return;
        }
        let period = self.config.probe_period_ms;
        let mut ask: Vec<GossipId> = Vec::new();
        for m in self.foca.iter_members() {
            let stale = status_fresh(&self.status_seen, &self.config, now, m) == Some(false);
            if m.state() == foca::State::Suspect || (m.state() == foca::State::Alive && stale) {
                ask.push(m.id().clone());
            }
        }
        ask.extend(
            self.down
                .iter()
                .filter(|(node, (_, since))| self.held_for_margin(node, *since, now))
                .map(|(_, (id, _))| id.clone()),
        );
        for member in ask {
            let Some(node) = member.node.clone() else { continue };
            if self.gone.contains(&node) || self.checked_at.get(&node).is_some_and(|at| now < at + period) {
                continue;
            }
            self.checked_at.insert(node, now);
            self.commands.push_back(super::GossipCommand::CheckAddress { member });
        }
    }
}
