//! The closed vocabularies of the wire contract: node, session, token and connector kinds,
//! session statuses and record modes. Each is an enum whose serde names are exactly the strings
//! clients, auth's database and older versions have always used, so the JSON does not change;
//! anything else is refused by name (`unknown variant `x`, expected ...`) instead of being
//! carried along as a string nobody checks.

use serde::{Deserialize, Serialize};

use crate::role::RecordMode;

/// A value that is not one of a vocabulary's words (from the database or a command line).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a {what}; expected one of: {}", expected.join(", "))]
pub struct UnknownValue {
    pub what: &'static str,
    pub value: String,
    pub expected: Vec<&'static str>,
}

macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $name:ident, $what:literal {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum $name {
            $( $(#[$vmeta])* #[serde(rename = $text)] $variant, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The word on the wire and in the database.
            pub const fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text,)+ }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = UnknownValue;

            fn from_str(s: &str) -> Result<Self, UnknownValue> {
                Self::ALL.iter().copied().find(|v| v.as_str() == s).ok_or_else(|| UnknownValue {
                    what: $what,
                    value: s.to_string(),
                    expected: Self::ALL.iter().map(|v| v.as_str()).collect(),
                })
            }
        }
    };
}

wire_enum! {
    /// How the proxy reaches a node.
    NodeKind, "node kind" {
        /// Through the tunnel its agent keeps open to the proxy.
        Agent = "agent",
        /// At its SSH address, with a per-session certificate from the OpenSSH CA.
        Agentless = "agentless",
        /// A Kubernetes cluster, through the tunnel its kube agent keeps open to the proxy.
        Kube = "kube",
    }
}

wire_enum! {
    /// What a session is, as the proxy reports it once the person asks for something.
    SessionKind, "session kind" {
        /// Granted, and nothing asked for yet (what auth writes at the grant).
        Ssh = "ssh",
        /// An interactive shell.
        Shell = "shell",
        /// A command (`ssh host cmd`, and scp or rsync copies).
        Exec = "exec",
        /// The `sftp` subsystem.
        Sftp = "sftp",
        /// A connection's port forwards (its own grant, not a session channel).
        Forward = "forward",
    }
}

wire_enum! {
    /// Where a session is in its life.
    SessionStatus, "session status" {
        /// Still open (or its proxy stopped before it could say otherwise: auth marks those
        /// `incomplete` when it starts).
        Running = "running",
        /// Ended, with its recording finished.
        Complete = "complete",
        /// Ended without a finished recording (a proxy stopped, a recording failed).
        Incomplete = "incomplete",
    }
}

wire_enum! {
    /// What a one-time token is for.
    TokenKind, "token type" {
        /// A person's sign-up (`sallyctl users add`, `users reset`).
        Signup = "signup",
        /// An agent joining as a node (`sallyctl tokens add --type=node`).
        Node = "node",
        /// A kube agent joining as a Kubernetes cluster (`sallyctl tokens add --type=kube`).
        Kube = "kube",
        /// A proxy service joining the cluster (`sallyctl tokens add --type=proxy`).
        Proxy = "proxy",
    }
}

wire_enum! {
    /// The protocol of a single sign-on connector (the resource's `kind`).
    ConnectorKind, "connector kind" {
        /// OpenID Connect.
        Oidc = "oidc",
    }
}

/// The recording mode's words, as for the enums above (the type is the role's own).
impl RecordMode {
    pub const ALL: &'static [RecordMode] = &[RecordMode::BestEffort, RecordMode::Strict];

    /// The word in a role (`record_session`), on the wire and in the audit log.
    pub const fn as_str(self) -> &'static str {
        match self {
            RecordMode::BestEffort => "best_effort",
            RecordMode::Strict => "strict",
        }
    }
}

impl std::fmt::Display for RecordMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a report about a session still open says (a proxy's `update`).
impl Default for SessionStatus {
    fn default() -> Self {
        SessionStatus::Running
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every word round-trips through JSON as exactly the string it always was, through
    /// `FromStr` and `Display` too, and anything else is refused by name.
    fn words<T>(all: &[T], want: &[&str])
    where
        T: Serialize + for<'de> Deserialize<'de> + std::fmt::Display + PartialEq + std::fmt::Debug,
    {
        let got: Vec<String> = all.iter().map(|v| v.to_string()).collect();
        assert_eq!(got, want);
        for (v, w) in all.iter().zip(want) {
            let json = serde_json::to_string(v).unwrap_or_default();
            assert_eq!(json, format!("\"{w}\""));
            let back: T = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{w}: {e}"));
            assert_eq!(&back, v);
        }
    }

    #[test]
    fn the_wire_keeps_its_words() {
        words(NodeKind::ALL, &["agent", "agentless", "kube"]);
        words(
            SessionKind::ALL,
            &["ssh", "shell", "exec", "sftp", "forward"],
        );
        words(SessionStatus::ALL, &["running", "complete", "incomplete"]);
        words(TokenKind::ALL, &["signup", "node", "kube", "proxy"]);
        words(ConnectorKind::ALL, &["oidc"]);
        words(RecordMode::ALL, &["best_effort", "strict"]);
        for m in RecordMode::ALL {
            assert_eq!(serde_json::to_value(m).ok(), Some(m.as_str().into()));
        }
        assert_eq!("exec".parse::<SessionKind>(), Ok(SessionKind::Exec));
    }

    #[test]
    fn unknown_words_are_a_clear_error() {
        let e = serde_json::from_str::<NodeKind>("\"agnet\"")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert_eq!(
            e,
            "unknown variant `agnet`, expected one of `agent`, `agentless`, `kube` at line 1 column 7"
        );
        let e = serde_json::from_str::<crate::api::NodeInfo>(
            r#"{"id":"1","hostname":"web1","labels":{},"kind":"docker"}"#,
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(
            e.starts_with("unknown variant `docker`, expected one of `agent`, `agentless`, `kube`"),
            "{e}"
        );
        let e = "paused"
            .parse::<SessionStatus>()
            .err()
            .map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some(
                "\"paused\" is not a session status; expected one of: running, complete, incomplete"
            )
        );
        let e =
            serde_json::from_str::<crate::api::AddJoinToken>(r#"{"type":"proxy","ttl_secs":60}"#)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
        assert!(
            e.starts_with("unknown variant `proxy`, expected one of `signup`, `node`, `kube`"),
            "{e}"
        );
    }
}
