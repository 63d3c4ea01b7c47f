//! `docs/roles.md` cannot drift from `core::role`: every field the role types accept (read from
//! the types themselves, through the field lists serde's derive hands a deserializer) has a row
//! in the doc's tables and no row names a field that does not exist; each row's default is what
//! the code does when the field is left out (the evaluator's answer for an option, the parsed
//! value for the rest, a parse error for "required"); every word of every vocabulary and enum is
//! listed; and every YAML example in the doc loads as a role with `core::resource::parse_all`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};

use sallyport_core::role::{
    Conditions, HostUserMode, KubeKind, KubeResource, KubeVerb, Metadata, RecordMode,
    RecordSession, Role, RoleOptions, RoleSet, RoleSpec, Rule, RuleResource, RuleVerb, Vocabulary,
};
use serde::de::{Deserialize, Deserializer, Visitor};

const DOC: &str = include_str!("../../docs/roles.md");

/// A deserializer that answers nothing and reports what it was asked for: the field names of a
/// derived struct (its `deserialize_struct`), or the variant names of a derived enum, as serde
/// spells them in YAML (after `rename_all`).
struct Probe;

#[derive(Debug)]
struct Asked(Vec<&'static str>);

impl std::fmt::Display for Asked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl std::error::Error for Asked {}

impl serde::de::Error for Asked {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        Asked(Vec::new())
    }
}

impl<'de> Deserializer<'de> for Probe {
    type Error = Asked;
    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Asked> {
        Err(Asked(Vec::new()))
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Asked> {
        Err(Asked(fields.to_vec()))
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Asked> {
        Err(Asked(variants.to_vec()))
    }
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map identifier ignored_any
    }
}

/// The names serde's derive gave `T` (fields of a struct, variants of an enum).
fn names<T: for<'de> Deserialize<'de>>() -> Vec<&'static str> {
    match T::deserialize(Probe) {
        Err(Asked(names)) if !names.is_empty() => names,
        _ => panic!(
            "{} is not a derived struct or enum",
            std::any::type_name::<T>()
        ),
    }
}

/// Every leaf field path a role accepts. The nesting (which field holds which struct) is written
/// here; the fields of each struct come from the types, so a new one anywhere fails the test
/// until the doc has it. `spec.deny` has the same type as `spec.allow`, documented once.
fn field_paths() -> BTreeSet<String> {
    let structs: BTreeMap<&str, Vec<&str>> = BTreeMap::from([
        ("", names::<Role>()),
        ("metadata", names::<Metadata>()),
        ("spec", names::<RoleSpec>()),
        ("spec.options", names::<RoleOptions>()),
        ("spec.options.record_session", names::<RecordSession>()),
        ("spec.allow", names::<Conditions>()),
        ("spec.allow.kubernetes_resources[]", names::<KubeResource>()),
        ("spec.allow.rules[]", names::<Rule>()),
    ]);
    let mut leaves = BTreeSet::new();
    for (prefix, fields) in &structs {
        for f in fields {
            let path = if prefix.is_empty() {
                f.to_string()
            } else {
                format!("{prefix}.{f}")
            };
            // A field that holds a struct is a heading, not a row; `spec.deny` is `spec.allow`.
            if path == "spec.deny" || structs.contains_key(path.as_str()) {
                continue;
            }
            leaves.insert(path);
        }
    }
    // Fields holding lists of structs have a row of their own and rows for their items.
    leaves.insert("spec.allow.kubernetes_resources".into());
    leaves.insert("spec.allow.rules".into());
    leaves
}

