//! What a user, role or node name may look like, which node names are reserved for the proxy
//! itself, which labels a node may carry, and the size limits of what a node or a client sends
//! (heartbeats, labels, exec commands, environment values). Names appear in certificates, file
//! paths and audit records, so they are restricted to characters that are safe in all three.

use std::collections::BTreeMap;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid {what} name {name:?}: use 1-{max} characters among a-z A-Z 0-9 . _ - @ +, starting with a letter or digit", max = MAX_NAME)]
pub struct NameError {
    pub what: &'static str,
    pub name: String,
}

pub const MAX_NAME: usize = 128;

/// Labels every node has, set by auth from the registry: a node cannot set or override them,
/// or it could claim another node's name for a role's `node_labels` (or `deny`) to match.
pub const BUILTIN_LABELS: [&str; 3] = ["hostname", "id", "kube_cluster"];
/// At most this many labels per node.
pub const MAX_LABELS: usize = 64;
/// Longest label key, in bytes.
pub const MAX_LABEL_KEY: usize = 63;
/// Longest label value, in bytes (a label command's trimmed output must fit too).
pub const MAX_LABEL_VALUE: usize = 256;
/// Longest heartbeat line an agent may send: its labels as JSON. 64 labels at the limits are
/// about 21 KiB; anything past this is not a heartbeat, and the proxy closes the tunnel.
pub const MAX_HEARTBEAT_LINE: usize = 64 * 1024;
/// Longest `exec` command. Linux takes 128 KiB per argument; 64 KiB leaves any real command
/// (Ansible's module runs pipe the module through stdin) room, and bounds what each session
/// puts into the audit log.
pub const MAX_EXEC_COMMAND: usize = 64 * 1024;
/// Longest value of an allow-listed environment variable (`LANG`, `LC_*`, `TZ`).
pub const MAX_ENV_VALUE: usize = 4096;

/// Checks a user, role, login or node name.
pub fn validate(what: &'static str, name: &str) -> Result<(), NameError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@' | '+'));
    if ok {
        Ok(())
    } else {
        Err(NameError {
            what,
            name: name.to_string(),
        })
    }
}

/// Parses `k=v,k2=v2` label lists (`--labels`, `--kube-labels`).
pub fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("label {pair:?} is not key=value"))?;
        if k.is_empty() {
            return Err(format!("label {pair:?} has an empty key"));
        }
        out.insert(k.to_string(), v.to_string());
    }
    Ok(out)
}

/// Why a node name is refused beyond its syntax: it would make the node answer, in
/// certificates auth issues for it, to a name that belongs to the proxy or to every machine.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NodeNameError {
    #[error(transparent)]
    Syntax(#[from] NameError),
    #[error(
        "node name {0:?} is reserved: it names the local machine everywhere; use the node's own host name"
    )]
    Loopback(String),
    #[error(
        "node name {0:?} reads as an IP address; a node is reached by name, so name it (--nodename)"
    )]
    Address(String),
    #[error("node name {0:?} is the cluster's name, which the proxy answers to; pick another name")]
    Cluster(String),
    #[error(
        "node name {name:?} ends in .{cluster}: names under the cluster's domain are the proxy's (every node is reached as NAME.{cluster} already); drop the suffix"
    )]
    UnderCluster { name: String, cluster: String },
    #[error("node name {0:?} is one of the proxy's own names; pick another name")]
    Proxy(String),
}

/// Checks a node name (an agent's `--nodename`, an agentless node's `--name`): the syntax of
/// [`validate`], and none of the names the proxy answers to: `localhost` and its kin, IP
/// addresses, the cluster name and anything under it, and the proxy's public names
/// (`proxy_names`, `host` or `host:port`). Compared case-insensitively, as DNS does.
pub fn validate_node(
    name: &str,
    cluster: &str,
    proxy_names: &[String],
) -> Result<(), NodeNameError> {
    validate("node", name)?;
    let lower = name.to_ascii_lowercase();
    let labels: Vec<&str> = lower.split('.').collect();
    let first = labels.first().copied().unwrap_or_default();
    let last = labels.last().copied().unwrap_or_default();
    // /etc/hosts on Debian and Red Hat maps these to loopback; RFC 6761 reserves *.localhost.
    if matches!(
        first,
        "localhost" | "localhost4" | "localhost6" | "ip6-localhost" | "ip6-loopback"
    ) || last == "localhost"
    {
        return Err(NodeNameError::Loopback(name.into()));
    }
    // inet_aton reads `127.1`, `2130706433` and `0x7f000001` as addresses too: a name whose
    // last label is a number (decimal or 0x hex) is one to a resolver, never a host name.
    let numeric = |l: &str| {
        !l.is_empty()
            && (l.bytes().all(|b| b.is_ascii_digit())
                || l.strip_prefix("0x")
                    .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit())))
    };
    if lower.parse::<std::net::IpAddr>().is_ok() || numeric(last) {
        return Err(NodeNameError::Address(name.into()));
    }
    let cluster = cluster.to_ascii_lowercase();
    if lower == cluster {
        return Err(NodeNameError::Cluster(name.into()));
    }
    if lower.ends_with(&format!(".{cluster}")) {
        return Err(NodeNameError::UnderCluster {
            name: name.into(),
            cluster,
        });
    }
    for p in proxy_names {
        let host = match p.rsplit_once(':') {
            Some((h, port)) if !h.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => p.as_str(),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.eq_ignore_ascii_case(&lower) {
            return Err(NodeNameError::Proxy(name.into()));
        }
    }
    Ok(())
}

