//! The relay's queue bounds, the agent's reports as the relay takes them, and what ends the
//! relay's waits (the watchdog).

use super::*;

#[test]
fn an_agent_report_keeps_only_an_agents_events_and_their_documented_fields() {
    let report = |t: EventType, fields: serde_json::Value| {
        serde_json::to_vec(&serde_json::json!({"event": t.name(), "fields": fields}))
            .unwrap_or_default()
    };
    let (t, fields) = agent_report(&report(
        EventType::HostUserCreate,
        serde_json::json!({"mode": "keep", "groups": ["adm"], "result": "admin granted", "user": "root"}),
    ))
    .unwrap_or_else(|| panic!("a host-user report was refused"));
    assert_eq!(t, EventType::HostUserCreate);
    let mut keys: Vec<&str> = fields.keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(keys, ["groups", "mode"]);
    // Not an event an agent reports, or not JSON: nothing.
    let user = report(
        EventType::UserCreate,
        serde_json::json!({"name": "mallory"}),
    );
    assert!(agent_report(&user).is_none());
    let end = serde_json::to_vec(&serde_json::json!({"event": EventType::SessionEnd.name()}))
        .unwrap_or_default();
    assert!(agent_report(&end).is_none());
    assert!(agent_report(b"\xff not json").is_none());
}

#[test]
fn an_agent_report_is_taken_once_small_and_only_with_a_host_user_grant() {
    assert!(agent_event_allowed(true, false, 300));
    assert!(agent_event_allowed(true, false, AGENT_EVENT_MAX));
    assert!(
        !agent_event_allowed(false, false, 300),
        "no host-user grant"
    );
    assert!(!agent_event_allowed(true, true, 300), "a second report");
    assert!(
        !agent_event_allowed(true, false, AGENT_EVENT_MAX + 1),
        "too big"
    );
}

/// A door's commands are bounded in count (a node that does not read cannot make the proxy
/// queue without end) and in bytes (the door's window plus the request allowance); a refused
/// command leaves nothing counted.
#[test]
fn commands_are_bounded_in_number_and_bytes() {
    let (tx, _rx) = mpsc::channel(MAX_PENDING);
    let c = Commands {
        tx,
        queued: Arc::new(AtomicUsize::new(0)),
        limit: 100,
    };
    assert!(!c.send(Command::Data(Bytes::from(vec![
        0u8;
        100 + REQUEST_ROOM + 1
    ]))));
    assert_eq!(c.queued.load(Ordering::Acquire), 0);
    assert!(c.send(Command::Data(Bytes::from(vec![0u8; 100]))));
    for _ in 1..MAX_PENDING {
        assert!(c.send(Command::Eof));
    }
    assert!(!c.send(Command::Eof), "past MAX_PENDING");
    assert!(!c.send(Command::Data(Bytes::from_static(b"x"))));
    assert_eq!(
        c.queued.load(Ordering::Acquire),
        100,
        "the refused byte is not counted"
    );
}

fn grant(idle_timeout_secs: Option<u64>, disconnect_expired_cert: bool) -> SessionGrant {
    serde_json::from_value(serde_json::json!({
        "session_id": "s1",
        "node": {"id": "n1", "hostname": "web1", "labels": {}, "kind": "agent"},
        "ssh_cert": "",
        "record": "strict",
        "port_forwarding": false,
        "forward_agent": false,
        "idle_timeout_secs": idle_timeout_secs,
        "disconnect_expired_cert": disconnect_expired_cert,
        "explanation": "",
    }))
    .unwrap_or_else(|e| panic!("a grant: {e}"))
}

/// A wait that never ends: a writer stalled behind the recording, a person who never reads.
async fn forever() -> usize {
    std::future::pending().await
}

/// A wait that ends with `n` after a few of the watchdog's ticks.
async fn later(n: usize) -> usize {
    tokio::time::sleep(3 * watchdog::TICK).await;
    n
}

#[tokio::test]
async fn a_wait_that_never_ends_still_ends_the_session_on_time() {
    let now = sallyport_core::unix_now_ms();
    let closed = AtomicBool::new(false);
    let gone = AtomicBool::new(false);
    let activity = AtomicU64::new(now);
    let watch = |g: &'static SessionGrant, expires: u64, person: bool| Watch {
        grant: g,
        activity: &activity,
        cert_expires: expires,
        closed: &closed,
        person_gone: person.then_some(&gone),
    };
    let far = now / 1000 + 3600;

    // The certificate expired and the roles say to disconnect: the wait ends with that.
    let expiring: &'static SessionGrant = Box::leak(Box::new(grant(None, true)));
    let r = watched(watch(expiring, now / 1000 - 1, false), forever()).await;
    match r {
        Err(Some(Refusal::Expired(m))) => assert!(m.contains("disconnect_expired_cert"), "{m}"),
        other => panic!("expected the expired certificate to end the wait: {other:?}"),
    }

    // Idle past client_idle_timeout (the clock is the wall clock: activity set in the past).
    let idle: &'static SessionGrant = Box::leak(Box::new(grant(Some(60), false)));
    activity.store(now - 61_000, Ordering::Relaxed);
    match watched(watch(idle, far, false), forever()).await {
        Err(Some(Refusal::Expired(m))) => assert!(m.contains("client_idle_timeout"), "{m}"),
        other => panic!("expected the idle timeout to end the wait: {other:?}"),
    }
    activity.store(now, Ordering::Relaxed);

    // Nothing says to end it: work that finishes gives its answer.
    let calm: &'static SessionGrant = Box::leak(Box::new(grant(Some(60), true)));
    let r = watched(watch(calm, far, true), later(7)).await;
    assert!(matches!(r, Ok(7)), "{r:?}");

    // The person stopped sending: a wait for them ends, a wait for the recording does not.
    gone.store(true, Ordering::Release);
    assert!(matches!(
        watched(watch(calm, far, true), forever()).await,
        Err(None)
    ));
    let r = watched(watch(calm, far, false), later(8)).await;
    assert!(matches!(r, Ok(8)), "{r:?}");

    // The session's end was told (`Live::close`): every wait ends.
    closed.store(true, Ordering::Release);
    assert!(matches!(
        watched(watch(calm, far, false), forever()).await,
        Err(None)
    ));
}
