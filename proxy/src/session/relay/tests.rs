//! The relay's queue bounds, and the agent's reports as the relay takes them.

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
