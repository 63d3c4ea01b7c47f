//! The kubeconfig entries `sally kube login` adds and `sally logout` removes, in a file that is
//! the user's: every other cluster, user and context, and every field this program does not
//! know, is written back as it was read. The file is read as a loose YAML (or JSON) document and
//! written whole, atomically, 0600. What it must never do: touch an entry it did not make.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Map, Value, json};

/// The three lists a kubeconfig names its entries in, each entry `{name, <kind>: {...}}`.
const LISTS: [(&str, &str); 3] = [
    ("clusters", "cluster"),
    ("users", "user"),
    ("contexts", "context"),
];

/// The file kubectl writes to: the first file of `$KUBECONFIG` (a `:`-separated list, empty
/// entries skipped as client-go skips them), else `~/.kube/config`.
pub(crate) fn path() -> Result<PathBuf> {
    path_from(
        std::env::var_os("KUBECONFIG"),
        std::env::var_os("HOME").filter(|h| !h.is_empty()),
    )
}

fn path_from(kubeconfig: Option<OsString>, home: Option<OsString>) -> Result<PathBuf> {
    if let Some(first) = kubeconfig
        .iter()
        .flat_map(std::env::split_paths)
        .find(|p| !p.as_os_str().is_empty())
    {
        return Ok(first);
    }
    let home = home.ok_or_else(|| anyhow!("neither $KUBECONFIG nor $HOME is set"))?;
    Ok(PathBuf::from(home).join(".kube").join("config"))
}

/// One cluster's entries as `sally kube login` writes them: cluster, user and context all
/// named `name`.
pub(crate) struct Entry {
    pub name: String,
    pub server: String,
    /// The proxy's host TLS CA, PEM.
    pub ca_pem: String,
    /// The absolute path of `sally`.
    pub command: String,
    pub args: Vec<String>,
    /// The absolute profile directory (`SALLY_HOME`).
    pub sally_home: String,
}

/// A kubeconfig document as read: a mapping, missing lists allowed.
pub(crate) struct Kubeconfig {
    doc: Map<String, Value>,
}

impl Kubeconfig {
    /// What kubectl writes into a new file.
    fn empty() -> Self {
        let mut doc = Map::new();
        doc.insert("apiVersion".into(), json!("v1"));
        doc.insert("kind".into(), json!("Config"));
        for (key, _) in LISTS {
            doc.insert(key.into(), json!([]));
        }
        doc.insert("current-context".into(), json!(""));
        doc.insert("preferences".into(), json!({}));
        Kubeconfig { doc }
    }

    pub(crate) fn parse(text: &str) -> Result<Self> {
        if text.trim().is_empty() {
            return Ok(Self::empty());
        }
        // YAML is a superset of JSON in every kubeconfig kubectl writes, so one reader serves
        // both.
        let doc: Value = serde_saphyr::from_str(text).map_err(|e| anyhow!("{e}"))?;
        match doc {
            Value::Object(doc) => Ok(Kubeconfig { doc }),
            Value::Null => Ok(Self::empty()),
            _ => bail!("not a kubeconfig: the document is not a mapping"),
        }
    }

    /// YAML as kubectl writes it: keys in order, long and multi-line strings quoted on one line
    /// rather than folded into block scalars.
    pub(crate) fn to_yaml(&self) -> Result<String> {
        let options = serde_saphyr::ser_options! { prefer_block_scalars: false };
        serde_saphyr::to_string_with_options(&self.doc, options)
            .map_err(|e| anyhow!("cannot write YAML: {e}"))
    }

    /// The list `key`, created if missing or null; an error if it is something else, so a file
    /// this program does not understand is left alone.
    fn list(&mut self, key: &str) -> Result<&mut Vec<Value>> {
        let slot = self.doc.entry(key).or_insert_with(|| json!([]));
        if slot.is_null() {
            *slot = json!([]);
        }
        slot.as_array_mut()
            .ok_or_else(|| anyhow!("not a kubeconfig: `{key}` is not a list"))
    }

