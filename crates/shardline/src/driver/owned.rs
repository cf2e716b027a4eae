//! The owned driver: one task owns the engine and its runner, and waits for whichever comes
//! first, the runner's next input (from channels only it reads) or the engine's next deadline,
//! with one `sleep_until` on the node's [`Clock`]; then it carries the engine's commands out.
//!
//! Nothing else touches the engine, so there is no lock. The membership engines (lease and
//! gossip) run on it: everything they hear arrives on their own channels.

use std::future::Future;
use std::time::Duration;

use shardline_core::Engine;

use crate::clock::Clock;

/// The command type of a runner's engine.
pub(crate) type CommandOf<R> = <<R as Runner>::Engine as Engine>::Command;

/// What the driver does after an input.
pub(crate) enum Flow {
    /// Goes on.
    Go,
    /// Stops now (the commands the input queued are carried out first).
    Stop,
    /// Goes on until the engine has nothing left to do, for at most this long, then stops.
    Finish(Duration),
}

/// What runs on an owned driver: one engine's inputs and the effects of its commands.
pub(crate) trait Runner: Send {
    /// The engine.
    type Engine: Engine + Send;
    /// What the runner hears, from its own channels.
    type Input: Send;

    /// The engine.
    fn engine(&mut self) -> &mut Self::Engine;
    /// The node's clock.
    fn clock(&self) -> &Clock;
    /// The next input; None when every source is closed (the driver stops).
    fn next_input(&mut self) -> impl Future<Output = Option<Self::Input>> + Send;
    /// Hands an input to the engine.
    fn handle(&mut self, input: Self::Input, now: u64) -> Flow;
    /// Carries out one command.
    fn carry_out(&mut self, command: CommandOf<Self>);
    /// After a batch of commands.
    fn settle(&mut self) {}
    /// Whether work the engine started is still under way (an answer it waits for); an engine
    /// with none and no deadline has nothing left to do.
    fn busy(&self) -> bool {
        false
    }
}

/// Runs `runner` until its sources close or an input stops it.
pub(crate) async fn run<R: Runner>(mut runner: R) {
    carry_out(&mut runner);
    loop {
        match step(&mut runner).await {
            Flow::Go => {}
            Flow::Stop => return,
            Flow::Finish(within) => {
                let _ = tokio::time::timeout(within, finish(&mut runner)).await;
                return;
            }
        }
    }
}

/// Steps until the engine has nothing left to do: no deadline, nothing under way.
async fn finish<R: Runner>(runner: &mut R) {
    while !idle(runner) {
        if matches!(step(runner).await, Flow::Stop) {
            return;
        }
    }
}

/// Whether the engine has nothing left to do.
pub(crate) fn idle<R: Runner>(runner: &mut R) -> bool {
    runner.engine().poll_timeout().is_none() && !runner.busy()
}

/// Waits for the next input or the engine's deadline, whichever comes first, hands it to the
/// engine and carries out what it asks for.
pub(crate) async fn step<R: Runner>(runner: &mut R) -> Flow {
    let wake = runner.engine().poll_timeout().map(|t| runner.clock().at(t));
    let sleep = async {
        match wake {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    let heard = tokio::select! {
        input = runner.next_input() => Some(input),
        _ = sleep => None,
    };
    let now = runner.clock().now_ms();
    let flow = match heard {
        None => {
            runner.engine().handle_timeout(now);
            Flow::Go
        }
        Some(None) => Flow::Stop,
        Some(Some(input)) => runner.handle(input, now),
    };
    carry_out(runner);
    flow
}

/// Carries out every command waiting, then settles.
pub(crate) fn carry_out<R: Runner>(runner: &mut R) {
    while let Some(c) = runner.engine().poll_command() {
        runner.carry_out(c);
    }
    runner.settle();
}
