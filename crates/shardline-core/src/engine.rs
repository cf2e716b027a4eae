//! The contract between an engine of the core and the driver that runs it.
//!
//! An engine is a state machine with no I/O: the driver feeds it inputs through its own
//! `handle_*` methods, each with the time it happened (`now`, milliseconds on the driver's clock),
//! then carries out the commands the engine queued, in order, and calls
//! [`handle_timeout`](Engine::handle_timeout) no later than [`poll_timeout`](Engine::poll_timeout)
//! says. What differs from one engine to the next is only its inputs and its commands; so the
//! runtime has one driver per way of running an engine (shared behind a lock, or owned by one
//! task), not one per engine.
//!
//! ```
//! use shardline_core::{Engine, NodeId, RegionCommand, RegionConfig, RegionEngine};
//!
//! let mut region: RegionEngine<&str> = RegionEngine::new(RegionConfig::new(4), NodeId::new("n1", 1));
//! // A driver's loop, once: carry out what is queued, then sleep until the next deadline.
//! region.handle_coordinator_changed(0, NodeId::new("n1", 1), 1);
//! let commands: Vec<RegionCommand<&str>> = region.drain_commands().collect();
//! assert!(!commands.is_empty(), "a new coordinator hears from the region");
//! if let Some(at) = region.poll_timeout() {
//!     region.handle_timeout(at);
//! }
//! ```

/// An engine as its driver sees it: commands out, one timer in.
pub trait Engine {
    /// What the engine asks its driver to do.
    type Command;

    /// The next command to carry out, in the order the engine queued them.
    fn poll_command(&mut self) -> Option<Self::Command>;

    /// When [`handle_timeout`](Engine::handle_timeout) must be called next (None: only an input
    /// can give the engine something to do).
    fn poll_timeout(&self) -> Option<u64>;

    /// Time passed: `now` is at or after the instant [`poll_timeout`](Engine::poll_timeout)
    /// gave. Called early it does nothing that was not due.
    fn handle_timeout(&mut self, now: u64);

    /// Every command waiting, in order.
    fn drain_commands(&mut self) -> Drain<'_, Self>
    where
        Self: Sized,
    {
        Drain(self)
    }
}

/// The commands an engine has waiting; see [`Engine::drain_commands`].
pub struct Drain<'a, E>(&'a mut E);

impl<E: Engine> Iterator for Drain<'_, E> {
    type Item = E::Command;

    fn next(&mut self) -> Option<E::Command> {
        self.0.poll_command()
    }
}
