//! The checks every schedule gets, whatever its entity type.

use std::collections::{HashMap, HashSet};

use super::observed::Decided;

/// No two instances of one entity are live at once: once an instance has decided a command, no
/// instance that decided before it decides again.
///
/// ```
/// use shardline_testkit::observed::Decided;
/// use shardline_testkit::one_live_instance;
///
/// let d = |instance, at_ms| Decided { entity: "e".into(), instance, host: "n1".into(), at_ms };
/// assert!(one_live_instance(&[d(1, 0), d(2, 10), d(2, 20)]).is_empty(), "a hand-off");
/// assert_eq!(one_live_instance(&[d(1, 0), d(2, 10), d(1, 20)]).len(), 1, "the old one decides again");
/// ```
pub fn one_live_instance(decided: &[Decided]) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: HashMap<&str, &Decided> = HashMap::new();
    let mut retired: HashSet<(&str, u64)> = HashSet::new();
    for d in decided {
        if retired.contains(&(d.entity.as_str(), d.instance)) {
            let now = current.get(d.entity.as_str()).map(|c| (c.instance, c.host.as_str(), c.at_ms));
            out.push(format!(
                "{}: instance {} on {} decided at {} ms after instance {:?} (instance, host, ms) took over: two live instances",
                d.entity, d.instance, d.host, d.at_ms, now
            ));
            continue;
        }
        if let Some(prev) = current.insert(d.entity.as_str(), d) {
            if prev.instance != d.instance {
                retired.insert((d.entity.as_str(), prev.instance));
            }
        }
    }
    out
}
