//! A report of several audit records (a proxy's batch of `kube.request` records) is written as
//! one: every record in the order reported, chained, and anchored by a checkpoint when the
//! batch reaches or steps over a multiple of `audit_checkpoint_every`, as records written one
//! at a time would be. SQLite, as the all-in-one runs it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sallyport_auth::{AuthConfig, AuthServer};
use sallyport_core::api::{AuditQuery, KubeRecord, KubeRequestRecord};

fn request(path: &str) -> KubeRecord {
    KubeRecord::Request(KubeRequestRecord {
        user: "alice".into(),
        kube_cluster: "lab".into(),
        method: "GET".into(),
        path: path.into(),
        verb: "get".into(),
        kind: "pod".into(),
        namespace: "dev".into(),
        name: "web-1".into(),
        response_code: 200,
        allowed: true,
        reason: String::new(),
        kube_users: vec!["alice".into()],
        kube_groups: vec!["system:authenticated".into()],
        kubectl_command: Some("kubectl get".into()),
        remote_addr: "127.0.0.1:5000".into(),
    })
}

/// The count in "..., N not yet anchored" of a verify that passed.
async fn not_anchored(auth: &AuthServer) -> u64 {
    let v = auth.audit_verify().await.unwrap();
    assert!(v.ok, "{}", v.message);
    let before = v.message.split(" not yet anchored").next().unwrap();
    before.rsplit(' ').next().unwrap().parse().unwrap()
}

/// An auth on SQLite in a fresh directory, a checkpoint every `every` records (and not by time).
async fn open(every: u64) -> (tempfile::TempDir, std::sync::Arc<AuthServer>) {
    sallyport_core::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = AuthConfig::new("batch", &url(&dir));
    cfg.audit_checkpoint_key = Some(dir.path().join("audit-checkpoint.key"));
    cfg.audit_checkpoint_every = every;
    cfg.audit_checkpoint_interval = Duration::from_secs(3600);
    let auth = AuthServer::open(cfg).await.unwrap();
    (dir, auth)
}

fn url(dir: &tempfile::TempDir) -> String {
    format!("sqlite:{}?mode=rwc", dir.path().join("a.db").display())
}

/// The chain's head as auth keeps it (`seq:hash`).
async fn head(db: &mut sqlx::SqliteConnection) -> String {
    use sqlx::Row;
    sqlx::query("SELECT value FROM cluster_state WHERE key = 'audit_head'")
        .fetch_one(db)
        .await
        .unwrap()
        .get(0)
}

/// The `kube.request` records in the log.
async fn kube_requests(auth: &AuthServer) -> sallyport_auth::audit_log::AuditSearch {
    auth.audit_search(&AuditQuery {
        event_type: Some("kube.request".into()),
        ..Default::default()
    })
    .await
    .unwrap()
}

/// The paths of the `kube.request` records, in the log's order.
async fn kube_paths(auth: &AuthServer) -> Vec<String> {
    kube_requests(auth)
        .await
        .records
        .iter()
        .filter_map(|r| r["path"].as_str().map(String::from))
        .collect()
}

#[tokio::test]
async fn a_batch_is_chained_in_order_and_anchored_when_it_steps_over_a_checkpoint() {
    let (_dir, auth) = open(4).await;
    let base = auth.audit_count().await.unwrap();
    let pending_at_start = not_anchored(&auth).await;

    // Written one at a time up to one short of the next multiple of 4: nothing is due.
    let singles = (3 + 4 - pending_at_start % 4) % 4;
    for i in 0..singles {
        auth.kube_records(&[request(&format!("/single/{i}"))])
            .await
            .unwrap();
    }
    assert_eq!(not_anchored(&auth).await, pending_at_start + singles);
    assert_eq!((pending_at_start + singles) % 4, 3, "one short of due");

    // Three more in one report: they step over the multiple (3 -> 6 past the last checkpoint)
    // and the checkpoint is signed at the batch's last record, leaving nothing unanchored.
    let batch: Vec<KubeRecord> = (0..3).map(|i| request(&format!("/batch/{i}"))).collect();
    auth.kube_records(&batch).await.unwrap();
    assert_eq!(auth.audit_count().await.unwrap(), base + singles + 3);
    assert_eq!(
        not_anchored(&auth).await,
        0,
        "a batch that steps over a multiple of checkpoint_every is anchored"
    );

    // In the order reported, each after the one before it in the chain.
    let found = kube_requests(&auth).await;
    let paths: Vec<&str> = found
        .records
        .iter()
        .filter_map(|r| r["path"].as_str())
        .filter(|p| p.starts_with("/batch/"))
        .collect();
    assert_eq!(paths, ["/batch/0", "/batch/1", "/batch/2"]);
    let seqs: Vec<i64> = found
        .records
        .iter()
        .filter(|r| r["path"].as_str().is_some_and(|p| p.starts_with("/batch/")))
        .filter_map(|r| r["seq"].as_i64())
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "consecutive records: {seqs:?}"
    );

    // A report past the limit is refused whole: nothing of it is written.
    let too_many: Vec<KubeRecord> = (0..1025).map(|i| request(&format!("/many/{i}"))).collect();
    let refused = auth.kube_records(&too_many).await;
    assert!(refused.is_err(), "a report of 1025 records is refused");
    assert_eq!(auth.audit_count().await.unwrap(), base + singles + 3);
}

