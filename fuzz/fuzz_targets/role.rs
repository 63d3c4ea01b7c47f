//! Role resources as admins send them: YAML files (`sallyctl create`, every document), the web
//! editor's text (`parse_role`, its problems placed by `yaml::Places`) and the JSON auth
//! receives and stores. A role that is accepted must be stored and read back as the same role
//! with the same revision (auth keeps roles as JSON; a save compares revisions), a problem must
//! lie inside the text, and evaluating a role must not panic.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use sallyport_core::resource::{Resource, parse_all, parse_role};
use sallyport_core::role::{Role, RoleSet};

fn check(role: &Role) {
    let json = serde_json::to_string(role).expect("a role serializes");
    let back: Role = serde_json::from_str(&json)
        .unwrap_or_else(|e| panic!("stored role {json} does not read back: {e}"));
    assert_eq!(&back, role, "{json}");
    assert_eq!(back.revision(), role.revision(), "{json}");
    let traits = BTreeMap::from([
        (
            "internal.logins".to_string(),
            vec!["alice".to_string(), "root".to_string()],
        ),
        (
            "external.groups".to_string(),
            vec!["dev".to_string(), "a b".to_string()],
        ),
    ]);
    let set = RoleSet::new(std::slice::from_ref(role), &traits);
    let labels = BTreeMap::from([
        ("env".to_string(), "prod".to_string()),
        ("hostname".to_string(), "web1".to_string()),
    ]);
    for login in set.logins() {
        let _ = set.check_node(&login, &labels);
    }
    let _ = set.check_node("root", &labels);
    let _ = set.can_see_node(&labels);
    let _ = set.max_session_ttl();
    let _ = set.record_ssh();
}

fuzz_target!(|data: &[u8]| {
    if let Ok(role) = serde_json::from_slice::<Role>(data)
        && role.validate().is_ok()
    {
        check(&role);
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse_role(text) {
        Ok(role) => check(&role),
        Err(p) => {
            let lines = text.matches(['\n', '\r']).count() + 2;
            assert!(
                (1..=lines).contains(&p.line) && p.column >= 1,
                "{p:?} outside {lines} lines"
            );
        }
    }
    let _ = sallyport_core::yaml::Places::of(text).find("spec.allow.logins.0");
    if let Ok(resources) = parse_all(text, "fuzz.yaml") {
        for r in resources {
            if let Resource::Role(role) = r {
                check(&role);
            }
        }
    }
});
