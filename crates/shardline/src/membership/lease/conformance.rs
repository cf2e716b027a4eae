//! The conformance suite every [`CoordinationStore`] must pass: the in-memory store, etcd and
//! NATS KV run the same checks against a real server. Each check uses keys under its own
//! prefix and returns a description of the first broken promise.

use std::time::Duration;

use std::sync::Arc;

use shardline_core::{NodeId, ShardId, ShardMap};

use super::shard_maps::{MapStoreError, ShardMaps};
use super::store::{CoordinationStore, WatchEvent};

/// The result of a check.
pub type Check = Result<(), String>;

fn fail<T>(what: impl Into<String>) -> Result<T, String> {
    Err(what.into())
}

macro_rules! ensure {
    ($cond:expr, $($msg:tt)*) => {
        if !$cond {
            return fail(format!($($msg)*));
        }
    };
}

/// Runs every check with `ttl` as the ephemeral TTL (the NATS store's bucket TTL must match).
pub async fn run_all(shared: Arc<dyn CoordinationStore>, prefix: &str, ttl: Duration) -> Check {
    let store = &*shared;
    ephemeral_keys_expire_unless_refreshed(store, &format!("{prefix}/eph"), ttl).await?;
    compare_and_set_follows_revisions(store, &format!("{prefix}/cas")).await?;
    watch_sees_puts_deletes_and_expiry(store, &format!("{prefix}/watch"), ttl).await?;
    one_leader_at_a_time(store, &format!("{prefix}/leader"), ttl).await?;
    list_returns_exactly_the_prefix(store, &format!("{prefix}/list")).await?;
    shard_maps_fence_older_terms(shared.clone(), &format!("{prefix}/maps")).await?;
    Ok(())
}

/// Create-if-absent, refresh by revision, expiry after the TTL without refresh.
pub async fn ephemeral_keys_expire_unless_refreshed(s: &dyn CoordinationStore, p: &str, ttl: Duration) -> Check {
    let key = format!("{p}/a");
    let r1 = s.create_ephemeral(&key, b"one".to_vec(), ttl).await.map_err(|e| e.to_string())?;
    let Some(r1) = r1 else { return fail("create_ephemeral of a new key returned None") };
    ensure!(
        s.create_ephemeral(&key, b"two".to_vec(), ttl).await.map_err(|e| e.to_string())?.is_none(),
        "created twice"
    );
    // Refresh a few times across more than one TTL: the key must survive.
    let mut rev = r1;
    let start = tokio::time::Instant::now();
    while start.elapsed() < ttl + ttl / 2 {
        tokio::time::sleep(ttl / 4).await;
        let next = s.refresh(&key, b"one".to_vec(), rev, ttl).await.map_err(|e| e.to_string())?;
        let Some(next) = next else { return fail("refresh at the current revision failed") };
        ensure!(next > rev, "refresh did not raise the revision");
        rev = next;
    }
    ensure!(
        s.refresh(&key, b"x".to_vec(), rev - 1, ttl).await.map_err(|e| e.to_string())?.is_none(),
        "refresh at a stale revision succeeded"
    );
    ensure!(s.get(&key).await.map_err(|e| e.to_string())?.is_some(), "refreshed key expired");
    // Stop refreshing: gone within the TTL plus slack.
    let deadline = tokio::time::Instant::now() + ttl * 3;
    loop {
        if s.get(&key).await.map_err(|e| e.to_string())?.is_none() {
            break;
        }
        ensure!(tokio::time::Instant::now() < deadline, "an unrefreshed ephemeral key outlived 3 × TTL");
        tokio::time::sleep(ttl / 10).await;
    }
    // A lease that lapsed stays lapsed: refreshing it at its last revision must not revive it.
    ensure!(
        s.refresh(&key, b"one".to_vec(), rev, ttl).await.map_err(|e| e.to_string())?.is_none(),
        "an expired key was refreshed"
    );
    ensure!(s.get(&key).await.map_err(|e| e.to_string())?.is_none(), "a refresh revived an expired key");
    ensure!(
        s.create_ephemeral(&key, b"three".to_vec(), ttl).await.map_err(|e| e.to_string())?.is_some(),
        "cannot recreate an expired key"
    );
    s.delete(&key, None).await.map_err(|e| e.to_string())?;
    Ok(())
}

