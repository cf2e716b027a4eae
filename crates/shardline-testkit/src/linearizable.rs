//! Whether what clients saw of one entity is what a sequential model of it allows: the history
//! is linearizable when its operations can be put in one order, each at some instant between
//! its invocation and its answer, in which the model gives every answer the clients got.
//!
//! An operation answered "not applied" took no effect and is left out. One of unknown outcome
//! (a timeout, a lost connection, one still in flight when the run ended) may have taken
//! effect at any time after its invocation, or never: the search tries both, and checks no
//! answer for it.
//!
//! The search is Wing and Gong's, with the memo of Lowe's refinement (a set of operations
//! placed and a model state are explored once), as Knossos and Porcupine do.

use std::collections::HashSet;
use std::hash::Hash;

/// How an operation ended, as its client saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer<R> {
    /// Answered with this reply.
    Ok(R),
    /// Refused before it took effect (the error said it was not processed).
    NotApplied,
    /// May or may not have taken effect.
    Unknown,
}

/// One operation on one entity.
#[derive(Clone, Debug)]
pub struct Op<C, R> {
    /// What was asked.
    pub command: C,
    /// When it was first sent: any clock the history shares, or a counter of the history's
    /// events in the order they happened.
    pub invoke: u64,
    /// When its answer came, on the same clock; ignored for [`Answer::Unknown`].
    pub complete: u64,
    /// How it ended.
    pub answer: Answer<R>,
}

/// What the search found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// An order exists.
    Holds,
    /// None does. `placed` is the most answered operations any order got through, `stuck`
    /// describes the operations none of which could come next there.
    Violated {
        /// The most answered operations placed by any order tried.
        placed: usize,
        /// Why the search stopped at that deepest point.
        stuck: String,
    },
    /// The search gave up after this many states (too many operations of unknown outcome).
    Undecided(u64),
}

