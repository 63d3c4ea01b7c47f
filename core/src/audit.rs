//! Audit records: versioned JSON, each chained to the one before by SHA-256 so that an edit or a
//! deletion anywhere shows up in `sallyctl audit verify`.
//!
//! A record is a flat JSON object: `event`, `time`, `uid`, `cluster_name`, `user`, the event's
//! own fields, then `seq`, `prev_hash` and `hash`. `hash` is SHA-256 over `prev_hash` and the
//! canonical (key-sorted) JSON of everything but `hash`. serde_json escapes every control
//! character, so user-supplied text cannot forge lines or terminal sequences in the log.

use serde_json::{Map, Value};

pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
pub const VERSION: u64 = 1;

/// An event before it is sealed into the chain.
#[derive(Debug, Clone)]
pub struct Event {
    pub event: String,
    pub user: Option<String>,
    pub fields: Map<String, Value>,
}

impl Event {
    pub fn new(event: &str, user: Option<&str>) -> Self {
        Event {
            event: event.into(),
            user: user.map(str::to_string),
            fields: Map::new(),
        }
    }

    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.fields.insert(key.into(), value.into());
        self
    }
}

/// Seals `event` as record number `seq` following `prev_hash`; returns the record and its hash.
pub fn seal(
    event: &Event,
    cluster: &str,
    seq: i64,
    prev_hash: &str,
    time: time::OffsetDateTime,
) -> (Value, String) {
    let mut m = event.fields.clone();
    let ts = time
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    m.insert("event".into(), event.event.clone().into());
    m.insert("time".into(), ts.into());
    m.insert("uid".into(), uuid::Uuid::new_v4().to_string().into());
    m.insert("cluster_name".into(), cluster.into());
    m.insert(
        "user".into(),
        event.user.clone().map_or(Value::Null, Value::String),
    );
    m.insert("v".into(), VERSION.into());
    m.insert("seq".into(), seq.into());
    m.insert("prev_hash".into(), prev_hash.into());
    let hash = chain_hash(&m);
    m.insert("hash".into(), hash.clone().into());
    (Value::Object(m), hash)
}

/// The hash a record must carry: over its canonical JSON without `hash`.
pub fn chain_hash(record: &Map<String, Value>) -> String {
    let mut m = record.clone();
    m.remove("hash");
    let prev = m
        .get("prev_hash")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let body = Value::Object(m).to_string();
    hex::encode(crate::sha256(format!("{prev}\n{body}").as_bytes()))
}

/// Walks records in sequence order and reports the first that breaks the chain.
pub fn verify<'a>(records: impl IntoIterator<Item = &'a Value>) -> crate::api::AuditVerify {
    let mut prev = GENESIS.to_string();
    let mut checked = 0u64;
    for (expect_seq, r) in (1i64..).zip(records) {
        let Some(m) = r.as_object() else {
            return bad(checked, expect_seq, "record is not a JSON object".into());
        };
        let seq = m.get("seq").and_then(Value::as_i64).unwrap_or(-1);
        if seq != expect_seq {
            return bad(
                checked,
                expect_seq,
                format!("record {expect_seq} is missing (next record is {seq})"),
            );
        }
        if m.get("prev_hash").and_then(Value::as_str) != Some(prev.as_str()) {
            return bad(
                checked,
                seq,
                format!("record {seq} does not follow record {}", seq - 1),
            );
        }
        let hash = chain_hash(m);
        if m.get("hash").and_then(Value::as_str) != Some(hash.as_str()) {
            return bad(checked, seq, format!("record {seq} was edited"));
        }
        prev = hash;
        checked += 1;
    }
    crate::api::AuditVerify {
        ok: true,
        checked,
        first_bad_seq: None,
        message: format!("{checked} records, chain intact"),
    }
}

fn bad(checked: u64, seq: i64, message: String) -> crate::api::AuditVerify {
    crate::api::AuditVerify {
        ok: false,
        checked,
        first_bad_seq: Some(seq),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(n: i64) -> Vec<Value> {
        let mut prev = GENESIS.to_string();
        (1..=n)
            .map(|seq| {
                let e = Event::new("user.login", Some("alice"))
                    .with("success", true)
                    .with("note", "a\nb\x1b[31m");
                let (r, h) = seal(&e, "example", seq, &prev, time::OffsetDateTime::now_utc());
                prev = h;
                r
            })
            .collect()
    }

    #[test]
    fn intact_chain_verifies() {
        let c = chain(5);
        let v = verify(&c);
        assert!(v.ok, "{}", v.message);
        assert_eq!(v.checked, 5);
        assert!(!c[0].to_string().contains('\n'));
        assert!(!c[0].to_string().contains('\x1b'));
    }

    #[test]
    fn edit_and_deletion_are_found() {
        let mut c = chain(5);
        c[2]["user"] = "mallory".into();
        let v = verify(&c);
        assert_eq!((v.ok, v.first_bad_seq), (false, Some(3)));
        let mut c = chain(5);
        c.remove(1);
        let v = verify(&c);
        assert_eq!((v.ok, v.first_bad_seq), (false, Some(2)));
        let mut c = chain(5);
        c.pop();
        assert!(
            verify(&c).ok,
            "truncating the tail is only visible against the stored head"
        );
    }
}