/// Durable compare-and-set: absent is revision 0; stale revisions change nothing.
pub async fn compare_and_set_follows_revisions(s: &dyn CoordinationStore, p: &str) -> Check {
    let key = format!("{p}/map");
    let _ = s.delete(&key, None).await;
    let r1 = s.compare_and_put(&key, b"v1".to_vec(), 0).await.map_err(|e| e.to_string())?;
    let Some(r1) = r1 else { return fail("put at revision 0 of an absent key failed") };
    ensure!(
        s.compare_and_put(&key, b"v1b".to_vec(), 0).await.map_err(|e| e.to_string())?.is_none(),
        "put at 0 overwrote an existing key"
    );
    let r2 = s.compare_and_put(&key, b"v2".to_vec(), r1).await.map_err(|e| e.to_string())?;
    let Some(r2) = r2 else { return fail("put at the current revision failed") };
    ensure!(
        s.compare_and_put(&key, b"v3".to_vec(), r1).await.map_err(|e| e.to_string())?.is_none(),
        "put at a stale revision succeeded"
    );
    let e = s.get(&key).await.map_err(|e| e.to_string())?;
    ensure!(e.as_ref().is_some_and(|e| e.value == b"v2" && e.revision == r2), "read back {e:?}, expected v2 at {r2}");
    ensure!(!s.delete(&key, Some(r1)).await.map_err(|e| e.to_string())?, "delete at a stale revision succeeded");
    ensure!(s.delete(&key, Some(r2)).await.map_err(|e| e.to_string())?, "delete at the current revision failed");
    ensure!(s.get(&key).await.map_err(|e| e.to_string())?.is_none(), "deleted key still readable");
    Ok(())
}

/// A watch reports puts, deletes and expiries under its prefix, and nothing else, in order for
/// each key.
pub async fn watch_sees_puts_deletes_and_expiry(s: &dyn CoordinationStore, p: &str, ttl: Duration) -> Check {
    let mut w = s.watch(&format!("{p}/")).await.map_err(|e| e.to_string())?;
    let other = format!("{p}-other/x");
    s.compare_and_put(&other, b"no".to_vec(), 0).await.map_err(|e| e.to_string())?;
    let key = format!("{p}/k");
    s.compare_and_put(&key, b"yes".to_vec(), 0).await.map_err(|e| e.to_string())?;
    let eph = format!("{p}/e");
    s.create_ephemeral(&eph, b"short".to_vec(), ttl).await.map_err(|e| e.to_string())?;
    s.delete(&key, None).await.map_err(|e| e.to_string())?;
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + ttl * 4;
    while tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(ttl, w.recv()).await {
            Ok(Some(ev)) => {
                let done = matches!(&ev, WatchEvent::Delete { key } if key == &eph);
                seen.push(ev);
                if done {
                    break;
                }
            }
            Ok(None) => return fail("watch ended"),
            Err(_) => {}
        }
    }
    let keys: Vec<String> = seen
        .iter()
        .map(|e| match e {
            WatchEvent::Put(e) => format!("put {}", e.key),
            WatchEvent::Delete { key } => format!("delete {key}"),
        })
        .collect();
    // Order holds per key only: NATS keeps ephemeral and durable keys in two buckets, whose
    // watches are two streams merged (CI once saw e's put before k's).
    let of = |k: &str| keys.iter().filter(|e| e.ends_with(&format!(" {k}"))).cloned().collect::<Vec<_>>();
    ensure!(keys.len() == 4, "watch saw {keys:?}, expected a put and a delete of {key} and of {eph}, nothing else");
    ensure!(of(&key) == [format!("put {key}"), format!("delete {key}")], "watch saw {keys:?} for {key}");
    ensure!(of(&eph) == [format!("put {eph}"), format!("delete {eph}")], "watch saw {keys:?} for {eph}");
    let _ = s.delete(&other, None).await;
    Ok(())
}

/// Leader election by create-if-absent: one winner; the key frees up when the leader stops
/// refreshing; a new leader can claim it.
pub async fn one_leader_at_a_time(s: &dyn CoordinationStore, p: &str, ttl: Duration) -> Check {
    let key = format!("{p}/leader");
    let mut winners = 0;
    for node in ["a", "b", "c"] {
        if s.create_ephemeral(&key, node.as_bytes().to_vec(), ttl).await.map_err(|e| e.to_string())?.is_some() {
            winners += 1;
        }
    }
    ensure!(winners == 1, "{winners} nodes won the election");
    let deadline = tokio::time::Instant::now() + ttl * 3;
    loop {
        if s.create_ephemeral(&key, b"d".to_vec(), ttl).await.map_err(|e| e.to_string())?.is_some() {
            break;
        }
        ensure!(tokio::time::Instant::now() < deadline, "leadership never freed up after the leader stopped");
        tokio::time::sleep(ttl / 10).await;
    }
    let e = s.get(&key).await.map_err(|e| e.to_string())?;
    ensure!(e.is_some_and(|e| e.value == b"d"), "the new leader's value is not stored");
    s.delete(&key, None).await.map_err(|e| e.to_string())?;
    Ok(())
}

