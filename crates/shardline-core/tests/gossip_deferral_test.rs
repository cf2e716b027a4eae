//! The split-brain resolver's decision waits while a member it counts as reachable has gone
//! quiet: the gossip world's schedule that made both sides of a partition keep hosting.

mod gossip_net;

use gossip_net::Net;
use shardline_core::gossip::{GossipConfig, GossipEvent};
use shardline_core::SplitBrainPolicy;

/// The gossip world's schedule, on demand: everything `a` sends is lost (a one-way cut), then a
/// partition splits {a, b} from {c, d}, then `a`'s cut heals. `d` found `a` unreachable for a
/// window while `b` still counted as reachable (SWIM had not probed it across the partition yet,
/// though its statuses had stopped): three against one, it downed `a`. `a`, hearing `b` again,
/// saw two against two and kept the tie (it is the lowest member), so each side downed the
/// other and both went on. A decision waits while a member counted reachable has sent no
/// status for a status period and a probe's wait. The partition starts at moments spread over
/// the cut, and the cut heals at moments spread over the partition: which member a side probes
/// first, and when the statuses stop, decide whether a side is caught with a stale set.
#[test]
fn a_side_does_not_decide_while_a_member_it_counts_as_reachable_has_gone_quiet() {
    let config = GossipConfig::with_split_brain(SplitBrainPolicy::KeepMajority, 2_000);
    let (left, right) = (["a", "b"], ["c", "d"]);
    for split in (1_000..6_000).step_by(250) {
        for heal in (250..3_000).step_by(250) {
            let mut net = Net::new();
            for (i, name) in ["a", "b", "c", "d"].into_iter().enumerate() {
                net.start_with(name, i as u64 + 1, &["a", "b", "c", "d"], config.clone());
            }
            net.run(8_000);
            cut_in_from(&mut net, "a", &["b", "c", "d"], true);
            net.run(8_000 + split);
            for l in left {
                net.cut_both(l, &right, true);
            }
            net.run(8_000 + split + heal);
            cut_in_from(&mut net, "a", &["b"], false);
            net.run(60_000);
            let survivor_downed = |side: &[&str], other: &[&str]| {
                side.iter().any(|s| {
                    !net.logged(s, &GossipEvent::DeclaredDown)
                        && net.events.iter().any(|(n, e)| {
                            *n == format!("{s}:7000")
                                && matches!(e, GossipEvent::DownedUnreachable { nodes }
                                    if nodes.iter().any(|x| other.contains(&&*x.name)))
                        })
                })
            };
            assert!(
                !(survivor_downed(&left, &right) && survivor_downed(&right, &left)),
                "split at +{split} ms, cut healed {heal} ms later: both sides downed the other and ran on: {:?}",
                net.events
            );
        }
    }
}

/// Cuts (or joins again) what `from` sends to each of `to`, one way.
fn cut_in_from(net: &mut Net, from: &str, to: &[&str], cut: bool) {
    for t in to {
        let link = (format!("{from}:7000"), format!("{t}:7000"));
        if cut {
            net.cut.insert(link);
        } else {
            net.cut.remove(&link);
        }
    }
}
