//! Audit records: versioned JSON, each chained to the one before by SHA-256 so that an edit or a
//! deletion anywhere shows up in `sallyctl audit verify`, and signed checkpoints of the chain
//! that anchor it outside the database.
//!
//! A record is a flat JSON object: `event`, `time`, `uid`, `cluster_name`, `user`, the event's
//! own fields, then `seq`, `prev_hash` and `hash`. `hash` is SHA-256 over `prev_hash` and the
//! canonical (key-sorted) JSON of everything but `hash`. serde_json escapes every control
//! character, so user-supplied text cannot forge lines or terminal sequences in the log.
//!
//! The formula is public, so the chain alone only finds careless edits: whoever can write the
//! database can change a record and re-hash every record after it. A [`Checkpoint`] closes that:
//! auth signs "record `seq` has hash `hash`" with an Ed25519 key kept outside the database (an
//! OpenSSH SSHSIG signature, namespace [`CHECKPOINT_NAMESPACE`], so `ssh-keygen -Y verify` can
//! check one too), and each checkpoint names the one before it. [`verify_anchored`] then finds
//! a re-hashed chain (it no longer has the signed hash), a forged or altered checkpoint (bad
//! signature), a removed checkpoint (a gap in the checkpoints' own chain) and a cut tail (a
//! checkpoint past the end, or the last checkpoint auth remembers missing). Records after the
//! last checkpoint are reported as not yet anchored: until signed they are only as safe as the
//! database. Nothing here protects against whoever holds the signing key.
//!
//! Which events exist and what their fields mean is [`catalogue`]'s: an [`Event`] is made from
//! an [`EventType`] only.
//!
//! This module does no I/O: auth loads the records, checkpoints and key and calls these.

use russh::keys::ssh_key::{HashAlg, LineEnding, PrivateKey, PublicKey, SshSig};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub mod catalogue;

pub use catalogue::EventType;

pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
pub const VERSION: u64 = 1;

/// An event before it is sealed into the chain.
#[derive(Debug, Clone)]
pub struct Event {
    pub event: EventType,
    pub user: Option<String>,
    pub fields: Map<String, Value>,
}

impl Event {
    pub fn new(event: EventType, user: Option<&str>) -> Self {
        Event {
            event,
            user: user.map(str::to_string),
            fields: Map::new(),
        }
    }

    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.fields.insert(key.into(), value.into());
        self
    }
}

/// `s` as PostgreSQL can store it: its `text` and `jsonb` refuse U+0000, which SQLite keeps.
/// A NUL becomes U+FFFD, as an invalid byte does in a recording.
pub fn storable_text(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains('\0') {
        s.replace('\0', "\u{fffd}").into()
    } else {
        s.into()
    }
}

/// [`storable_text`] of an owned string: the same string, not a copy, when it has no NUL (every
/// record is made storable, and almost none has one).
fn storable_string(s: String) -> String {
    if s.contains('\0') {
        storable_text(&s).into_owned()
    } else {
        s
    }
}

/// `v` with every string in it [`storable_text`] (keys too).
fn storable_value(v: Value) -> Value {
    match v {
        Value::String(s) => Value::String(storable_string(s)),
        Value::Array(a) => Value::Array(a.into_iter().map(storable_value).collect()),
        Value::Object(m) => Value::Object(storable_map(m)),
        v => v,
    }
}

fn storable_map(m: Map<String, Value>) -> Map<String, Value> {
    m.into_iter()
        .map(|(k, v)| (storable_string(k), storable_value(v)))
        .collect()
}

impl Event {
    /// The event as every database stores it: a NUL in a command, a path or a name someone
    /// typed would otherwise lose the record on PostgreSQL (and with a session's end record,
    /// the audit of what the session ran), or fail every search that reads it as `jsonb`.
    pub fn storable(self) -> Event {
        Event {
            event: self.event,
            user: self.user.map(storable_string),
            fields: storable_map(self.fields),
        }
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
    m.insert("event".into(), event.event.name().into());
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
    verify_from(0, GENESIS, records)
}

/// As [`verify`], for the records that follow record `after_seq` whose hash is `after_hash`:
/// what a checkpoint is about to sign must link to the checkpoint before it.
pub fn verify_from<'a>(
    after_seq: i64,
    after_hash: &str,
    records: impl IntoIterator<Item = &'a Value>,
) -> crate::api::AuditVerify {
    let mut prev = after_hash.to_string();
    let mut checked = 0u64;
    for (expect_seq, r) in (after_seq + 1..).zip(records) {
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
        anchored: 0,
        checkpoints: 0,
        checkpoint_key: None,
    }
}

