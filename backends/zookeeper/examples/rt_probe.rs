//! Times the raw requests next to `ZkLock` on one ZooKeeper server (p50 µs):
//! `cargo run --release -p lockbench-zookeeper --example rt_probe -- 127.0.0.2:21000`.
//! A diagnostic: it showed the pipelined read costing a whole round trip
//! until `TCP_NODELAY` was set (see `keep_nodelay` in src/session.rs).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
use distlock::{AcquireOptions, DistLock};
use lockbench_zookeeper::{ZkConfig, ZkLock};
use std::time::{Duration, Instant};
use zookeeper_client as zk;

fn p50(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e6
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let connect = std::env::args().nth(1).unwrap();
    let c = zk::Client::connect(&connect).await.unwrap();
    let _ = c
        .mkdir(
            "/probe",
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await;
    let es = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let lock = ZkLock::connect(ZkConfig::new(connect.clone()))
        .await
        .unwrap();
    let n = 1500;
    for round in 0..2 {
        let (
            mut floor,
            mut piped,
            mut list,
            mut create,
            mut lockc,
            mut acq,
            mut exists,
            mut crate_,
        ) = (
            vec![],
            vec![],
            vec![],
            vec![],
            vec![],
            vec![],
            vec![],
            vec![],
        );
        let dir = lock.lock_dir("probe2");
        let _ = c
            .create(
                &dir,
                &[],
                &zk::CreateMode::Container.with_acls(zk::Acls::anyone_all()),
            )
            .await;
        for _ in 0..n {
            let t = Instant::now();
            let (_, s) = c.create("/probe/n-", &[], &es).await.unwrap();
            let t1 = Instant::now();
            c.delete(&format!("/probe/n-{s}"), None).await.unwrap();
            floor.push(t.elapsed());
            create.push(t1 - t);

            let t = Instant::now();
            let cf = c.create("/probe/n-", &[], &es);
            let lf = c.list_children("/probe");
            let (r, l) = tokio::join!(cf, lf);
            let (_, s) = r.unwrap();
            l.unwrap();
            c.delete(&format!("/probe/n-{s}"), None).await.unwrap();
            piped.push(t.elapsed());

            let t = Instant::now();
            let pre = format!("{dir}/_c_0123456789abcdef0123456789abcdef-1-lock-");
            let cf = c.create(&pre, &[], &es);
            let lf = c.list_children(&dir);
            let (r, l) = tokio::join!(cf, lf);
            let (_, s) = r.unwrap();
            l.unwrap();
            c.delete(&format!("{pre}{s}"), None).await.unwrap();
            crate_.push(t.elapsed());
            let t = Instant::now();
            c.list_children("/probe").await.unwrap();
            list.push(t.elapsed());
            let t = Instant::now();
            c.check_stat("/probe").await.unwrap();
            exists.push(t.elapsed());

            let t = Instant::now();
            let g = lock
                .acquire("probe", AcquireOptions::try_lock())
                .await
                .unwrap();
            acq.push(t.elapsed());
            g.release().await.unwrap();
            lockc.push(t.elapsed());
        }
        println!("round {round}: floor {:.0} create {:.0} piped-cycle {:.0} list {:.0} exists {:.0} lock-cycle {:.0} lock-acq {:.0} container-piped {:.0}",
        p50(floor), p50(create), p50(piped), p50(list), p50(exists), p50(lockc), p50(acq), p50(crate_));
    }
}