/// The doc's table rows: field path (the first cell, in backticks) → default (the cell under
/// the `Default` heading).
fn documented() -> BTreeMap<String, String> {
    let mut rows = BTreeMap::new();
    let mut default_col = None;
    for line in DOC.lines() {
        let line = line.trim();
        if !line.starts_with('|') {
            default_col = None;
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if cells.first() == Some(&"Field") {
            default_col = cells.iter().position(|c| *c == "Default");
            continue;
        }
        if cells
            .iter()
            .all(|c| c.chars().all(|ch| ch == '-' || ch == ' '))
        {
            continue;
        }
        let col = default_col.expect("every table of fields has a Default column");
        let field = cells[0].trim_matches('`').to_string();
        let default = cells[col].trim_matches('`').to_string();
        assert!(
            rows.insert(field.clone(), default).is_none(),
            "{field} has two rows"
        );
    }
    rows
}

#[test]
fn every_field_of_the_role_types_is_documented_and_nothing_else() {
    let code = field_paths();
    let doc: BTreeSet<String> = documented().into_keys().collect();
    let missing: Vec<_> = code.difference(&doc).collect();
    let extra: Vec<_> = doc.difference(&code).collect();
    assert!(
        missing.is_empty(),
        "docs/roles.md has no row for {missing:?}"
    );
    assert!(
        extra.is_empty(),
        "docs/roles.md documents fields roles do not have: {extra:?}"
    );
}

/// What the evaluator does with one role that sets no options, option by option, written as
/// the doc writes defaults.
fn option_defaults() -> BTreeMap<&'static str, String> {
    let role: Role =
        serde_saphyr::from_str("kind: role\nversion: v1\nmetadata: {name: probe}\n").unwrap();
    let set = RoleSet::new(&[role], &Default::default());
    let duration = |d: Option<std::time::Duration>| {
        d.map_or("none".to_string(), sallyport_core::duration::format)
    };
    let number = |n: Option<u32>| n.map_or("none".to_string(), |n| n.to_string());
    BTreeMap::from([
        ("max_session_ttl", duration(Some(set.max_session_ttl()))),
        ("port_forwarding", set.port_forwarding().to_string()),
        ("forward_agent", set.forward_agent().to_string()),
        (
            "permit_x11_forwarding",
            set.permit_x11_forwarding().to_string(),
        ),
        ("ssh_file_copy", set.ssh_file_copy().to_string()),
        ("client_idle_timeout", duration(set.client_idle_timeout())),
        (
            "disconnect_expired_cert",
            set.disconnect_expired_cert().to_string(),
        ),
        // Auth applies OpenSSH's own MaxSessions when no role sets one.
        (
            "max_sessions",
            number(Some(
                set.max_sessions()
                    .unwrap_or(sallyport_core::api::DEFAULT_MAX_SESSIONS),
            )),
        ),
        ("max_connections", number(set.max_connections())),
        ("record_session.ssh", word(&set.record_ssh())),
        // `default` is what SSH falls back to: the same evaluator answer.
        ("record_session.default", word(&set.record_ssh())),
        ("record_input", set.record_input().to_string()),
        // A login allowed on a node is created there only when a role asks: `off` otherwise.
        ("create_host_user_mode", {
            let role: Role = serde_saphyr::from_str(
                "kind: role\nversion: v1\nmetadata: {name: probe}\nspec:\n  allow:\n    logins: [deploy]\n    node_labels: {'*': '*'}\n",
            )
            .unwrap();
            let set = RoleSet::new(&[role], &Default::default());
            match set.host_user("deploy", &BTreeMap::new()) {
                None => HostUserMode::Off.as_str().to_string(),
                Some(h) => h.mode.as_str().to_string(),
            }
        }),
    ])
}

/// A value as YAML spells it, for the enums the doc shows as defaults.
fn word<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

#[test]
fn option_defaults_are_what_the_evaluator_does_without_them() {
    let doc = documented();
    let defaults = option_defaults();
    let options: Vec<&String> = doc
        .keys()
        .filter(|k| k.starts_with("spec.options."))
        .collect();
    assert!(!options.is_empty());
    for field in options {
        let name = field.trim_start_matches("spec.options.");
        let code = defaults
            .get(name)
            .unwrap_or_else(|| panic!("no evaluator default checked for {field}"));
        assert_eq!(&doc[field], code, "default of {field} in docs/roles.md");
    }
}