/// A batch whose write fails part-way (here a record the database refuses, by a trigger this
/// test adds) leaves nothing of itself: no record before the failing one is kept, the chain's
/// head does not move, and the same records sent again are written once, in order.
#[tokio::test]
async fn a_batch_that_fails_part_way_leaves_nothing_and_can_be_sent_again() {
    use sqlx::Connection;
    let (dir, auth) = open(1000).await;
    let url = url(&dir);
    let base = auth.audit_count().await.unwrap();
    let pending = not_anchored(&auth).await;

    let mut db = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query(
        "CREATE TRIGGER poison BEFORE INSERT ON audit_events WHEN NEW.record LIKE '%/poison%' \
         BEGIN SELECT RAISE(ABORT, 'injected failure'); END",
    )
    .execute(&mut db)
    .await
    .unwrap();
    let head_before = head(&mut db).await;
    let batch = [request("/first"), request("/poison"), request("/last")];
    let failed = auth.kube_records(&batch).await;
    assert!(failed.is_err(), "the batch's write failed part-way");
    assert_eq!(
        head(&mut db).await,
        head_before,
        "the chain's head did not move"
    );
    assert_eq!(
        auth.audit_count().await.unwrap(),
        base,
        "nothing of it kept"
    );
    assert_eq!(not_anchored(&auth).await, pending, "the chain is intact");

    sqlx::query("DROP TRIGGER poison")
        .execute(&mut db)
        .await
        .unwrap();
    auth.kube_records(&batch).await.unwrap();
    assert_eq!(auth.audit_count().await.unwrap(), base + 3);
    assert_eq!(
        not_anchored(&auth).await,
        pending + 3,
        "chained after the head"
    );
    let paths = kube_paths(&auth).await;
    assert_eq!(paths, ["/first", "/poison", "/last"], "once each, in order");
}

/// Callers at once (sessions starting and ending under load) are written in shared
/// transactions, but each report stays whole and in order, nothing is lost or doubled, and
/// the chain verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reports_at_once_share_writes_and_each_stays_whole_and_in_order() {
    let (_dir, auth) = open(50).await;
    let base = auth.audit_count().await.unwrap();
    let callers = 64;
    let mut tasks = Vec::new();
    for c in 0..callers {
        let auth = auth.clone();
        tasks.push(tokio::spawn(async move {
            let report: Vec<KubeRecord> = (0..3).map(|i| request(&format!("/c{c}/{i}"))).collect();
            auth.kube_records(&report).await
        }));
    }
    for t in tasks {
        assert!(t.await.unwrap().is_ok());
    }
    assert_eq!(auth.audit_count().await.unwrap(), base + 3 * callers);
    let v = auth.audit_verify().await.unwrap();
    assert!(v.ok, "{}", v.message);
    let found = kube_requests(&auth).await;
    for c in 0..callers {
        let mine: Vec<(i64, String)> = found
            .records
            .iter()
            .filter_map(|r| Some((r["seq"].as_i64()?, r["path"].as_str()?.to_string())))
            .filter(|(_, p)| p.starts_with(&format!("/c{c}/")))
            .collect();
        let mut mine = mine;
        mine.sort();
        let paths: Vec<&str> = mine.iter().map(|(_, p)| p.as_str()).collect();
        assert_eq!(
            paths,
            [format!("/c{c}/0"), format!("/c{c}/1"), format!("/c{c}/2")],
            "caller {c}: its records, once each, in its order"
        );
        assert!(
            mine.windows(2).all(|w| w[1].0 == w[0].0 + 1),
            "caller {c}: consecutive in the chain: {mine:?}"
        );
    }
}
