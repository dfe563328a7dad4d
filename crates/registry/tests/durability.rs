//! `Servers` in each durability profile: the record results.json gets,
//! checked against what the servers themselves report.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use lockbench_registry::{Durability, Servers, Topology, EXTERNAL_DURABILITY};

#[test]
fn start_keeps_each_topology_as_it_was() {
    for t in [
        Topology::RedisSingle,
        Topology::RedisIndependent(5),
        Topology::RedisPrimaryReplica,
        Topology::RedisCluster {
            masters: 3,
            replicas: 1,
        },
    ] {
        assert_eq!(
            Servers::default_durability(t),
            Durability::Volatile,
            "{t:?}"
        );
    }
    for t in [
        Topology::Postgres,
        Topology::Zookeeper,
        Topology::ZookeeperEnsemble(3),
        Topology::Etcd,
        Topology::EtcdCluster(3),
    ] {
        assert_eq!(Servers::default_durability(t), Durability::Durable, "{t:?}");
    }
    let s = Servers::start(Topology::RedisSingle).unwrap();
    let r = s.durability_record();
    assert_eq!(r["profile"], "volatile");
    assert_eq!(
        r["servers"][0]["flags"],
        serde_json::json!(["--save", "", "--appendonly", "no"])
    );
}

#[test]
fn the_record_names_each_server_its_flags_and_the_file_system() {
    let s = Servers::start_with(Topology::RedisSingle, Durability::Durable).unwrap();
    let r = s.durability_record();
    assert_eq!(r["profile"], "durable");
    let node = &s.nodes()[0];
    let server = &r["servers"][0];
    assert_eq!(server["node"], node.host_port());
    assert_eq!(server["kind"], "redis");
    let flags: Vec<&str> = server["flags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert!(
        flags.windows(2).any(|w| w == ["--appendonly", "yes"]),
        "{flags:?}"
    );
    assert!(
        flags.windows(2).any(|w| w == ["--appendfsync", "always"]),
        "{flags:?}"
    );
    let fs = fleet::filesystem_type(node.dir()).unwrap();
    assert_eq!(r["filesystem"], fs.as_str());
    assert_eq!(server["filesystem"], fs.as_str());
}

#[test]
fn a_volatile_postgres_says_so_and_is() {
    let s = Servers::start_with(Topology::Postgres, Durability::Volatile).unwrap();
    let Servers::Postgres(f) = &s else {
        panic!("{s:?}")
    };
    assert_eq!(f.psql("SHOW synchronous_commit").unwrap(), "off");
    let r = s.durability_record();
    assert_eq!(r["profile"], "volatile");
    assert_eq!(r["servers"][0]["kind"], "postgresql");
    assert_eq!(
        r["servers"][0]["flags"],
        serde_json::json!(["-c", "synchronous_commit=off"])
    );
}

#[test]
fn an_external_endpoint_is_unknown() {
    let r = Servers::External.durability_record();
    for k in ["profile", "servers", "filesystem"] {
        assert_eq!(r[k], EXTERNAL_DURABILITY, "{k}");
    }
    assert!(Servers::External.durability().is_none());
}