fn bad(checked: u64, seq: i64, message: String) -> crate::api::AuditVerify {
    crate::api::AuditVerify {
        ok: false,
        checked,
        first_bad_seq: Some(seq),
        message,
        anchored: 0,
        checkpoints: 0,
        checkpoint_key: None,
    }
}

/// The response header of an audit search naming the first result that no signed checkpoint
/// covers yet (it was checked to link up to the chain head, which a database writer could have
/// rewritten too). The body stays the plain list of records.
pub const UNANCHORED_HEADER: &str = "sallyport-audit-unanchored-from";

/// The SSHSIG namespace of checkpoint signatures (`ssh-keygen -Y verify -n ...`).
pub const CHECKPOINT_NAMESPACE: &str = "sallyport-audit-checkpoint";

/// A signed statement that the chain's record `seq` has hash `hash`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub seq: i64,
    pub hash: String,
    /// Unix seconds when it was signed.
    pub time: i64,
    /// The checkpoint before this one (0 for the first), so that removing one shows.
    pub prev_seq: i64,
    /// SSHSIG, PEM-armoured, over [`Checkpoint::message`].
    pub signature: String,
}

impl Checkpoint {
    /// The exact bytes signed. Line-based and fixed so that an auditor can rebuild it by hand
    /// and check it with `ssh-keygen -Y verify`.
    pub fn message(cluster: &str, seq: i64, hash: &str, time: i64, prev_seq: i64) -> String {
        format!(
            "sallyport audit checkpoint v1\ncluster {cluster}\nseq {seq}\nhash {hash}\ntime {time}\nprevious {prev_seq}\n"
        )
    }

    pub fn sign(
        key: &PrivateKey,
        cluster: &str,
        seq: i64,
        hash: &str,
        time: i64,
        prev_seq: i64,
    ) -> Result<Checkpoint, String> {
        let msg = Self::message(cluster, seq, hash, time, prev_seq);
        let signature = key
            .sign(CHECKPOINT_NAMESPACE, HashAlg::Sha512, msg.as_bytes())
            .and_then(|s| s.to_pem(LineEnding::LF))
            .map_err(|e| format!("cannot sign the audit checkpoint: {e}"))?;
        Ok(Checkpoint {
            seq,
            hash: hash.into(),
            time,
            prev_seq,
            signature,
        })
    }

    /// Whether `key` signed exactly this checkpoint of `cluster`.
    pub fn is_signed_by(&self, key: &PublicKey, cluster: &str) -> bool {
        let Ok(sig) = SshSig::from_pem(self.signature.as_bytes()) else {
            return false;
        };
        let msg = Self::message(cluster, self.seq, &self.hash, self.time, self.prev_seq);
        key.verify(CHECKPOINT_NAMESPACE, msg.as_bytes(), &sig)
            .is_ok()
    }
}

fn when(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| unix.to_string())
}