/// `list` returns the keys under the prefix only.
pub async fn list_returns_exactly_the_prefix(s: &dyn CoordinationStore, p: &str) -> Check {
    for k in ["x/1", "x/2", "y/1"] {
        let key = format!("{p}/{k}");
        let _ = s.delete(&key, None).await;
        s.compare_and_put(&key, k.as_bytes().to_vec(), 0).await.map_err(|e| e.to_string())?;
    }
    let got: Vec<String> =
        s.list(&format!("{p}/x/")).await.map_err(|e| e.to_string())?.into_iter().map(|e| e.key).collect();
    ensure!(got == [format!("{p}/x/1"), format!("{p}/x/2")], "list returned {got:?}");
    for k in ["x/1", "x/2", "y/1"] {
        s.delete(&format!("{p}/{k}"), None).await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Shard maps: stored and read back whole; a write at a stale revision changes nothing and says
/// who wrote the key (its term) and at which revision.
pub async fn shard_maps_fence_older_terms(s: Arc<dyn CoordinationStore>, p: &str) -> Check {
    let maps = ShardMaps::new(s.clone(), p);
    let _ = s.delete(&format!("{p}/maps/t"), None).await;
    ensure!(maps.load("t").await.map_err(|e| e.to_string())?.is_none(), "an unwritten map was found");
    let mut map = ShardMap::new(8).map_err(|e| e.to_string())?;
    map.assign(ShardId(3), NodeId::new("a", 1), 2).map_err(|e| e.to_string())?;
    let r1 = maps.save("t", 2, &map, 0).await.map_err(|e| e.to_string())?;
    let loaded = maps.load("t").await.map_err(|e| e.to_string())?;
    ensure!(loaded.as_ref().is_some_and(|l| l.map == map && l.term == 2 && l.revision == r1), "read back {loaded:?}");
    // Same term, stale revision (a retry after a lost answer): nothing written, and the
    // conflict says who wrote the key and where it is, to write again there.
    map.assign(ShardId(4), NodeId::new("b", 1), 2).map_err(|e| e.to_string())?;
    let at = match maps.save("t", 2, &map, 0).await {
        Err(MapStoreError::Conflict { stored: Some(2), revision, .. }) if revision == r1 => revision,
        other => return fail(format!("a stale write gave {other:?}")),
    };
    let r2 = maps.save("t", 2, &map, at).await.map_err(|e| e.to_string())?;
    ensure!(r2 > r1, "the write at the current revision did not raise it");
    // A newer term takes over.
    let mut newer = map.clone();
    newer.assign(ShardId(5), NodeId::new("c", 1), 3).map_err(|e| e.to_string())?;
    maps.save("t", 3, &newer, r2).await.map_err(|e| e.to_string())?;
    // The older term's write changes nothing, and learns the newer term.
    match maps.save("t", 2, &map, r2).await {
        Err(MapStoreError::Conflict { stored: Some(3), .. }) => {}
        other => return fail(format!("an older term's write gave {other:?}")),
    }
    let loaded = maps.load("t").await.map_err(|e| e.to_string())?;
    ensure!(loaded.is_some_and(|l| l.map == newer && l.term == 3), "the newer term's map was overwritten");
    // Garbage under the key is a typed error, not a panic.
    let cur = s.get(&format!("{p}/maps/t")).await.map_err(|e| e.to_string())?.map(|e| e.revision).unwrap_or(0);
    s.compare_and_put(&format!("{p}/maps/t"), vec![0xff; 3], cur).await.map_err(|e| e.to_string())?;
    ensure!(
        matches!(maps.load("t").await, Err(MapStoreError::Corrupt { .. })),
        "an undecodable map was not reported as corrupt"
    );
    s.delete(&format!("{p}/maps/t"), None).await.map_err(|e| e.to_string())?;
    Ok(())
}
