//! The JetStream output and consumer against a real 3-node nats-server
//! cluster on loopback (routes between the nodes, a file-stored stream
//! with 3 replicas), through node failures: every message published
//! arrives complete, stored once (the stream's count), in order.
//!
//! Without nats-server the tests are skipped with a message, unless
//! `MINTGATE_REQUIRE_PEERS` is set, in which case they fail
//! (scripts/test.sh installs it).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::unreachable
)] // test code

mod common;

use std::time::Duration;

use common::{finish, publish_through, publisher, subscriber, tmp};
use mintgate_nats::cluster::{stream_now, wait_stream_ready, Cluster};
use mintgate_nats::Target;

/// A fresh folder and a 3-node cluster in it whose stream `stream` (3
/// replicas) is ready; `None` when the test is skipped.
fn setup(name: &str, stream: &str) -> Option<(std::path::PathBuf, Cluster, Target)> {
    let dir = tmp(name);
    let c = Cluster::start_for_tests(&dir.join("cluster"), 3).expect("starting the cluster")?;
    let t = c.target(stream).unwrap();
    wait_stream_ready(&t, Duration::from_secs(20)).unwrap();
    Some((dir, c, t))
}

#[test]
fn node_killed_and_restarted_mid_stream() {
    let Some((dir, mut c, t)) = setup("node", "NODE") else {
        return;
    };
    let sub = subscriber(&t, "reader");
    let (p, out) = publisher(&t, &dir.join("q"), 8);
    let stats = out.stats();
    let mut killed = None;
    publish_through(&p, "sensors/temp0", 1500, &[400, 900], |k| {
        if k == 400 {
            // the node this publisher is connected to
            let name = stats.server();
            let i = c.index_of(&name).expect("connected to a node of ours");
            eprintln!("killing {name} (-9) after {k} acknowledged");
            c.kill(i);
            killed = Some(i);
        } else if let Some(i) = killed.take() {
            eprintln!("restarting {} after {k} acknowledged", c.name(i));
            c.restart(i).unwrap();
        }
    });
    finish("node kill", p, &out, Some(sub), &t, 1500);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn stream_leader_killed() {
    let Some((dir, mut c, t)) = setup("leader", "LEADER") else {
        return;
    };
    let (p, out) = publisher(&t, &dir.join("q"), 8);
    let mut killed = None;
    publish_through(&p, "sensors/temp0", 1500, &[400, 900], |k| {
        if k == 400 {
            let leader = stream_now(&t).unwrap().leader.expect("a leader");
            let i = c.index_of(&leader).unwrap();
            eprintln!("killing the stream leader {leader} (-9) after {k} acknowledged");
            c.kill(i);
            killed = Some(i);
        } else if let Some(i) = killed.take() {
            c.restart(i).unwrap();
        }
    });
    // read after the whole stream: a consumer started now reads 1..=n
    finish("leader kill", p, &out, None, &t, 1500);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn whole_cluster_down_for_a_while_and_back() {
    let Some((dir, mut c, t)) = setup("down", "DOWN") else {
        return;
    };
    let (p, out) = publisher(&t, &dir.join("q"), 8);
    publish_through(&p, "sensors/temp0", 1000, &[300], |k| {
        eprintln!("killing all 3 nodes (-9) after {k} acknowledged, for 2 s");
        for i in 0..3 {
            c.kill(i);
        }
        // the queue keeps taking messages while nothing answers
        std::thread::sleep(Duration::from_secs(2));
        assert!(!p.status().connected);
        for i in 0..3 {
            c.restart(i).unwrap();
        }
    });
    finish("cluster down 2 s", p, &out, None, &t, 1000);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A gateway publishing into a nats-server leaf node on its own host (no
/// JetStream there) whose hub is the 3-node cluster; the leaf's link to
/// the hub is cut for 3 s (the whole hub killed -9 and started again)
/// while the gateway goes on publishing. While it is down the leaf answers
/// every publish at once with "no responders" or lets it time out, and the
/// gateway's own queue holds the data; after it the queue sends them
/// again, and the hub stores every message once and in order.
#[test]
fn leaf_node_link_to_the_hub_cut_for_a_while_and_back() {
    use mintgate_nats::cluster::Options;
    let dir = tmp("leaf");
    // the hub's JetStream in a domain of its own: the leaf's clients
    // reach its API at $JS.hub.API (a leaf without JetStream does not
    // pass the plain $JS.API on)
    let hub_opts = Options {
        leafnodes: true,
        domain: "hub".into(),
        ..Options::default()
    };
    let Some(mut hub) = Cluster::start_for_tests_with(&dir.join("hub"), 3, hub_opts).unwrap()
    else {
        return;
    };
    let t_hub = hub.target("LEAF").unwrap();
    assert_eq!(t_hub.domain, "hub");
    wait_stream_ready(&t_hub, Duration::from_secs(20)).unwrap();
    let remotes: Vec<String> = hub.leaf_urls().iter().map(|u| format!("\"{u}\"")).collect();
    let leaf_opts = Options {
        jetstream: false,
        name_prefix: "leaf".into(),
        extra: format!(
            "leafnodes {{\n  remotes = [ {{ urls: [{}] }} ]\n}}\n",
            remotes.join(", ")
        ),
        ..Options::default()
    };
    let leaf = Cluster::start_for_tests_with(&dir.join("leaf"), 1, leaf_opts)
        .unwrap()
        .unwrap();
    let t_leaf = Target {
        servers: leaf.urls(),
        ..t_hub.clone()
    };
    // the leaf is linked when the stream answers through it
    wait_stream_ready(&t_leaf, Duration::from_secs(20)).expect("the stream through the leaf");
    let (p, out) = publisher(&t_leaf, &dir.join("q"), 8);
    // at 400 acknowledged the hub goes down for 3 s while the gateway goes
    // on enqueueing; measured: what its queue held, and how long after the
    // hub was back the first of it was acknowledged
    let (held, resumed) = std::thread::scope(|scope| {
        let (cut_tx, cut_rx) = std::sync::mpsc::channel();
        let (hub, p) = (&mut hub, &p);
        let cutter = scope.spawn(move || {
            cut_rx.recv().expect("the mark");
            for i in 0..3 {
                hub.kill(i);
            }
            std::thread::sleep(Duration::from_secs(3));
            let during = p.status();
            for i in 0..3 {
                hub.restart(i).expect("the hub again");
            }
            let back = std::time::Instant::now();
            while p.status().queue.acked == during.queue.acked
                && back.elapsed() < Duration::from_secs(30)
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            (during, back.elapsed())
        });
        publish_through(p, "sensors/temp0", 1500, &[400], |k| {
            eprintln!("cutting the leaf's link to the hub after {k} acknowledged, for 3 s");
            cut_tx.send(()).unwrap();
        });
        cutter.join().unwrap()
    });
    assert!(
        held.unacked > 0 && held.queue.acked < 1500,
        "the gateway's queue holds what the hub could not store: {held:?}"
    );
    eprintln!(
        "leaf link cut for 3 s: the gateway's queue held {} messages; the first acknowledged \
         {:.2} s after the hub was back",
        held.unacked,
        resumed.as_secs_f64()
    );
    finish("leaf link cut 3 s", p, &out, None, &t_hub, 1500);
    let _ = std::fs::remove_dir_all(&dir);
}