    /// Adds `e`'s cluster, user and context, replacing those of the same name where they stand,
    /// and makes its context current. A context's other fields (a `namespace` the user set with
    /// `kubectl config set-context --current --namespace`) survive a new login.
    pub(crate) fn merge(&mut self, e: &Entry) -> Result<()> {
        use base64::Engine;
        let cluster = json!({
            "server": e.server,
            "certificate-authority-data":
                base64::engine::general_purpose::STANDARD.encode(e.ca_pem.as_bytes()),
        });
        let user = json!({
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": e.command,
                "args": e.args,
                "env": [{"name": "SALLY_HOME", "value": e.sally_home}],
                "interactiveMode": "Never",
                "provideClusterInfo": false,
            }
        });
        let context = json!({"cluster": e.name, "user": e.name});
        for ((key, kind), mut body) in LISTS.into_iter().zip([cluster, user, context]) {
            let list = self.list(key)?;
            let name = Some(e.name.as_str());
            match list.iter().position(|v| name_of(v) == name) {
                Some(at) => {
                    if kind == "context"
                        && let (Some(mine), Some(theirs)) = (
                            body.as_object_mut(),
                            list[at].get(kind).and_then(Value::as_object),
                        )
                    {
                        for (k, v) in theirs {
                            mine.entry(k.clone()).or_insert_with(|| v.clone());
                        }
                    }
                    list[at] = json!({"name": e.name, kind: body});
                    // A second entry of the same name (edited in by hand) goes: kubectl
                    // refuses a file with two.
                    let mut i = 0;
                    list.retain(|v| {
                        i += 1;
                        i - 1 == at || name_of(v) != name
                    });
                }
                None => list.push(json!({"name": e.name, kind: body})),
            }
        }
        self.doc
            .insert("current-context".into(), Value::String(e.name.clone()));
        Ok(())
    }

    /// Removes what [`Self::merge`] added for a sallyport cluster: users named `<prefix>*` that
    /// run `sally kube credentials --proxy <proxy>`, and the clusters and contexts of the same
    /// names. The proxy tells sallyport cluster `acme`'s entries from `acme-prod`'s, which share
    /// the prefix. An unset current context (`""`) replaces one that pointed at them. Returns
    /// the names removed.
    pub(crate) fn remove_ours(&mut self, prefix: &str, proxy: &str) -> Vec<String> {
        let ours: Vec<String> = self
            .doc
            .get("users")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|u| is_ours(u, prefix, proxy))
            .filter_map(|u| name_of(u).map(str::to_string))
            .collect();
        if ours.is_empty() {
            return ours;
        }
        let mine = |v: &Value| name_of(v).is_some_and(|n| ours.iter().any(|o| o == n));
        for (key, _) in LISTS {
            if let Some(list) = self.doc.get_mut(key).and_then(Value::as_array_mut) {
                list.retain(|v| !mine(v));
            }
        }
        let current = self.doc.get("current-context").and_then(Value::as_str);
        if current.is_some_and(|c| ours.iter().any(|o| o == c)) {
            self.doc
                .insert("current-context".into(), Value::String(String::new()));
        }
        ours
    }

    #[cfg(test)]
    fn current_context(&self) -> Option<&str> {
        self.doc.get("current-context").and_then(Value::as_str)
    }
}

fn name_of(v: &Value) -> Option<&str> {
    v.get("name").and_then(Value::as_str)
}

/// A user entry `sally kube login` wrote: named `<prefix>...`, an exec of `kube credentials`
/// with `--proxy <proxy>`.
fn is_ours(user: &Value, prefix: &str, proxy: &str) -> bool {
    let named = name_of(user).is_some_and(|n| n.starts_with(prefix));
    let args: Vec<&str> = user
        .pointer("/user/exec/args")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    named
        && args.starts_with(&["kube", "credentials"])
        && args.windows(2).any(|w| w == ["--proxy", proxy])
}