/// Checks the labels a node presents (at join, in a heartbeat, with `sallyctl nodes add`):
/// none of [`BUILTIN_LABELS`], at most [`MAX_LABELS`], keys of 1-[`MAX_LABEL_KEY`] characters
/// among `a-z A-Z 0-9 . _ - /`, values of at most [`MAX_LABEL_VALUE`] bytes without control
/// characters (they are shown in listings and written to audit records).
pub fn validate_labels(labels: &BTreeMap<String, String>) -> Result<(), String> {
    if labels.len() > MAX_LABELS {
        return Err(format!(
            "a node has at most {MAX_LABELS} labels, not {}",
            labels.len()
        ));
    }
    for (k, v) in labels {
        if let Some(b) = BUILTIN_LABELS.iter().find(|b| b.eq_ignore_ascii_case(k)) {
            return Err(format!(
                "label {k:?} is built in: auth sets it from the registry ({b}), and a node cannot set or change it"
            ));
        }
        if k.is_empty()
            || k.len() > MAX_LABEL_KEY
            || !k
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/'))
        {
            let shown: String = k.chars().take(MAX_LABEL_KEY + 1).collect();
            return Err(format!(
                "invalid label key {shown:?}: use 1-{MAX_LABEL_KEY} characters among a-z A-Z 0-9 . _ - /"
            ));
        }
        if v.len() > MAX_LABEL_VALUE {
            return Err(format!(
                "label {k} is {} bytes long; a label value has at most {MAX_LABEL_VALUE}",
                v.len()
            ));
        }
        if v.chars().any(char::is_control) {
            return Err(format!("label {k} contains control characters"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for good in ["alice", "bob.smith", "a@example.com", "ubuntu", "x1"] {
            assert!(validate("user", good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "@admin",
            "-x",
            "a b",
            "a/b",
            "a\nb",
            "ä",
            &"a".repeat(129),
        ] {
            assert!(validate("user", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn node_names_are_not_the_proxys() {
        let proxy = [
            "proxy.example.com".to_string(),
            "bastion.example.com:3080".into(),
        ];
        for good in [
            "web1",
            "db-2.prod",
            "node.example.com",
            "x1",
            "host-10",
            "a.b1",
        ] {
            assert_eq!(validate_node(good, "test", &proxy), Ok(()), "{good}");
        }
        for (bad, says) in [
            ("localhost", "local machine"),
            ("LocalHost", "local machine"),
            ("localhost.localdomain", "local machine"),
            ("ip6-localhost", "local machine"),
            ("app.localhost", "local machine"),
            ("127.0.0.1", "IP address"),
            ("10.1.2.3", "IP address"),
            ("127.1", "IP address"),
            ("2130706433", "IP address"),
            ("0x7f000001", "IP address"),
            ("test", "cluster's name"),
            ("TEST", "cluster's name"),
            ("x.test", "ends in .test"),
            ("a.b.Test", "ends in .test"),
            ("proxy.example.com", "proxy's own names"),
            ("Bastion.example.com", "proxy's own names"),
            ("a/b", "invalid node name"),
        ] {
            let e = validate_node(bad, "test", &proxy)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn labels() {
        let l = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            validate_labels(&l(&[("env", "prod"), ("team/x", "a b")])),
            Ok(())
        );
        for (bad, says) in [
            (l(&[("hostname", "evil")]), "built in"),
            (l(&[("id", "x")]), "built in"),
            (l(&[("Hostname", "x")]), "built in"),
            (l(&[("", "x")]), "invalid label key"),
            (l(&[("a b", "x")]), "invalid label key"),
            (l(&[(&"k".repeat(64), "x")]), "invalid label key"),
            (l(&[("k", &"v".repeat(257))]), "257 bytes long"),
            (l(&[("k", "a\u{1b}]52;c;x\u{7}")]), "control characters"),
        ] {
            let e = validate_labels(&bad).err().unwrap_or_default();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        let many: BTreeMap<String, String> =
            (0..65).map(|i| (format!("k{i}"), "v".into())).collect();
        assert!(
            validate_labels(&many)
                .err()
                .unwrap_or_default()
                .contains("at most 64 labels")
        );
    }
}
