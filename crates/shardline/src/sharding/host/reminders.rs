//! The task that reads and fires one hosted shard's durable reminders (see
//! [`sharding::reminder`](crate::sharding::reminder) for what reminders are): it reads the
//! journal when the core's schedule asks, delivers each due reminder to its entity through the
//! shard host, and writes the acknowledgements of those handled, together.

use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use shardline_core::reminder::{Firing, ReminderChange, ScheduleConfig};
use shardline_core::EntityId;
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use super::ShardHost;
use crate::journal::JournalError;
use crate::sharding::claim::ShardClaim;
use crate::sharding::entity::Entity;
use crate::sharding::envelope::Body;
use crate::sharding::reminder::{unix_ms, Delivery, Reminder, ShardReminders};

/// Starts the shard's reminder task; it ends when the host is dropped or `abort`ed.
pub(crate) fn start<E: Entity>(
    host: &Arc<ShardHost<E>>,
    claim: Arc<ShardClaim>,
    config: ScheduleConfig,
) -> (Arc<ShardReminders>, tokio::task::AbortHandle) {
    let me = Arc::new(ShardReminders::new(config));
    let task = tokio::spawn(run(Arc::downgrade(host), claim, me.clone()));
    (me, task.abort_handle())
}

/// How long the task waits after the journal failed a read or an acknowledgement.
const BACKOFF: Duration = Duration::from_secs(1);

async fn run<E: Entity>(host: Weak<ShardHost<E>>, claim: Arc<ShardClaim>, me: Arc<ShardReminders>) {
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(Firing, bool)>();
    // Acknowledgements to write, kept until they commit.
    let mut acks: Vec<ReminderChange> = Vec::new();
    let shard = claim.shard();
    // Claimed before the first read: a deposed owner can then no longer store a reminder this
    // read would miss, nor acknowledge one.
    loop {
        let Some(epoch) = host.upgrade().map(|h| h.epoch()) else { return };
        match claim.ensure(epoch).await {
            Ok(()) => break,
            Err(e @ JournalError::Fenced { .. }) => {
                debug!(type_key = claim.type_key(), %shard, error = %e, "reminders not read: the shard is fenced");
                return;
            }
            Err(e) => {
                warn!(type_key = claim.type_key(), %shard, error = %e, "the shard cannot be claimed for its reminders: trying again");
                tokio::time::sleep(BACKOFF).await;
            }
        }
    }
    loop {
        // The host stops this task when it stops; a host dropped otherwise ends it here.
        if host.strong_count() == 0 {
            return;
        }
        let now = unix_ms(SystemTime::now());
        let read = me.schedule().read_due(now);
        let mut failed = false;
        if let Some(read) = read {
            let page = claim
                .journal()
                .due_reminders(claim.type_key(), shard, read.after.clone(), read.until_ms, read.max)
                .await;
            let page = page.map_err(|e| warn!(type_key = claim.type_key(), %shard, error = %e, "reminders cannot be read: trying again")).ok();
            failed |= page.is_none();
            me.schedule().read_done(&read, page);
        }
        let due = me.schedule().take_due(unix_ms(SystemTime::now()));
        if !due.is_empty() {
            let Some(h) = host.upgrade() else { return };
            for firing in due {
                fire(&h, firing, done_tx.clone());
            }
        }
        // Firings handled since: their acknowledgements, written together.
        while let Ok((firing, handled)) = done_rx.try_recv() {
            if let Some(ack) = me.schedule().fired(&firing, handled, unix_ms(SystemTime::now())) {
                acks.push(ack);
            }
        }
        if !acks.is_empty() {
            let Some(epoch) = host.upgrade().map(|h| h.epoch()) else { return };
            let written = match claim.ensure(epoch).await {
                Ok(()) => claim.journal().change_reminders(&claim.fence(epoch), acks.clone()).await,
                Err(e) => Err(e),
            };
            match written {
                Ok(()) => {
                    let mut s = me.schedule();
                    for ack in acks.drain(..) {
                        s.acked(&ack);
                    }
                }
                // The shard stays here at a newer epoch, raised while this was written: again at it.
                Err(JournalError::Fenced { .. }) if host.upgrade().is_some_and(|h| h.epoch() > epoch) => continue,
                Err(e @ JournalError::Fenced { .. }) => {
                    // A newer owner has the shard and fires its reminders.
                    debug!(type_key = claim.type_key(), %shard, error = %e, "reminders stop: the shard is fenced");
                    return;
                }
                Err(e) => {
                    warn!(type_key = claim.type_key(), %shard, error = %e, pending = acks.len(), "reminder acknowledgements cannot be written: trying again");
                    failed = true;
                }
            }
        }
        let now = unix_ms(SystemTime::now());
        let mut wait = me.schedule().next_wake(now).map(|at| Duration::from_millis(at.saturating_sub(now)));
        if failed {
            wait = Some(wait.map_or(BACKOFF, |w| w.max(BACKOFF)));
        }
        let sleep = async {
            match wait {
                Some(w) => tokio::time::sleep(w).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            got = done_rx.recv() => {
                if let Some((firing, handled)) = got {
                    if let Some(ack) = me.schedule().fired(&firing, handled, unix_ms(SystemTime::now())) {
                        acks.push(ack);
                    }
                }
            }
            _ = me.wake.notified() => {}
            _ = sleep => {}
        }
    }
}

/// Delivers a due reminder to its entity, starting it if needed; reports whether it was handled.
fn fire<E: Entity>(host: &Arc<ShardHost<E>>, firing: Firing, done: mpsc::UnboundedSender<(Firing, bool)>) {
    let (tx, rx) = oneshot::channel();
    let reminder = Reminder {
        name: firing.name.clone(),
        due_ms: firing.due_ms,
        every_ms: firing.every_ms,
        next_ms: firing.next_ms,
    };
    let id = EntityId::new(firing.entity_id.clone());
    // Given back when the shard is stopping: not handled here, the next owner fires it.
    let _ = host.try_deliver(&id, Body::Reminder(Delivery { reminder, done: tx }));
    tokio::spawn(async move {
        let handled = rx.await.unwrap_or(false);
        let _ = done.send((firing, handled));
    });
}