/// The file at `path`, or an empty kubeconfig if there is none.
pub(crate) fn load(path: &Path) -> Result<Kubeconfig> {
    match std::fs::read_to_string(path) {
        Ok(text) => Kubeconfig::parse(&text).with_context(|| format!("{}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Kubeconfig::empty()),
        Err(e) => Err(anyhow!("cannot read {}: {e}", path.display())),
    }
}

/// Writes `config` over `path` whole (0600, atomically), creating its directory (0700) if
/// needed. A symbolic link is followed, so a kubeconfig kept elsewhere stays where it is.
pub(crate) fn save(path: &Path, config: &Kubeconfig) -> Result<()> {
    let target = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    if let Some(dir) = target.parent().filter(|d| !d.as_os_str().is_empty()) {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    sallyport_core::files::replace_private(&target, config.to_yaml()?.as_bytes())
        .with_context(|| format!("cannot write {}", target.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn entry(name: &str, server: &str) -> Entry {
        Entry {
            name: name.into(),
            server: server.into(),
            ca_pem: "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".into(),
            command: "/usr/local/bin/sally".into(),
            args: [
                "kube",
                "credentials",
                "--proxy",
                "p:3080",
                "--cluster",
                "dev",
            ]
            .map(String::from)
            .to_vec(),
            sally_home: "/home/alice/.sally".into(),
        }
    }

    const THEIRS: &str = r##"apiVersion: v1
kind: Config
preferences:
  colors: true
clusters:
- name: kind-kind
  cluster:
    server: https://127.0.0.1:6443
    insecure-skip-tls-verify: true
    proxy-url: "1.0"
  x-unknown: keep me
users:
- name: admin
  user:
    token: "0777"
    username: "yes"
    password: "multi\nline with a trailing space "
    exec-like: [on, "off", "12:30", "#x", "a: b", " lead", "~"]
contexts:
- name: kind
  context:
    cluster: kind-kind
    user: admin
    namespace: "null"
current-context: kind
extensions:
- name: other-tool
  extension: {answer: 42, ratio: 0.5, empty: ""}
"##;

    fn parse(text: &str) -> Kubeconfig {
        Kubeconfig::parse(text).unwrap_or_else(|e| panic!("{e:#}\n{text}"))
    }

    fn names(c: &Kubeconfig, list: &str) -> Vec<String> {
        c.doc[list]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| name_of(v).map(str::to_string))
            .collect()
    }

    fn yaml(c: &Kubeconfig) -> String {
        c.to_yaml().unwrap_or_else(|e| panic!("{e:#}"))
    }

    #[test]
    fn merge_keeps_every_other_entry_and_field_through_yaml() {
        let before = parse(THEIRS);
        let mut c = parse(THEIRS);
        c.merge(&entry("acme-dev", "https://proxy:3026/kube/dev"))
            .unwrap_or_else(|e| panic!("{e:#}"));
        let text = yaml(&c);
        let after = parse(&text);
        for key in ["preferences", "extensions", "apiVersion", "kind"] {
            assert_eq!(after.doc[key], before.doc[key], "{key}\n{text}");
        }
        // Theirs first, as they were (strings that look like numbers, booleans or null stay
        // strings), then ours.
        for list in ["clusters", "users", "contexts"] {
            assert_eq!(after.doc[list][0], before.doc[list][0], "{list}\n{text}");
            assert_eq!(
                names(&after, list),
                [names(&before, list)[0].clone(), "acme-dev".into()]
            );
        }
        assert_eq!(after.current_context(), Some("acme-dev"));
        let user = &after.doc["users"][1]["user"]["exec"];
        assert_eq!(user["apiVersion"], "client.authentication.k8s.io/v1");
        assert_eq!(user["command"], "/usr/local/bin/sally");
        assert_eq!(user["args"][0], "kube");
        assert_eq!(user["args"][5], "dev");
        assert_eq!(user["env"][0]["name"], "SALLY_HOME");
        assert_eq!(user["env"][0]["value"], "/home/alice/.sally");
        assert_eq!(user["interactiveMode"], "Never");
        assert_eq!(user["provideClusterInfo"], false);
        let cluster = &after.doc["clusters"][1]["cluster"];
        assert_eq!(cluster["server"], "https://proxy:3026/kube/dev");
        use base64::Engine;
        let ca = cluster["certificate-authority-data"]
            .as_str()
            .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok());
        assert_eq!(ca.as_deref(), Some(entry("", "").ca_pem.as_bytes()));
        assert_eq!(
            after.doc["contexts"][1]["context"],
            json!({"cluster": "acme-dev", "user": "acme-dev"})
        );
    }

    fn merged(mut c: Kubeconfig, e: &Entry) -> Kubeconfig {
        c.merge(e).unwrap_or_else(|err| panic!("{err:#}"));
        parse(&yaml(&c))
    }

    #[test]
    fn a_new_login_replaces_its_entries_where_they_stand() {
        let mut c = merged(
            parse(THEIRS),
            &entry("acme-dev", "https://old:3026/kube/dev"),
        );
        c = merged(c, &entry("acme-prod", "https://old:3026/kube/prod"));
        // The user picked a namespace and another context since.
        if let Some(ctx) = c.doc["contexts"][1]["context"].as_object_mut() {
            ctx.insert("namespace".into(), json!("team-a"));
        }
        c.doc["current-context"] = json!("kind");
        let c = merged(c, &entry("acme-dev", "https://new:3026/kube/dev"));
        for list in ["clusters", "users", "contexts"] {
            assert_eq!(names(&c, list).len(), 3, "{list}");
            assert_eq!(names(&c, list)[1], "acme-dev", "{list}");
            assert_eq!(names(&c, list)[2], "acme-prod", "{list}");
        }
        assert_eq!(
            c.doc["clusters"][1]["cluster"]["server"],
            "https://new:3026/kube/dev"
        );
        assert_eq!(
            c.doc["contexts"][1]["context"],
            json!({"cluster": "acme-dev", "user": "acme-dev", "namespace": "team-a"})
        );
        assert_eq!(c.current_context(), Some("acme-dev"));
    }

    #[test]
    fn logout_removes_only_what_login_wrote_for_this_cluster() {
        let mut c = merged(parse(THEIRS), &entry("acme-dev", "https://p:3026/kube/dev"));
        c = merged(c, &entry("acme-prod", "https://p:3026/kube/prod"));
        c = merged(c, &entry("other-dev", "https://q:3026/kube/dev"));
        // Another sallyport cluster whose name starts like this one's, behind another proxy.
        let mut acme_prod = entry("acme-prod-dev", "https://r:3026/kube/dev");
        acme_prod.args[3] = "r:3080".into();
        c = merged(c, &acme_prod);
        // Named like ours, but not ours: a user that does not run `sally kube credentials`.
        c.list("users")
            .unwrap_or_else(|e| panic!("{e:#}"))
            .push(json!({"name": "acme-admin", "user": {"token": "t"}}));
        c.doc["current-context"] = json!("acme-prod");
        let mut removed = c.remove_ours("acme-", "p:3080");
        removed.sort();
        assert_eq!(removed, ["acme-dev", "acme-prod"]);
        let c = parse(&yaml(&c));
        assert_eq!(
            names(&c, "clusters"),
            ["kind-kind", "other-dev", "acme-prod-dev"]
        );
        assert_eq!(
            names(&c, "users"),
            ["admin", "other-dev", "acme-prod-dev", "acme-admin"]
        );
        assert_eq!(
            names(&c, "contexts"),
            ["kind", "other-dev", "acme-prod-dev"]
        );
        assert_eq!(c.current_context(), Some(""));
        for key in ["preferences", "extensions"] {
            assert_eq!(c.doc[key], parse(THEIRS).doc[key]);
        }
        // Another current context stays; nothing of ours: nothing removed.
        let mut c = merged(parse(THEIRS), &entry("acme-dev", "https://p:3026/kube/dev"));
        c.doc["current-context"] = json!("kind");
        assert!(c.remove_ours("acme-", "q:3080").is_empty());
        assert_eq!(c.remove_ours("acme-", "p:3080"), ["acme-dev"]);
        assert_eq!(c.current_context(), Some("kind"));
        assert!(c.remove_ours("acme-", "p:3080").is_empty());
    }

    #[test]
    fn the_first_kubeconfig_file_is_the_one_written() {
        let home = Some(OsString::from("/home/alice"));
        for (var, want) in [
            (Some("/a/one:/b/two:/c/three"), "/a/one"),
            (Some(":/b/two"), "/b/two"),
            (Some("/a/one"), "/a/one"),
            (Some(""), "/home/alice/.kube/config"),
            (None, "/home/alice/.kube/config"),
        ] {
            let got = path_from(var.map(OsString::from), home.clone()).ok();
            assert_eq!(got, Some(PathBuf::from(want)), "{var:?}");
        }
        assert!(path_from(None, None).is_err());
    }

    #[test]
    fn the_file_is_created_private_and_read_back_yaml_or_json() {
        let dir = std::env::temp_dir().join(format!(
            "sally-kubeconfig-{}-{}",
            std::process::id(),
            sallyport_core::random_hex(4)
        ));
        let path = dir.join(".kube").join("config");
        let mut c = load(&path).unwrap_or_else(|e| panic!("{e:#}"));
        c.merge(&entry("acme-dev", "https://p:3026/kube/dev"))
            .unwrap_or_else(|e| panic!("{e:#}"));
        save(&path, &c).unwrap_or_else(|e| panic!("{e:#}"));
        let mode = |p: &Path| {
            std::fs::metadata(p)
                .map(|m| m.permissions().mode() & 0o777)
                .ok()
        };
        assert_eq!(mode(&path), Some(0o600));
        assert_eq!(mode(&dir.join(".kube")), Some(0o700));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(text.contains("kind: Config"), "not YAML:\n{text}");
        let back = load(&path).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(back.doc, c.doc);
        // An existing file keeps its place (a symbolic link is followed) and becomes 0600.
        let real = dir.join("real-config");
        let json = serde_json::to_string(&parse(THEIRS).doc).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&real, json).unwrap_or_else(|e| panic!("{e}"));
        let link = dir.join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap_or_else(|e| panic!("{e}"));
        let mut c = load(&link).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(c.doc, parse(THEIRS).doc);
        c.merge(&entry("acme-dev", "https://p:3026/kube/dev"))
            .unwrap_or_else(|e| panic!("{e:#}"));
        save(&link, &c).unwrap_or_else(|e| panic!("{e:#}"));
        assert!(link.is_symlink());
        assert_eq!(mode(&real), Some(0o600));
        assert_eq!(
            names(
                &parse(&std::fs::read_to_string(&real).unwrap_or_default()),
                "users"
            ),
            ["admin", "acme-dev"]
        );
        // Something that is not a kubeconfig is refused, not overwritten.
        assert!(Kubeconfig::parse("- a\n- b\n").is_err());
        assert!(
            Kubeconfig::parse("clusters: 3\n")
                .is_ok_and(|mut c| c.merge(&entry("x", "y")).is_err())
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