/// Searches for an order of `ops` that the model allows, from `initial`, exploring at most
/// `budget` states.
///
/// ```
/// use shardline_testkit::linearizable::{check, Answer, Op, Verdict};
///
/// // A register: a write answers nothing, a read answers the value.
/// let step = |s: &mut u8, c: &Option<u8>| match c {
///     Some(v) => { *s = *v; None }
///     None => Some(*s),
/// };
/// let op = |command, invoke, complete, answer| Op { command, invoke, complete, answer };
/// let overlapping = [op(Some(1), 0, 10, Answer::Ok(None)), op(None, 5, 6, Answer::Ok(Some(1)))];
/// assert_eq!(check(0, &overlapping, step, 1_000), Verdict::Holds);
/// let stale = [op(Some(1), 0, 10, Answer::Ok(None)), op(None, 11, 12, Answer::Ok(Some(0)))];
/// assert!(matches!(check(0, &stale, step, 1_000), Verdict::Violated { .. }));
/// ```
pub fn check<S, C, R>(initial: S, ops: &[Op<C, R>], step: impl Fn(&mut S, &C) -> R, budget: u64) -> Verdict
where
    S: Clone + Eq + Hash,
    R: PartialEq + std::fmt::Debug,
    C: std::fmt::Debug,
{
    let mut ops: Vec<&Op<C, R>> = ops.iter().filter(|o| o.answer != Answer::NotApplied).collect();
    ops.sort_by_key(|o| o.invoke);
    let ends: Vec<u64> =
        ops.iter().map(|o| if matches!(o.answer, Answer::Ok(_)) { o.complete } else { u64::MAX }).collect();
    let must = ops.iter().filter(|o| matches!(o.answer, Answer::Ok(_))).count();
    let words = ops.len().div_ceil(64);
    let mut seen: HashSet<(Vec<u64>, S)> = HashSet::new();
    // Depth-first: (placed, state, answered placed).
    let mut stack: Vec<(Vec<u64>, S, usize)> = vec![(vec![0; words], initial, 0)];
    let mut explored = 0u64;
    let mut deepest = (0usize, String::new());
    let is_set = |placed: &[u64], i: usize| placed[i / 64] & (1 << (i % 64)) != 0;
    while let Some((placed, state, answered)) = stack.pop() {
        if answered == must {
            return Verdict::Holds;
        }
        explored += 1;
        if explored > budget {
            return Verdict::Undecided(explored);
        }
        // The next one must start before every answered operation still to place has ended.
        let horizon = (0..ops.len()).filter(|&i| !is_set(&placed, i)).map(|i| ends[i]).min().unwrap_or(u64::MAX);
        let mut tried = Vec::new();
        for i in (0..ops.len()).filter(|&i| !is_set(&placed, i)) {
            if ops[i].invoke > horizon {
                break;
            }
            let mut next = state.clone();
            let got = step(&mut next, &ops[i].command);
            let fits = match &ops[i].answer {
                Answer::Ok(want) => *want == got,
                _ => true,
            };
            if !fits {
                if answered >= deepest.0 {
                    tried.push(format!("{:?} answered {:?}, the model {:?}", ops[i].command, ops[i].answer, got));
                }
                continue;
            }
            let mut p = placed.clone();
            p[i / 64] |= 1 << (i % 64);
            if seen.insert((p.clone(), next.clone())) {
                let a = answered + usize::from(matches!(ops[i].answer, Answer::Ok(_)));
                stack.push((p, next, a));
            }
        }
        if answered >= deepest.0 && !tried.is_empty() {
            deepest = (answered, tried.join("; "));
        }
    }
    Verdict::Violated { placed: deepest.0, stuck: deepest.1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Counter = Op<Option<u64>, u64>;

    /// A counter: `Some(n)` adds n and answers the total, `None` reads it.
    fn step(s: &mut u64, c: &Option<u64>) -> u64 {
        *s += c.unwrap_or(0);
        *s
    }

    fn op(command: Option<u64>, invoke: u64, complete: u64, answer: Answer<u64>) -> Counter {
        Op { command, invoke, complete, answer }
    }

    #[test]
    fn an_add_of_unknown_outcome_may_take_effect_late_or_never() {
        let late = [op(Some(5), 0, 1, Answer::Unknown), op(None, 2, 3, Answer::Ok(0)), op(None, 4, 5, Answer::Ok(5))];
        assert_eq!(check(0, &late, step, 10_000), Verdict::Holds);
        let never = [op(Some(5), 0, 1, Answer::Unknown), op(None, 2, 3, Answer::Ok(0))];
        assert_eq!(check(0, &never, step, 10_000), Verdict::Holds);
    }

    #[test]
    fn an_add_answered_not_applied_must_not_show() {
        let shows = [op(Some(5), 0, 1, Answer::NotApplied), op(None, 2, 3, Answer::Ok(5))];
        assert!(matches!(check(0, &shows, step, 10_000), Verdict::Violated { .. }));
    }

    #[test]
    fn an_effect_that_goes_away_is_caught() {
        // What an entity that keeps state outside its journal shows after a crash.
        let lost = [op(Some(2), 0, 1, Answer::Ok(2)), op(Some(3), 2, 3, Answer::Ok(5)), op(None, 4, 5, Answer::Ok(3))];
        assert!(matches!(check(0, &lost, step, 10_000), Verdict::Violated { placed: 2, .. }));
    }

    #[test]
    fn concurrent_adds_may_take_effect_in_either_order() {
        let h = [op(Some(1), 0, 10, Answer::Ok(3)), op(Some(2), 1, 9, Answer::Ok(2)), op(None, 11, 12, Answer::Ok(3))];
        assert_eq!(check(0, &h, step, 10_000), Verdict::Holds);
        // ... but not both first.
        let h = [op(Some(1), 0, 10, Answer::Ok(1)), op(Some(2), 1, 9, Answer::Ok(2))];
        assert!(matches!(check(0, &h, step, 10_000), Verdict::Violated { .. }));
    }

    #[test]
    fn the_search_says_when_it_gives_up() {
        let many: Vec<Counter> = (0..40)
            .map(|i| op(Some(1 << i), i, i, Answer::Unknown))
            .chain([op(None, 100, 101, Answer::Ok(u64::MAX))])
            .collect();
        assert!(matches!(check(0, &many, step, 1_000), Verdict::Undecided(_)));
    }
}