/// `base` (a minimal role as JSON, which YAML reads as it is) with `value` at `path`; a `[]`
/// segment is a one-element list whose item holds `item` beside the field.
fn role_with(path: &str, value: Option<serde_json::Value>) -> serde_json::Value {
    let mut role =
        serde_json::json!({"kind": "role", "version": "v1", "metadata": {"name": "probe"}});
    let (list, field) = match path.split_once("[].") {
        Some((list, field)) => (Some(list), field),
        None => (None, path),
    };
    let item = |field: &str| match list {
        Some(l) if l.ends_with("kubernetes_resources") => {
            let mut item = serde_json::json!({"kind": "pod"});
            if field == "kind" {
                item.as_object_mut().unwrap().remove("kind");
            }
            item
        }
        _ => {
            let mut item = serde_json::json!({"resources": ["role"], "verbs": ["list"]});
            item.as_object_mut().unwrap().remove(field);
            item
        }
    };
    let (parent_path, key) = match list {
        Some(list) => (list, None),
        None => match path.rsplit_once('.') {
            Some((p, k)) => (p, Some(k)),
            None => ("", Some(path)),
        },
    };
    let mut at = &mut role;
    for seg in parent_path.split('.').filter(|s| !s.is_empty()) {
        at = at
            .as_object_mut()
            .unwrap()
            .entry(seg)
            .or_insert_with(|| serde_json::json!({}));
    }
    match key {
        Some(k) => {
            let obj = at.as_object_mut().unwrap();
            match value {
                Some(v) => {
                    obj.insert(k.to_string(), v);
                }
                None => {
                    obj.remove(k);
                }
            }
        }
        None => {
            let mut item = item(field);
            if let Some(v) = value {
                item.as_object_mut().unwrap().insert(field.to_string(), v);
            }
            *at = serde_json::json!([item]);
        }
    }
    role
}

fn parse(role: &serde_json::Value) -> Result<Role, String> {
    serde_saphyr::from_str::<Role>(&role.to_string()).map_err(|e| e.to_string())
}

#[test]
fn other_defaults_are_what_a_role_without_the_field_reads_as() {
    for (field, default) in documented() {
        if field.starts_with("spec.options.") {
            continue;
        }
        let without = parse(&role_with(&field, None));
        if default == "required" {
            assert!(
                without.is_err(),
                "{field} is documented as required, but a role without it loads"
            );
            continue;
        }
        let without = without.unwrap_or_else(|e| panic!("a role without {field}: {e}"));
        let value: serde_json::Value = match default.as_str() {
            "none" => serde_json::Value::Null,
            "[]" => serde_json::json!([]),
            "{}" => serde_json::json!({}),
            other => serde_json::Value::String(other.to_string()),
        };
        let with = parse(&role_with(&field, Some(value)))
            .unwrap_or_else(|e| panic!("{field} set to its documented default {default}: {e}"));
        assert_eq!(
            with, without,
            "{field}: its documented default {default:?} is not what leaving it out gives"
        );
    }
}

#[test]
fn every_word_roles_accept_is_listed() {
    let words: Vec<(&str, Vec<&str>)> = vec![
        ("rule resource", RuleResource::WORDS.to_vec()),
        ("rule verb", RuleVerb::WORDS.to_vec()),
        ("Kubernetes kind", KubeKind::WORDS.to_vec()),
        ("Kubernetes verb", KubeVerb::WORDS.to_vec()),
        ("recording mode", names::<RecordMode>()),
        ("host user mode", names::<HostUserMode>()),
    ];
    for (what, list) in words {
        for w in list {
            assert!(
                DOC.contains(&format!("`{w}`")),
                "docs/roles.md does not list the {what} `{w}`"
            );
        }
    }
    for preset in sallyport_core::role::presets() {
        assert!(
            DOC.contains(&format!("- `{}`:", preset.name())),
            "docs/roles.md does not describe the preset role {}",
            preset.name()
        );
    }
}

#[test]
fn every_yaml_example_loads_as_a_role() {
    let mut examples = 0;
    let mut lines = DOC.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "```yaml" {
            continue;
        }
        let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
        let text = block.join("\n");
        let resources = sallyport_core::resource::parse_all(&text, "docs/roles.md")
            .unwrap_or_else(|e| panic!("example does not load: {e}\n{text}"));
        assert!(
            !resources.is_empty()
                && resources
                    .iter()
                    .all(|r| matches!(r, sallyport_core::resource::Resource::Role(_))),
            "example is not a role:\n{text}"
        );
        examples += 1;
    }
    assert!(
        examples >= 5,
        "only {examples} YAML examples in docs/roles.md"
    );
}
