//! The simulation worlds' event queue: events in time order, and in the order they were
//! scheduled when their times are equal (so that a seed always replays the same run).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

pub struct Queue<E> {
    order: BinaryHeap<Reverse<(u64, u64)>>,
    events: HashMap<u64, E>,
    next: u64,
}

impl<E> Queue<E> {
    pub fn new() -> Self {
        Queue { order: BinaryHeap::new(), events: HashMap::new(), next: 0 }
    }

    /// Schedules `ev` at `at`, or at `now` if that is already past.
    pub fn push(&mut self, now: u64, at: u64, ev: E) {
        let id = self.next;
        self.next += 1;
        self.order.push(Reverse((at.max(now), id)));
        self.events.insert(id, ev);
    }

    /// The next event and its time.
    pub fn pop(&mut self) -> Option<(u64, E)> {
        while let Some(Reverse((at, id))) = self.order.pop() {
            if let Some(ev) = self.events.remove(&id) {
                return Some((at, ev));
            }
        }
        None
    }
}
