//! A device registry: homes remember their devices, device sessions come and go.
//!
//! - `Device` entities (`home-3/thermostat`) are sessions: they hold the last reading and are
//!   passivated after two seconds without messages. Their `stopped` hook tells their home that they
//!   went offline. A partition key keeps every device of one home in one shard, so they live on
//!   one node and move together.
//! - `Home` entities keep the registry: every device seen, its last reading, and which are
//!   online. They implement `hand_over`/`take_over`, so the registry survives rebalancing and a
//!   graceful leave.
//!
//! Two nodes start, devices report, go idle and are passivated, a third node joins (shards
//! move), the first one leaves (they move again), and every home still knows its devices.
//!
//! ```sh
//! cargo run -p shardline --example devices
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardline::{Cluster, Entity, EntityContext, EntityHandle, EntityId, EntitySettings, Gossip, Request};

const HOMES: u32 = 6;
const DEVICES: [&str; 3] = ["thermostat", "door", "lamp"];

/// `home-3/thermostat` → `home-3`: the part of an id that chooses the shard.
fn home_of(id: &str) -> &str {
    id.split_once('/').map_or(id, |(home, _)| home)
}

/// A device's session: the reading it last sent.
struct Device {
    last: Option<i32>,
}

#[shardline::messages]
impl Entity for Device {
    fn new(_id: &EntityId) -> Self {
        Device { last: None }
    }

    /// A reading from the device, passed on to its home.
    #[message]
    fn report(&mut self, ctx: &EntityContext, reading: i32) {
        self.last = Some(reading);
        tell_home(ctx, Seen { device: ctx.id().as_str().to_string(), reading });
    }

    async fn stopped(&mut self, ctx: &mut EntityContext) {
        tell_home(ctx, Offline { device: ctx.id().as_str().to_string() });
    }
}

fn tell_home(ctx: &EntityContext, msg: impl Request<HomeMessage, HomeReply>) {
    let home = home_of(ctx.id().as_str()).to_string();
    if let Some(homes) = ctx.entities().handle::<Home>() {
        if let Err(e) = homes.entity_ref(&home).tell(msg) {
            eprintln!("{home} not told: {e}");
        }
    }
}

#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq)]
struct Registry {
    /// Device → (last reading, online).
    devices: BTreeMap<String, (i32, bool)>,
}

/// A home's registry of devices.
struct Home(Registry);

#[shardline::messages]
impl Entity for Home {
    fn new(_id: &EntityId) -> Self {
        Home(Registry::default())
    }

    #[message]
    fn seen(&mut self, device: String, reading: i32) {
        self.0.devices.insert(device, (reading, true));
    }

    #[message]
    fn offline(&mut self, device: String) {
        if let Some(d) = self.0.devices.get_mut(&device) {
            d.1 = false;
        }
    }

    /// Every device seen, with its last reading and whether it is online.
    #[message]
    fn devices(&self) -> Registry {
        self.0.clone()
    }

    fn hand_over(&self) -> Option<Vec<u8>> {
        postcard::to_allocvec(&self.0).ok()
    }

    fn take_over(_id: &EntityId, data: &[u8]) -> Option<Self> {
        postcard::from_bytes(data).ok().map(Home)
    }
}

async fn node(
    name: &str,
    seed: Option<&Cluster>,
) -> Result<(Cluster, EntityHandle<Device>, EntityHandle<Home>), Box<dyn std::error::Error>> {
    let mut builder = Cluster::builder().cluster_name("devices").node_name(name);
    if let Some(seed) = seed {
        builder = builder.membership(Gossip::new([seed.local_addr().to_string()]));
    }
    let cluster = builder.build().await?;
    let devices = cluster
        .register::<Device>(
            EntitySettings::new("device").shards(32).partition_key(home_of).passivate_after(Duration::from_secs(2)),
        )
        .await?;
    let homes = cluster.register::<Home>(EntitySettings::new("home").shards(32)).await?;
    Ok((cluster, devices, homes))
}

async fn registries(homes: &EntityHandle<Home>) -> Result<Vec<Registry>, shardline::Error> {
    let mut all = Vec::new();
    for h in 0..HOMES {
        all.push(homes.entity_ref(format!("home-{h}")).ask(Devices).await?);
    }
    Ok(all)
}

/// Polls the registries until `done` holds (at most 20 s).
async fn wait_until(
    homes: &EntityHandle<Home>,
    done: impl Fn(&[Registry]) -> bool,
    what: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let start = std::time::Instant::now();
    while !done(&registries(homes).await?) {
        if start.elapsed() > Duration::from_secs(20) {
            return Err(format!("timed out waiting for {what}: {:?}", registries(homes).await?).into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (a, devices_a, _) = node("a", None).await?;
    let (_b, devices_b, homes_b) = node("b", Some(&a)).await?;
    // Let the first rebalance finish, so that the reports below meet no moving shard.
    let start = std::time::Instant::now();
    while homes_b.hosted_shards().len() < 16 || devices_b.hosted_shards().len() < 16 {
        if start.elapsed() > Duration::from_secs(20) {
            return Err("b was given no shards".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for h in 0..HOMES {
        for (i, d) in DEVICES.iter().enumerate() {
            let id = format!("home-{h}/{d}");
            devices_a.entity_ref(&id).ask(Report { reading: h as i32 * 10 + i as i32 }).await?;
            // One shard for all devices of a home.
            assert_eq!(devices_a.shard_of(&id), devices_a.shard_of(format!("home-{h}")));
        }
    }
    let all = HOMES as usize * DEVICES.len();
    let online = |r: &[Registry]| r.iter().flat_map(|r| r.devices.values()).filter(|d| d.1).count();
    // Devices tell their homes, which may live on the other node: wait for every tell.
    wait_until(&homes_b, |r| online(r) == all, "every device online").await?;
    println!("devices online after reporting: {all}");

    // Idle devices are passivated; their stop hooks mark them offline.
    wait_until(&homes_b, |r| online(r) == 0, "every device passivated").await?;
    let before = registries(&homes_b).await?;
    println!(
        "devices online after two idle seconds: 0 (device sessions in memory on a: {})",
        devices_a.local_entities()
    );

    // A third node joins, then the first leaves: shards move twice, registries with them.
    let (_c, _, homes_c) = node("c", Some(&a)).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    a.leave().await?;
    let after = registries(&homes_c).await?;
    let known: usize = after.iter().map(|r| r.devices.len()).sum();
    println!("devices known to their homes after a join and a leave: {known}");
    if after != before || known != all {
        return Err("a home lost part of its registry".into());
    }
    Ok(())
}
