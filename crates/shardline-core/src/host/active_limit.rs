//! How many entities of one type a node keeps in memory, and which ones go when a new one comes:
//! passivation by a budget instead of by idle time alone.
//!
//! Idle passivation bounds memory only as fast as entities go quiet: a burst of distinct ids (a
//! scan, a batch job, a crawler) fills a node without bound before any of them is idle for long.
//! [`ActiveLimit`] holds the entities in memory in recency order, and every entity that comes in
//! past the limit pushes one out, which the driver passivates.
//!
//! Least-recently-used alone lets such a scan push out the hot entities, each of which then
//! recovers from its journal on its next message. [`PassivationPolicy::FrequencyAdmission`] is
//! Akka's W-TinyLFU: new entities enter a small window (1% of the limit), and one leaving the
//! window enters the main part only if it was asked for more often than the main part's least
//! recently used entity, counted in a small sketch of recent frequencies. Ids seen once leave
//! from the window; the hot set stays. (Akka's main part is segmented, probation and protected;
//! here it is one recency list, which loses little when the hot set fits.)
//!
//! ```
//! use shardline_core::host::{ActiveLimit, PassivationPolicy};
//!
//! let mut limit = ActiveLimit::new(2, PassivationPolicy::LeastRecentlyUsed);
//! assert!(limit.touch("a").is_empty());
//! assert!(limit.touch("b").is_empty());
//! limit.touch("a");
//! assert_eq!(limit.touch("c"), vec!["b"], "b was used least recently");
//! ```

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

/// Which entity leaves memory when one more comes in past the limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PassivationPolicy {
    /// The one used least recently.
    #[default]
    LeastRecentlyUsed,
    /// W-TinyLFU: a new entity passes a small window first and stays only if it is asked for
    /// more often than the entity it would replace; ids asked for once do not push out the hot
    /// set. The window is 1% of the limit; frequencies are counted in a count-min sketch of 4-bit
    /// counters, halved after ten increments per entity of the limit.
    FrequencyAdmission,
}

/// The entities of one type in memory on a node, at most `max` of them: each one that comes in
/// past the limit pushes one out, chosen by the [`PassivationPolicy`]. `K` names an entity (the
/// driver uses shard and id).
#[derive(Debug)]
pub struct ActiveLimit<K> {
    max: usize,
    policy: PassivationPolicy,
    /// Where each entity is: its slot in `slots`, and which list it is in.
    index: HashMap<K, usize>,
    slots: Vec<Slot<K>>,
    free: Vec<usize>,
    /// New entities (the whole limit under least-recently-used).
    window: List,
    /// Entities admitted past the window (frequency admission only).
    main: List,
    window_max: usize,
    sketch: Option<Sketch>,
}

#[derive(Debug)]
struct Slot<K> {
    key: Option<K>,
    prev: usize,
    next: usize,
    in_main: bool,
}

const NONE: usize = usize::MAX;

/// A doubly linked recency list over `slots`: `head` is the most recently used.
#[derive(Debug, Default)]
struct List {
    head: usize,
    tail: usize,
    len: usize,
}

impl List {
    fn new() -> Self {
        List { head: NONE, tail: NONE, len: 0 }
    }
}

impl<K: Hash + Eq + Clone> ActiveLimit<K> {
    /// At most `max` entities (at least one) in memory, chosen by `policy`.
    pub fn new(max: usize, policy: PassivationPolicy) -> Self {
        let max = max.max(1);
        let (window_max, sketch) = match policy {
            PassivationPolicy::LeastRecentlyUsed => (max, None),
            PassivationPolicy::FrequencyAdmission => ((max / 100).max(1), Some(Sketch::new(max))),
        };
        ActiveLimit {
            max,
            policy,
            index: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            window: List::new(),
            main: List::new(),
            window_max,
            sketch,
        }
    }

    /// The limit.
    pub fn max(&self) -> usize {
        self.max
    }

    /// The policy.
    pub fn policy(&self) -> PassivationPolicy {
        self.policy
    }

    /// Entities counted in memory.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Whether `key` is counted in memory.
    pub fn contains(&self, key: &K) -> bool {
        self.index.contains_key(key)
    }