/// Verifies the chain (as [`verify`]) and then every checkpoint against it, with the public key
/// from outside the database. `checkpoints` are in `seq` order as stored; `remembered` is the
/// last checkpoint this auth server signed, kept outside the database, so that removing the
/// newest checkpoints together with the records they cover is found too.
pub fn verify_anchored(
    records: &[Value],
    checkpoints: &[Checkpoint],
    key: &PublicKey,
    cluster: &str,
    remembered: Option<&Checkpoint>,
) -> crate::api::AuditVerify {
    let fingerprint = key.fingerprint(HashAlg::Sha256).to_string();
    let mut v = verify(records);
    v.checkpoint_key = Some(fingerprint.clone());
    if !v.ok {
        return v;
    }
    let fail = |seq: i64, message: String| crate::api::AuditVerify {
        checkpoint_key: Some(fingerprint.clone()),
        ..bad(0, seq, message)
    };
    let total = records.len() as i64;
    let mut prev_seq = 0i64;
    for cp in checkpoints {
        if !cp.is_signed_by(key, cluster) {
            return fail(
                cp.seq,
                format!(
                    "checkpoint {} is not signed by the checkpoint key {fingerprint}: it was forged or altered in the database",
                    cp.seq
                ),
            );
        }
        if cp.prev_seq != prev_seq {
            return fail(
                prev_seq + 1,
                format!(
                    "checkpoint {} follows checkpoint {}, which is missing: checkpoints were removed from the database",
                    cp.seq, cp.prev_seq
                ),
            );
        }
        if cp.seq > total {
            return fail(
                total + 1,
                format!(
                    "the log ends at record {total} but checkpoint {} signed record {} at {}: records were removed from the end",
                    cp.seq,
                    cp.seq,
                    when(cp.time)
                ),
            );
        }
        let actual = records
            .get((cp.seq - 1).max(0) as usize)
            .and_then(|r| r.get("hash"))
            .and_then(Value::as_str)
            .unwrap_or("");
        if actual != cp.hash {
            let first = prev_seq + 1;
            let which = if first == cp.seq {
                format!("record {first} was changed")
            } else {
                format!("a record from {first} to {} was changed", cp.seq)
            };
            return fail(
                first,
                format!(
                    "{which} and the chain re-hashed: record {} does not have the hash checkpoint {} signed at {}",
                    cp.seq,
                    cp.seq,
                    when(cp.time)
                ),
            );
        }
        prev_seq = cp.seq;
    }
    // The last checkpoint auth signed must be in the database exactly as signed, whatever came
    // after it: a database writer who removes checkpoints and re-hashes the records they covered
    // leaves a chain that links back to GENESIS, so only this outside copy shows the rewrite.
    if let Some(last) = remembered.filter(|r| r.is_signed_by(key, cluster)) {
        match checkpoints.iter().find(|c| c.seq == last.seq) {
            None => {
                let first = checkpoints
                    .iter()
                    .map(|c| c.seq)
                    .filter(|&s| s < last.seq)
                    .max()
                    .unwrap_or(0);
                return fail(
                    first + 1,
                    format!(
                        "checkpoint {} (signed at {}) is missing from the database, whose last checkpoint {} {}: checkpoints were removed{}",
                        last.seq,
                        when(last.time),
                        if prev_seq > last.seq {
                            "before it is"
                        } else {
                            "is"
                        },
                        first,
                        if total < last.seq {
                            format!(" and the log cut back to record {total}")
                        } else {
                            String::new()
                        }
                    ),
                );
            }
            Some(stored) if stored != last => {
                return fail(
                    last.seq,
                    format!(
                        "checkpoint {} in the database is not the one auth signed at {} (kept in audit-checkpoint.last): checkpoints were removed and the chain signed again",
                        last.seq,
                        when(last.time)
                    ),
                );
            }
            Some(_) => {}
        }
        let actual = records
            .get((last.seq - 1).max(0) as usize)
            .and_then(|r| r.get("hash"))
            .and_then(Value::as_str);
        if actual != Some(last.hash.as_str()) {
            return fail(
                last.seq,
                format!(
                    "record {} does not have the hash auth signed for it at {} (kept in audit-checkpoint.last): the chain was rewritten",
                    last.seq,
                    when(last.time)
                ),
            );
        }
    }
    let anchored = prev_seq.max(0) as u64;
    let pending = v.checked.saturating_sub(anchored);
    v.anchored = anchored;
    v.checkpoints = checkpoints.len() as u64;
    v.message = format!(
        "{} records, chain intact; {anchored} anchored by {} signed checkpoint{} (key {fingerprint}), {pending} not yet anchored",
        v.checked,
        checkpoints.len(),
        if checkpoints.len() == 1 { "" } else { "s" }
    );
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(n: i64) -> Vec<Value> {
        let mut prev = GENESIS.to_string();
        (1..=n)
            .map(|seq| {
                let e = Event::new(EventType::UserLogin, Some("alice"))
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

    /// `chain(n)` with a checkpoint at each of `at`, signed by `key`.
    fn anchored(c: &[Value], at: &[i64], key: &PrivateKey) -> Vec<Checkpoint> {
        let mut prev = 0;
        at.iter()
            .map(|&seq| {
                let hash = c[seq as usize - 1]["hash"].as_str().unwrap_or("");
                let cp = Checkpoint::sign(key, "example", seq, hash, 1_700_000_000, prev)
                    .unwrap_or_else(|e| panic!("{e}"));
                prev = seq;
                cp
            })
            .collect()
    }

    /// What a database writer can do without the key: edit record `seq` and re-hash the rest.
    fn rehash_from(c: &mut [Value], seq: usize) {
        c[seq - 1]["user"] = "mallory".into();
        for i in seq - 1..c.len() {
            if i > 0 {
                c[i]["prev_hash"] = c[i - 1]["hash"].clone();
            }
            let h = c[i].as_object().map(chain_hash).unwrap_or_default();
            c[i]["hash"] = h.into();
        }
    }

    fn key() -> PrivateKey {
        crate::sshcert::generate_ed25519().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn checkpoints_anchor_the_chain() {
        let k = key();
        let c = chain(10);
        let cps = anchored(&c, &[4, 8], &k);
        let v = verify_anchored(&c, &cps, k.public_key(), "example", cps.last());
        assert!(v.ok, "{}", v.message);
        assert_eq!((v.checked, v.anchored, v.checkpoints), (10, 8, 2));
        assert!(
            v.message.starts_with(
                "10 records, chain intact; 8 anchored by 2 signed checkpoints (key SHA256:"
            ) && v.message.ends_with("), 2 not yet anchored"),
            "{}",
            v.message
        );
        // The chain alone cannot see a re-hash; the checkpoints do, and name the span.
        let mut c2 = c.clone();
        rehash_from(&mut c2, 6);
        assert!(verify(&c2).ok);
        let v = verify_anchored(&c2, &cps, k.public_key(), "example", None);
        assert_eq!((v.ok, v.first_bad_seq), (false, Some(5)), "{}", v.message);
        assert!(
            v.message
                .starts_with("a record from 5 to 8 was changed and the chain re-hashed"),
            "{}",
            v.message
        );
        let cps1 = anchored(&c, &(1..=10).collect::<Vec<_>>(), &k);
        let v = verify_anchored(&c2, &cps1, k.public_key(), "example", None);
        assert_eq!((v.ok, v.first_bad_seq), (false, Some(6)), "{}", v.message);
        assert!(
            v.message.starts_with("record 6 was changed"),
            "{}",
            v.message
        );
        // Past the last checkpoint a re-hash is not visible: those records are not anchored.
        let mut c3 = c.clone();
        rehash_from(&mut c3, 9);
        assert!(verify_anchored(&c3, &cps, k.public_key(), "example", None).ok);
    }

    #[test]
    fn forged_removed_and_cut_checkpoints_are_found() {
        let k = key();
        let c = chain(10);
        let cps = anchored(&c, &[3, 6, 9], &k);
        let check = |c: &[Value], cps: &[Checkpoint], remembered, needle: &str, seq: i64| {
            let v = verify_anchored(c, cps, k.public_key(), "example", remembered);
            assert_eq!((v.ok, v.first_bad_seq), (false, Some(seq)), "{}", v.message);
            assert!(
                v.message.contains(needle),
                "{needle:?} not in {}",
                v.message
            );
        };
        // A checkpoint re-signed with another key, or altered to fit a re-hashed chain.
        let other = anchored(&c, &[3, 6, 9], &key());
        check(
            &c,
            &other,
            None,
            "checkpoint 3 is not signed by the checkpoint key",
            3,
        );
        let mut c2 = c.clone();
        rehash_from(&mut c2, 5);
        let mut forged = cps.clone();
        forged[1].hash = c2[5]["hash"].as_str().unwrap_or("").into();
        check(&c2, &forged, None, "checkpoint 6 is not signed", 6);
        // Signed for another cluster.
        let v = verify_anchored(&c, &cps, k.public_key(), "elsewhere", None);
        assert!(!v.ok);
        // A checkpoint removed from the middle, or the newest ones with the tail they cover.
        check(
            &c,
            &[cps[0].clone(), cps[2].clone()],
            None,
            "checkpoint 9 follows checkpoint 6, which is missing",
            4,
        );
        check(
            &c[..7],
            &cps,
            None,
            "the log ends at record 7 but checkpoint 9 signed record 9",
            8,
        );
        check(
            &c[..7],
            &cps[..2],
            cps.last(),
            "checkpoint 9 (signed at 2023-11-14T22:13:20Z) is missing from the database, whose last checkpoint is 6: checkpoints were removed and the log cut back to record 7",
            7,
        );
        check(&c, &[], cps.last(), "whose last checkpoint is 0", 1);
        // What auth signed before it compared the database with its own copy: every checkpoint
        // removed, the chain re-hashed from record 5 and a new checkpoint signed over it from
        // GENESIS. The chain and the new checkpoint agree; the remembered one does not.
        let mut c2 = c.clone();
        rehash_from(&mut c2, 5);
        let resigned = anchored(&c2, &[9], &k);
        assert!(verify_anchored(&c2, &resigned, k.public_key(), "example", None).ok);
        check(
            &c2,
            &resigned,
            cps.last(),
            "checkpoint 9 in the database is not the one auth signed at 2023-11-14T22:13:20Z (kept in audit-checkpoint.last): checkpoints were removed and the chain signed again",
            9,
        );
        // ...or signed past it once filler records were appended.
        let mut c3 = c2.clone();
        c3.extend(chain(12).into_iter().skip(10));
        rehash_from(&mut c3, 5);
        let resigned = anchored(&c3, &[12], &k);
        check(
            &c3,
            &resigned,
            cps.last(),
            "checkpoint 9 (signed at 2023-11-14T22:13:20Z) is missing from the database, whose last checkpoint before it is 0: checkpoints were removed",
            1,
        );
    }

    #[test]
    fn a_segment_must_link_to_the_checkpoint_before_it() {
        let c = chain(6);
        let h3 = c[2]["hash"].as_str().unwrap_or("").to_string();
        assert!(verify_from(3, &h3, &c[3..]).ok);
        assert_eq!(verify_from(3, GENESIS, &c[3..]).first_bad_seq, Some(4));
        assert_eq!(verify_from(2, &h3, &c[3..]).first_bad_seq, Some(3));
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