    /// `key` got a message (or started): it is the most recently used. Returns the entities to
    /// passivate to keep within the limit; `key` itself is never among them.
    pub fn touch(&mut self, key: K) -> Vec<K> {
        if let Some(sketch) = &mut self.sketch {
            sketch.increment(hash_of(&key));
        }
        if let Some(&slot) = self.index.get(&key) {
            let in_main = self.slots[slot].in_main;
            let list = if in_main { &mut self.main } else { &mut self.window };
            unlink(&mut self.slots, list, slot);
            push_front(&mut self.slots, list, slot);
            return Vec::new();
        }
        let slot = self.alloc(key.clone());
        self.index.insert(key, slot);
        push_front(&mut self.slots, &mut self.window, slot);
        let mut out = Vec::new();
        while self.window.len > self.window_max {
            let candidate = self.window.tail;
            unlink(&mut self.slots, &mut self.window, candidate);
            if self.sketch.is_none() {
                out.extend(self.release(candidate));
                continue;
            }
            let main_max = self.max - self.window_max;
            if self.main.len < main_max {
                self.slots[candidate].in_main = true;
                push_front(&mut self.slots, &mut self.main, candidate);
                continue;
            }
            let victim = self.main.tail;
            if victim == NONE || !self.admits(candidate, victim) {
                out.extend(self.release(candidate));
                continue;
            }
            unlink(&mut self.slots, &mut self.main, victim);
            out.extend(self.release(victim));
            self.slots[candidate].in_main = true;
            push_front(&mut self.slots, &mut self.main, candidate);
        }
        out
    }

    /// `key` left memory some other way (idle passivation, a failed task, its shard stopped).
    pub fn remove(&mut self, key: &K) {
        if let Some(slot) = self.index.get(key).copied() {
            let list = if self.slots[slot].in_main { &mut self.main } else { &mut self.window };
            unlink(&mut self.slots, list, slot);
            self.release(slot);
        }
    }

    /// Every entity `pick` selects left memory (their shard stopped): one pass over all.
    pub fn remove_where(&mut self, pick: impl Fn(&K) -> bool) {
        let gone: Vec<K> = self.index.keys().filter(|k| pick(k)).cloned().collect();
        for k in gone {
            self.remove(&k);
        }
    }

    /// Whether the window's `candidate` is asked for more often than the main part's `victim`.
    fn admits(&self, candidate: usize, victim: usize) -> bool {
        let (Some(sketch), Some(c), Some(v)) = (&self.sketch, &self.slots[candidate].key, &self.slots[victim].key)
        else {
            return false;
        };
        sketch.estimate(hash_of(c)) > sketch.estimate(hash_of(v))
    }

    fn alloc(&mut self, key: K) -> usize {
        let slot = Slot { key: Some(key), prev: NONE, next: NONE, in_main: false };
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                self.slots.len() - 1
            }
        }
    }

    /// Frees an unlinked slot; its key, which leaves memory.
    fn release(&mut self, slot: usize) -> Option<K> {
        let key = self.slots[slot].key.take()?;
        self.index.remove(&key);
        self.free.push(slot);
        Some(key)
    }
}

fn unlink<K>(slots: &mut [Slot<K>], list: &mut List, i: usize) {
    let (prev, next) = (slots[i].prev, slots[i].next);
    if prev == NONE {
        list.head = next;
    } else {
        slots[prev].next = next;
    }
    if next == NONE {
        list.tail = prev;
    } else {
        slots[next].prev = prev;
    }
    slots[i].prev = NONE;
    slots[i].next = NONE;
    list.len -= 1;
}

fn push_front<K>(slots: &mut [Slot<K>], list: &mut List, i: usize) {
    slots[i].prev = NONE;
    slots[i].next = list.head;
    if list.head == NONE {
        list.tail = i;
    } else {
        slots[list.head].prev = i;
    }
    list.head = i;
    list.len += 1;
}

/// A count-min sketch of recent frequencies with 4-bit counters (TinyLFU): four counters per key
/// in four rows, the smallest of them its estimate. Every counter is halved after ten increments
/// per entity of the limit, so that what was hot long ago fades.
#[derive(Debug)]
struct Sketch {
    rows: [Vec<u8>; 4],
    mask: usize,
    added: usize,
    sample: usize,
}

impl Sketch {
    fn new(max: usize) -> Self {
        let width = max.next_power_of_two().max(64);
        Sketch {
            rows: std::array::from_fn(|_| vec![0; width]),
            mask: width - 1,
            added: 0,
            sample: max.saturating_mul(10),
        }
    }

    fn cells(&self, h: u64) -> [usize; 4] {
        // Four indexes from one hash: each row takes its own 16 bits, mixed with the row.
        std::array::from_fn(|row| {
            let part = (h >> (row * 16)) ^ (h.rotate_left(row as u32 * 23 + 7));
            (part as usize) & self.mask
        })
    }

    fn increment(&mut self, h: u64) {
        let cells = self.cells(h);
        for (row, cell) in cells.into_iter().enumerate() {
            let c = &mut self.rows[row][cell];
            *c = (*c + 1).min(15);
        }
        self.added += 1;
        if self.added >= self.sample {
            for row in &mut self.rows {
                for c in row.iter_mut() {
                    *c /= 2;
                }
            }
            self.added /= 2;
        }
    }

    fn estimate(&self, h: u64) -> u8 {
        let cells = self.cells(h);
        cells.into_iter().enumerate().map(|(row, cell)| self.rows[row][cell]).min().unwrap_or(0)
    }
}

/// A key's hash for the sketch: the same in every run (no random keys), so that a simulation
/// replays.
fn hash_of<K: Hash>(key: &K) -> u64 {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}
