//! The evaluator as data: tables of cases, then properties (proptest) checked against a simple
//! reference implementation.

use super::*;
use crate::identity::internal_traits;

fn traits(logins: &[&str]) -> Traits {
    let logins: Vec<String> = logins.iter().map(|s| s.to_string()).collect();
    internal_traits(&logins, &["devs".to_string()], &[])
}

fn role(yaml: &str) -> Role {
    let r: Role = serde_saphyr::from_str(yaml).unwrap_or_else(|e| panic!("{e}"));
    r.validate().unwrap_or_else(|e| panic!("{e}"));
    r
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const STAGING: &str = "
kind: role
version: v1
metadata: {name: staging}
spec:
  options: {max_session_ttl: 8h}
  allow:
    logins: ['{{internal.logins}}', ubuntu]
    node_labels: {env: [staging, dev], team: '*'}
  deny:
    node_labels: {env: prod}
";

const NO_ROOT: &str = "
kind: role
version: v1
metadata: {name: no-root}
spec:
  deny:
    logins: [root]
";

const PROD_REGEX: &str = "
kind: role
version: v1
metadata: {name: oncall}
spec:
  options: {max_session_ttl: 1h}
  allow:
    logins: [root]
    node_labels: {env: '^prod-(eu|us)$', team: 'db-*'}
";

#[test]
fn presets_validate() {
    for r in presets() {
        r.validate().unwrap_or_else(|e| panic!("{e}"));
        let back: Role = serde_json::from_str(&serde_json::to_string(&r).unwrap_or_default())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, r, "presets round-trip through JSON");
    }
}

#[test]
fn node_decisions() {
    let set = RoleSet::new(
        &[role(STAGING), role(NO_ROOT), role(PROD_REGEX)],
        &traits(&["alice", "root"]),
    );
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], bool, &'a str);
    let cases: &[Case<'_>] = &[
        (
            "alice",
            &[("env", "staging"), ("team", "web")],
            true,
            "role staging allows login alice",
        ),
        (
            "ubuntu",
            &[("env", "dev"), ("team", "x")],
            true,
            "role staging allows login ubuntu",
        ),
        (
            "alice",
            &[("env", "staging")],
            false,
            "only on nodes with other labels",
        ),
        (
            "alice",
            &[("env", "qa"), ("team", "web")],
            false,
            "only on nodes with other labels",
        ),
        (
            "alice",
            &[("env", "prod"), ("team", "web")],
            false,
            "role staging denies nodes with labels env=prod",
        ),
        (
            "root",
            &[("env", "prod-eu"), ("team", "db-main")],
            false,
            "role no-root denies login root",
        ),
        (
            "bob",
            &[("env", "staging"), ("team", "web")],
            false,
            "no role allows login bob",
        ),
    ];
    for (login, l, allowed, why) in cases {
        let d = set.check_node(login, &labels(l));
        assert_eq!(d.allowed, *allowed, "{login} {l:?}: {}", d.explanation);
        // The listing's decision without the sentence is the same decision.
        assert_eq!(
            set.allows_node(login, &labels(l)),
            *allowed,
            "{login} {l:?}"
        );
        assert!(
            d.explanation.contains(why),
            "{login} {l:?}: {}",
            d.explanation
        );
    }
    assert_eq!(
        set.logins(),
        vec!["alice", "ubuntu"],
        "root is denied, so it is no principal"
    );
    assert_eq!(
        set.max_session_ttl(),
        Duration::from_secs(3600),
        "the shortest TTL wins"
    );
}

#[test]
fn regex_and_glob_labels() {
    let set = RoleSet::new(&[role(PROD_REGEX)], &Traits::new());
    assert!(
        set.check_node("root", &labels(&[("env", "prod-us"), ("team", "db-x")]))
            .allowed
    );
    assert!(
        !set.check_node("root", &labels(&[("env", "prod-asia"), ("team", "db-x")]))
            .allowed
    );
    assert!(
        !set.check_node("root", &labels(&[("env", "xprod-us"), ("team", "db-x")]))
            .allowed
    );
    assert!(
        !set.check_node("root", &labels(&[("env", "prod-us"), ("team", "web")]))
            .allowed
    );
    assert!(set.can_see_node(&labels(&[("env", "prod-eu"), ("team", "db-1")])));
    assert!(!set.can_see_node(&labels(&[("env", "staging"), ("team", "db-1")])));
}

#[test]
fn options_combine() {
    let a = role(
        "kind: role\nversion: v1\nmetadata: {name: a}\nspec:\n  options: {port_forwarding: false, ssh_file_copy: true, max_sessions: 5, record_session: {ssh: best_effort}}\n",
    );
    let b = role(
        "kind: role\nversion: v1\nmetadata: {name: b}\nspec:\n  options: {port_forwarding: true, ssh_file_copy: false, max_sessions: 3, client_idle_timeout: 15m, record_session: {ssh: strict}}\n",
    );
    let set = RoleSet::new(&[a, b], &Traits::new());
    assert!(set.port_forwarding(), "any allows");
    assert!(!set.ssh_file_copy(), "all must allow");
    assert_eq!(set.max_sessions(), Some(3), "lowest wins");
    assert_eq!(set.client_idle_timeout(), Some(Duration::from_secs(900)));
    assert_eq!(set.record_ssh(), RecordMode::Strict, "strictest wins");
    let none = RoleSet::new(&[], &Traits::new());
    assert!(none.ssh_file_copy(), "default allows");
    assert_eq!(none.record_ssh(), RecordMode::BestEffort);
}

#[test]
fn kube_decisions() {
    let dev = role(
        "kind: role
version: v1
metadata: {name: kube-dev}
spec:
  allow:
    kubernetes_groups: ['{{internal.kubernetes_groups}}', viewers]
    kubernetes_labels: {env: staging}
    kubernetes_resources:
      - {kind: pod, namespace: 'staging-*', name: '*', verbs: [get, list, exec]}
  deny:
    kubernetes_resources:
      - {kind: pod, namespace: staging-secure, name: '*', verbs: ['*']}
",
    );
    let set = RoleSet::new(&[dev], &traits(&[]));
    let staging = labels(&[("env", "staging")]);
    let req = |ns: &'static str, verb: &'static str| KubeRequest {
        kind: "pod",
        namespace: ns,
        name: "web-1",
        verb,
    };
    assert!(set.check_kube(&staging, &req("staging-a", "exec")).allowed);
    let d = set.check_kube(&staging, &req("staging-a", "delete"));
    assert!(
        !d.allowed && d.explanation.contains("no role allows `delete`"),
        "{}",
        d.explanation
    );
    let d = set.check_kube(&staging, &req("staging-secure", "get"));
    assert!(
        !d.allowed && d.explanation.contains("role kube-dev denies"),
        "{}",
        d.explanation
    );
    let d = set.check_kube(&labels(&[("env", "prod")]), &req("staging-a", "get"));
    assert!(
        !d.allowed && d.explanation.contains("no role allows a cluster"),
        "{}",
        d.explanation
    );
    assert_eq!(set.kube_principals(&staging).0, vec!["devs", "viewers"]);
    assert!(
        set.kube_principals(&labels(&[("env", "prod")]))
            .0
            .is_empty()
    );
}

/// Teleport's v7 kube rules: a namespace rule covers what is in it, cluster-wide kinds ignore
/// a rule's namespace, custom resources need `kind: '*'`, and the principals are those of the
/// roles that allow the request.
#[test]
fn kube_v7_namespace_and_cluster_wide_kinds() {
    let ns = role(
        "kind: role
version: v1
metadata: {name: ns-dev}
spec:
  allow:
    kubernetes_labels: {'*': '*'}
    kubernetes_groups: [dev-admins]
    kubernetes_resources:
      - {kind: namespace, name: dev, verbs: ['*']}
      - {kind: node, namespace: dev, name: '*', verbs: [get]}
",
    );
    let all = role(
        "kind: role
version: v1
metadata: {name: readers}
spec:
  allow:
    kubernetes_labels: {env: prod}
    kubernetes_groups: [readers]
    kubernetes_resources:
      - {kind: pod, namespace: prod, name: '*', verbs: [get]}
",
    );
    let set = RoleSet::new(&[ns, all], &traits(&[]));
    let l = labels(&[("env", "prod")]);
    let r = |kind, namespace, name, verb| KubeRequest {
        kind,
        namespace,
        name,
        verb,
    };
    assert!(
        set.check_kube(&l, &r("pod", "dev", "web-1", "exec"))
            .allowed
    );
    assert!(
        set.check_kube(&l, &r("secret", "dev", "x", "delete"))
            .allowed
    );
    assert!(
        set.check_kube(&l, &r("widgets.example.com", "dev", "w", "get"))
            .allowed
    );
    assert!(
        set.check_kube(&l, &r("namespace", "dev", "dev", "get"))
            .allowed
    );
    assert!(
        !set.check_kube(&l, &r("namespace", "prod", "prod", "get"))
            .allowed
    );
    assert!(
        !set.check_kube(&l, &r("pod", "prod", "db-1", "exec"))
            .allowed
    );
    // A node has no namespace: the rule's `dev` does not stop it.
    assert!(set.check_kube(&l, &r("node", "", "n1", "get")).allowed);
    // Listing every namespace's pods is not listing dev's.
    assert!(!set.check_kube(&l, &r("pod", "", "", "list")).allowed);
    let (groups, _) = set.kube_principals_for(&l, Some(&r("pod", "prod", "db-1", "get")));
    assert_eq!(groups, vec!["readers"]);
    let (groups, _) = set.kube_principals_for(&l, Some(&r("pod", "dev", "web-1", "get")));
    assert_eq!(groups, vec!["dev-admins"]);
    assert!(set.can_see_kube(&l) && set.can_see_kube(&labels(&[])));
    // A custom resource needs kind '*': `all` names only pods.
    let only_pods = RoleSet::new(
        &[role(
            "kind: role
version: v1
metadata: {name: pods}
spec:
  allow:
    kubernetes_labels: {'*': '*'}
    kubernetes_resources: [{kind: pod, verbs: ['*']}]
",
        )],
        &traits(&[]),
    );
    assert!(
        !only_pods
            .check_kube(&l, &r("widgets.example.com", "dev", "w", "get"))
            .allowed
    );
}

/// A list or watch the roles do not allow whole may still be forwarded and filtered: when some
/// allow rule could match an item of it and no deny rule covers all of it.
#[test]
fn kube_lists_that_may_be_filtered() {
    let set = RoleSet::new(
        &[
            role(
                "kind: role
version: v1
metadata: {name: web}
spec:
  allow:
    kubernetes_labels: {env: dev}
    kubernetes_groups: [web-readers]
    kubernetes_resources:
      - {kind: pod, namespace: dev, name: 'web-*', verbs: [get, list, watch]}
      - {kind: configmap, namespace: 'team-*', verbs: [list]}
      - {kind: namespace, name: staging, verbs: [list]}
      - {kind: node, namespace: dev, name: 'n-*', verbs: [list]}
  deny:
    kubernetes_resources:
      - {kind: configmap, namespace: team-secret, name: '*', verbs: [list]}
      - {kind: service, namespace: dev, name: 'admin-*', verbs: ['*']}
",
            ),
            role(
                "kind: role
version: v1
metadata: {name: ops}
spec:
  allow:
    kubernetes_labels: {env: dev}
    kubernetes_groups: [ops]
    kubernetes_resources:
      - {kind: service, namespace: '*', name: '*', verbs: [list, watch]}
      - {kind: secret, namespace: '*', name: '*', verbs: [list]}
  deny:
    kubernetes_resources:
      - {kind: '*', namespace: vault, verbs: [list]}
      - {kind: namespace, name: 'kube-*', verbs: [list]}
",
            ),
            role(
                "kind: role
version: v1
metadata: {name: prod-off}
spec:
  deny:
    kubernetes_labels: {env: prod}
",
            ),
        ],
        &traits(&[]),
    );
    let dev = labels(&[("env", "dev")]);
    // (kind, namespace, verb, may list, allowed whole)
    let cases: &[(&str, &str, &str, bool, bool)] = &[
        // The rule names some pods of dev: dev's list and every namespace's may be filtered.
        ("pod", "dev", "list", true, false),
        ("pod", "dev", "watch", true, false),
        ("pod", "", "list", true, false),
        ("pod", "prod", "list", false, false),
        // A verb no rule gives.
        ("pod", "dev", "deletecollection", false, false),
        // A namespace glob, and a deny covering one namespace whole.
        ("configmap", "team-a", "list", true, true),
        ("configmap", "", "list", true, false),
        ("configmap", "team-secret", "list", false, false),
        ("configmap", "dev", "list", false, false),
        // `kind: namespace` covers what is in the namespaces it names, and the namespaces.
        ("secret", "staging", "list", true, true),
        ("deployment", "staging", "list", true, true),
        ("deployment", "", "list", true, false),
        ("deployment", "dev", "list", false, false),
        // A cluster-wide kind (a namespace too) ignores a rule's namespace: allowed by `node`
        // in dev, and then denied whole by ops's `kind: '*'` in vault.
        ("namespace", "", "list", false, false),
        ("node", "", "list", false, false),
        ("node", "", "watch", false, false),
        // Allowed whole, but a deny names some items: filtered all the same.
        ("service", "dev", "list", true, false),
        ("service", "prod", "list", true, true),
        // `kind: '*'` denied in vault: nothing of it may be listed; and since an item of every
        // namespace may be in vault (or kube-*), a list of all of them is filtered.
        ("service", "vault", "list", false, false),
        ("secret", "vault", "list", false, false),
        ("secret", "", "list", true, false),
        // A custom resource: only `kind: '*'` would match it.
        ("widgets.example.com", "dev", "list", false, false),
    ];
    for &(kind, ns, verb, may, whole) in cases {
        assert_eq!(
            set.kube_may_list(&dev, kind, ns, verb),
            may,
            "may list {kind} in {ns:?} ({verb})"
        );
        assert_eq!(
            set.kube_allows_whole_list(&dev, kind, ns, verb),
            whole,
            "{kind} in {ns:?} ({verb}) allowed whole"
        );
    }
    // A cluster no role allows, or one a role denies.
    assert!(!set.kube_may_list(&labels(&[("env", "qa")]), "pod", "dev", "list"));
    assert!(!set.kube_may_list(&labels(&[("env", "prod")]), "pod", "dev", "list"));
    // Every item is then decided by check_kube: web-1 yes, db-1 and dev's other pods no.
    let r = |kind, namespace, name, verb| KubeRequest {
        kind,
        namespace,
        name,
        verb,
    };
    assert!(
        set.check_kube(&dev, &r("pod", "dev", "web-1", "list"))
            .allowed
    );
    assert!(
        !set.check_kube(&dev, &r("pod", "dev", "shell", "list"))
            .allowed
    );
    assert!(!set.check_kube(&dev, &r("pod", "", "", "list")).allowed);
    // The principals are those of the roles that could allow an item.
    assert_eq!(
        set.kube_principals_for_list(&dev, "pod", "", "list").0,
        vec!["web-readers"]
    );
    assert_eq!(
        set.kube_principals_for_list(&dev, "service", "dev", "list")
            .0,
        vec!["ops"]
    );
    assert_eq!(
        set.kube_principals_for_list(&dev, "secret", "staging", "list")
            .0,
        vec!["ops", "web-readers"]
    );
}

/// A deny rule covers a whole collection only when it matches every item: any name, and the
/// namespace (or all of them).
#[test]
fn kube_deny_rules_that_cover_a_whole_list() {
    let set = |deny: &str| {
        RoleSet::new(
            &[role(&format!(
                "kind: role
version: v1
metadata: {{name: r}}
spec:
  allow:
    kubernetes_labels: {{'*': '*'}}
  deny:
    kubernetes_resources: [{deny}]
"
            ))],
            &traits(&[]),
        )
    };
    let l = labels(&[]);
    // (deny rule, kind, namespace, may list, allowed whole)
    #[rustfmt::skip]
    let cases: &[(&str, &str, &str, bool, bool)] = &[
        ("{kind: pod, namespace: dev, name: '*', verbs: [list]}", "pod", "dev", false, false),
        ("{kind: pod, namespace: dev, name: '*', verbs: [list]}", "pod", "", true, false),
        ("{kind: pod, namespace: dev, name: '*', verbs: [watch]}", "pod", "dev", true, true),
        ("{kind: pod, namespace: 'd*', verbs: [list]}", "pod", "dev", false, false),
        ("{kind: pod, namespace: dev, name: 'web-*', verbs: [list]}", "pod", "dev", true, false),
        ("{kind: pod, verbs: ['*']}", "pod", "", false, false),
        ("{kind: '*', verbs: [list]}", "secret", "", false, false),
        ("{kind: '*', verbs: [list]}", "node", "", false, false),
        ("{kind: namespace, name: dev, verbs: [list]}", "pod", "dev", false, false),
        ("{kind: namespace, name: dev, verbs: [list]}", "pod", "", true, false),
        ("{kind: namespace, name: dev, verbs: [list]}", "node", "", true, true),
        ("{kind: namespace, name: dev, verbs: [list]}", "namespace", "", true, false),
        ("{kind: namespace, verbs: [list]}", "pod", "", false, false),
        ("{kind: namespace, verbs: [list]}", "namespace", "", false, false),
        ("{kind: node, namespace: dev, verbs: [list]}", "node", "", false, false),
    ];
    for &(deny, kind, ns, may, whole) in cases {
        let set = set(deny);
        assert_eq!(
            set.kube_may_list(&l, kind, ns, "list"),
            may,
            "deny {deny}: list {kind} in {ns:?}"
        );
        assert_eq!(
            set.kube_allows_whole_list(&l, kind, ns, "list"),
            whole,
            "deny {deny}: {kind} in {ns:?} whole"
        );
    }
}

/// What the door does with a list rests on two promises, checked here over random roles:
/// `kube_may_list` is never false while an item of the collection is allowed (no list refused
/// that has something to show), and `kube_allows_whole_list` is never true while an item is
/// refused (no list forwarded unfiltered that holds something hidden).
mod kube_list_properties {
    use super::*;
    use proptest::prelude::*;
    use proptest::sample::select;

    const KINDS: &[&str] = &["pod", "secret", "namespace", "node", "*"];
    const PATTERNS: &[&str] = &[
        "*",
        "dev",
        "prod",
        "d*",
        "web-*",
        "^(dev|web-1)$",
        "^(|web-1)$",
        "kube-*",
    ];
    const VERBS: &[&str] = &["list", "watch", "get", "*"];
    const NAMESPACES: &[&str] = &["dev", "prod", "kube-system", "web-1"];
    const NAMES: &[&str] = &["web-1", "db-1", "dev", "prod"];

    fn arb_rules(max: usize) -> impl Strategy<Value = Vec<String>> {
        proptest::collection::vec(
            (
                select(KINDS),
                select(PATTERNS),
                select(PATTERNS),
                select(VERBS),
            )
                .prop_map(|(k, ns, n, v)| {
                    format!("{{kind: '{k}', namespace: '{ns}', name: '{n}', verbs: ['{v}']}}")
                }),
            0..max,
        )
    }

    fn arb_role() -> impl Strategy<Value = Role> {
        (arb_rules(3), arb_rules(2), any::<bool>()).prop_map(|(allow, deny, here)| {
            let cluster = if here { "dev" } else { "prod" };
            let deny = if deny.is_empty() {
                String::new()
            } else {
                format!(
                    "  deny:\n    kubernetes_resources: [{}]\n",
                    deny.join(", ")
                )
            };
            role(&format!(
                "kind: role\nversion: v1\nmetadata: {{name: r}}\nspec:\n  allow:\n    kubernetes_labels: {{env: {cluster}}}\n    kubernetes_resources: [{}]\n{deny}",
                allow.join(", ")
            ))
        })
    }

    /// Some objects of a collection: (namespace as the evaluator sees it, name).
    fn items(kind: &str, namespace: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for name in NAMES {
            match kind {
                "namespace" => out.push((name.to_string(), name.to_string())),
                "node" => out.push((String::new(), name.to_string())),
                _ if namespace.is_empty() => {
                    for ns in NAMESPACES {
                        out.push((ns.to_string(), name.to_string()));
                    }
                }
                _ => out.push((namespace.to_string(), name.to_string())),
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn lists_agree_with_their_items(roles in proptest::collection::vec(arb_role(), 1..4)) {
            let set = RoleSet::new(&roles, &traits(&[]));
            let l = labels(&[("env", "dev")]);
            for kind in ["pod", "secret", "namespace", "node"] {
                let namespaces: &[&str] = if crate::kube::cluster_wide(kind) { &[""] } else { &["", "dev", "prod"] };
                for &ns in namespaces {
                    for verb in ["list", "watch"] {
                        let allowed: Vec<bool> = items(kind, ns)
                            .iter()
                            .map(|(ins, name)| {
                                set.check_kube(&l, &KubeRequest { kind, namespace: ins, name, verb }).allowed
                            })
                            .collect();
                        let may = set.kube_may_list(&l, kind, ns, verb);
                        let whole = set.kube_allows_whole_list(&l, kind, ns, verb);
                        prop_assert!(may || !allowed.contains(&true), "{kind} in {ns:?} ({verb}): an item is allowed, the list refused");
                        prop_assert!(!whole || !allowed.contains(&false), "{kind} in {ns:?} ({verb}): allowed whole, an item refused");
                        prop_assert!(!whole || may);
                    }
                }
            }
        }
    }
}

#[test]
fn rules() {
    let p = presets();
    let editor = RoleSet::new(&p[1..2], &Traits::new());
    assert!(editor.check_rule("role", "create").allowed);
    let auditor = RoleSet::new(&p[2..3], &Traits::new());
    assert!(auditor.check_rule("event", "list").allowed);
    let d = auditor.check_rule("role", "create");
    assert!(!d.allowed);
    assert_eq!(d.explanation, "role auditor lacks `create` on `role`");
    let deny = role(
        "kind: role\nversion: v1\nmetadata: {name: no-users}\nspec:\n  deny:\n    rules: [{resources: [user], verbs: [delete]}]\n",
    );
    let set = RoleSet::new(&[p[1].clone(), deny], &Traits::new());
    assert_eq!(
        set.check_rule("user", "delete").explanation,
        "role no-users denies `delete` on `user`"
    );
    assert!(set.check_rule("user", "create").allowed);
}

#[test]
fn templates() {
    let mut t = Traits::new();
    t.insert("external.email".into(), vec!["alice@example.com".into()]);
    t.insert(
        "external.groups".into(),
        vec!["team-db".into(), "admins".into()],
    );
    assert_eq!(
        template::expand("{{email.local(external.email)}}", &t),
        vec!["alice"]
    );
    assert_eq!(
        template::expand(
            r#"{{regexp.replace(external.groups, "^team-(.*)$", "$1")}}"#,
            &t
        ),
        vec!["db"]
    );
    assert_eq!(
        template::expand("{{external.missing}}", &t),
        Vec::<String>::new()
    );
    assert_eq!(
        template::expand("x-{{external.email}}", &t),
        vec!["x-alice@example.com"]
    );
    assert!(template::parse("{{bogus.x}}").is_err());
    assert!(template::parse("{{internal.logins").is_err());
}

#[test]
fn bad_roles_are_refused_where_they_are_wrong() {
    let cases = [
        (
            "spec:\n  allow:\n    rules: [{resources: [role], verbs: [craete]}]\n",
            "unknown verb \"craete\"",
            "line 7",
        ),
        (
            "spec:\n  allow:\n    rules: [{resources: [rolez], verbs: [read]}]\n",
            "unknown resource \"rolez\"",
            "line 7",
        ),
        (
            "spec:\n  allow:\n    node_labels: {env: '^prod-($'}\n",
            "bad regular expression",
            "line 7",
        ),
        (
            "spec:\n  options: {max_session_ttl: forever}\n",
            "invalid duration",
            "line 6",
        ),
        (
            "spec:\n  allow:\n    logins: ['{{internal.logins']\n",
            "unterminated template",
            "line 7",
        ),
        (
            "spec:\n  allow:\n    kubernetes_resources: [{kind: pods, verbs: [get]}]\n",
            "unknown kubernetes kind",
            "line 7",
        ),
        (
            "spec:\n  allow:\n    kubernetes_resources: [{kind: pod, verbs: [run]}]\n",
            "unknown kubernetes verb",
            "line 7",
        ),
        (
            "spec:\n  allow:\n    lgins: [root]\n",
            "unknown field `lgins`",
            "line 7",
        ),
    ];
    for (spec, want, line) in cases {
        let text = format!("kind: role\nversion: v1\nmetadata:\n  name: r\n{spec}");
        let e = serde_saphyr::from_str::<Role>(&text)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains(want) && e.contains(line), "{spec}: {e}");
    }
    let r = role("kind: role\nversion: v1\nmetadata: {name: ok}\n");
    let mut bad = r.clone();
    bad.kind = "rol".into();
    assert!(bad.validate().is_err());
    let mut bad = r;
    bad.metadata.name = "no/slash".into();
    assert_eq!(
        bad.validate().err().map(|e| e.field),
        Some("metadata.name".into())
    );
}

#[test]
fn shipped_example_roles_mean_what_their_comments_say() {
    use crate::resource::{Resource, parse_all};
    let mut roles = Vec::new();
    for (name, text) in [
        (
            "environments.yaml",
            include_str!("../../../config/roles/environments.yaml"),
        ),
        (
            "auditor.yaml",
            include_str!("../../../config/roles/auditor.yaml"),
        ),
        (
            "kube-developer.yaml",
            include_str!("../../../config/roles/kube-developer.yaml"),
        ),
    ] {
        for r in parse_all(text, name).unwrap_or_else(|e| panic!("{e}")) {
            if let Resource::Role(r) = r {
                roles.push(r);
            }
        }
    }
    let by = |n: &str| {
        roles
            .iter()
            .find(|r| r.name() == n)
            .cloned()
            .unwrap_or_else(|| panic!("{n}"))
    };
    let t = traits(&["alice"]);
    let eng = RoleSet::new(&[by("engineering")], &t);
    assert!(
        eng.check_node("alice", &labels(&[("env", "staging"), ("team", "x")]))
            .allowed
    );
    assert!(
        eng.check_node("ubuntu", &labels(&[("env", "dev-3"), ("team", "x")]))
            .allowed
    );
    assert!(
        !eng.check_node("alice", &labels(&[("env", "prod"), ("team", "x")]))
            .allowed
    );
    let both = RoleSet::new(&[by("engineering"), by("oncall")], &t);
    assert!(
        !both.check_node("root", &labels(&[("env", "prod")])).allowed,
        "engineering's deny wins"
    );
    let oncall = RoleSet::new(&[by("oncall")], &t);
    assert!(
        oncall
            .check_node("root", &labels(&[("env", "prod-eu")]))
            .allowed
    );
    assert_eq!(oncall.record_ssh(), RecordMode::Strict);
    let auditor = RoleSet::new(&[by("security-auditor"), by("engineering")], &t);
    assert!(
        auditor.logins().is_empty(),
        "deny logins '*' leaves no principal"
    );
    assert!(
        !auditor
            .check_node("alice", &labels(&[("env", "staging"), ("team", "x")]))
            .allowed
    );
    assert!(auditor.check_rule("event", "list").allowed);
    let kube = RoleSet::new(&[by("kube-developer")], &t);
    let staging = labels(&[("env", "staging")]);
    let req = |kind, namespace, verb| KubeRequest {
        kind,
        namespace,
        name: "x",
        verb,
    };
    assert!(
        kube.check_kube(&staging, &req("pod", "staging-web", "exec"))
            .allowed
    );
    assert!(
        !kube
            .check_kube(&staging, &req("pod", "prod-web", "exec"))
            .allowed
    );
    assert!(
        !kube
            .check_kube(&staging, &req("secret", "staging-web", "get"))
            .allowed
    );
    assert!(kube.logins().is_empty());
}

#[test]
fn allow_logins_cannot_be_patterns() {
    let e = role_err(
        "kind: role\nversion: v1\nmetadata: {name: x}\nspec:\n  allow:\n    logins: ['*']\n",
    );
    assert!(e.contains("allowed logins are names"), "{e}");
}

#[test]
fn deny_logins_are_names_or_every_login() {
    // `ro*` was accepted and denied nothing: refused now, with what to write instead.
    for bad in ["ro*", "*admin", "^ro.*$", "ro?t", "r[o]ot"] {
        let e = role_err(&format!(
            "kind: role\nversion: v1\nmetadata: {{name: x}}\nspec:\n  deny:\n    logins: ['{bad}']\n"
        ));
        assert!(
            e.contains("denied logins are names, or `*` for every login, not patterns"),
            "{bad}: {e}"
        );
    }
    for good in ["root", "*", "svc$", "{{internal.logins}}"] {
        let e = role_err(&format!(
            "kind: role\nversion: v1\nmetadata: {{name: x}}\nspec:\n  deny:\n    logins: ['{good}']\n"
        ));
        assert_eq!(e, "", "{good}");
    }
}

fn role_err(yaml: &str) -> String {
    match serde_saphyr::from_str::<Role>(yaml) {
        Ok(r) => r
            .validate()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default(),
        Err(e) => e.to_string(),
    }
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    const KEYS: &[&str] = &["env", "team", "region"];
    const VALUES: &[&str] = &["prod", "staging", "dev", "web", "db", "eu"];
    const LOGINS: &[&str] = &["root", "ubuntu", "alice"];

    fn arb_value() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => proptest::sample::select(VALUES).prop_map(str::to_string),
            1 => Just("*".to_string()),
            1 => proptest::sample::select(VALUES).prop_map(|v| format!("{}*", &v[..1])),
            1 => proptest::sample::select(VALUES).prop_map(|v| format!("^({v}|x)$")),
        ]
    }

    fn arb_labels() -> impl Strategy<Value = BTreeMap<String, Vec<String>>> {
        proptest::collection::btree_map(
            proptest::sample::select(KEYS).prop_map(str::to_string),
            proptest::collection::vec(arb_value(), 1..3),
            0..3,
        )
    }

    fn arb_node() -> impl Strategy<Value = BTreeMap<String, String>> {
        proptest::collection::btree_map(
            proptest::sample::select(KEYS).prop_map(str::to_string),
            proptest::sample::select(VALUES).prop_map(str::to_string),
            0..4,
        )
    }

    fn arb_conditions() -> impl Strategy<Value = Conditions> {
        (
            proptest::collection::vec(proptest::sample::select(LOGINS), 0..3),
            arb_labels(),
        )
            .prop_map(|(logins, labels)| Conditions {
                logins: logins.into_iter().map(Pattern::from).collect(),
                node_labels: labels
                    .into_iter()
                    .map(|(k, vs)| {
                        (
                            k,
                            LabelValues::Many(
                                vs.into_iter().map(|v| Pattern::from(v.as_str())).collect(),
                            ),
                        )
                    })
                    .collect(),
                ..Default::default()
            })
    }

    fn arb_role() -> impl Strategy<Value = Role> {
        (arb_conditions(), arb_conditions(), any::<bool>()).prop_map(|(allow, deny, has_deny)| {
            Role {
                kind: "role".into(),
                version: "v1".into(),
                metadata: Metadata {
                    name: "r".into(),
                    ..Default::default()
                },
                spec: RoleSpec {
                    allow,
                    deny: if has_deny {
                        deny
                    } else {
                        Conditions::default()
                    },
                    ..Default::default()
                },
            }
        })
    }

    /// The reference: what a label selector means, written as plainly as possible.
    fn reference_matches(
        selector: &BTreeMap<String, Vec<String>>,
        node: &BTreeMap<String, String>,
    ) -> bool {
        fn value_matches(pattern: &str, v: &str) -> bool {
            if pattern == "*" {
                true
            } else if let Some(alts) = pattern
                .strip_prefix("^(")
                .and_then(|p| p.strip_suffix(")$"))
            {
                alts.split('|').any(|a| a == v)
            } else if let Some(prefix) = pattern.strip_suffix('*') {
                v.starts_with(prefix)
            } else {
                pattern == v
            }
        }
        !selector.is_empty()
            && selector.iter().all(|(k, pats)| match node.get(k) {
                Some(v) => pats.iter().any(|p| value_matches(p, v)),
                None => false,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn label_matching_agrees_with_reference(sel in arb_labels(), node in arb_node()) {
            prop_assert_eq!(LabelSelector::compile(&sel).matches(&node), reference_matches(&sel, &node));
        }

        #[test]
        fn deny_always_wins(roles in proptest::collection::vec(arb_role(), 1..5), node in arb_node(), login in proptest::sample::select(LOGINS)) {
            let set = RoleSet::new(&roles, &Traits::new());
            let denied = roles.iter().any(|r| {
                r.spec.deny.logins.iter().any(|l| l.as_str() == login)
                    || {
                        let sel: BTreeMap<String, Vec<String>> = r.spec.deny.node_labels.iter()
                            .map(|(k, v)| (k.clone(), v.values().iter().map(|p| p.as_str().to_string()).collect())).collect();
                        reference_matches(&sel, &node)
                    }
            });
            if denied {
                prop_assert!(!set.check_node(login, &node).allowed);
            }
        }

        #[test]
        fn adding_an_allow_never_removes_access(roles in proptest::collection::vec(arb_role(), 1..4), extra in arb_conditions(), node in arb_node(), login in proptest::sample::select(LOGINS)) {
            let before = RoleSet::new(&roles, &Traits::new()).check_node(login, &node).allowed;
            let mut more = roles.clone();
            more.push(Role { spec: RoleSpec { allow: extra, ..Default::default() }, ..roles[0].clone() });
            let after = RoleSet::new(&more, &Traits::new()).check_node(login, &node).allowed;
            prop_assert!(!before || after);
        }

        #[test]
        fn adding_a_deny_never_adds_access(roles in proptest::collection::vec(arb_role(), 1..4), extra in arb_conditions(), node in arb_node(), login in proptest::sample::select(LOGINS)) {
            let before = RoleSet::new(&roles, &Traits::new()).check_node(login, &node).allowed;
            let mut more = roles.clone();
            more.push(Role { spec: RoleSpec { deny: extra, ..Default::default() }, ..roles[0].clone() });
            let after = RoleSet::new(&more, &Traits::new()).check_node(login, &node).allowed;
            prop_assert!(before || !after);
        }
    }
}

/// Host user creation as Teleport combines it: every role allowing the login on the node must
/// ask (unset is `off`), `keep` beats `insecure-drop`, groups and sudoers are the union of the
/// allowing roles', deny sides remove.
#[test]
fn host_user_decisions() {
    let host = |name: &str, mode: &str, logins: &str, labels: &str, extra: &str| {
        role(&format!(
            "kind: role\nversion: v1\nmetadata: {{name: {name}}}\nspec:\n  options: {{{mode}}}\n  allow:\n    logins: [{logins}]\n    node_labels: {{{labels}}}\n{extra}"
        ))
    };
    let keep = host(
        "keep",
        "create_host_user_mode: keep",
        "dev",
        "env: dev",
        "    host_groups: [adm, docker]\n    host_sudoers: ['ALL=(ALL) NOPASSWD: /usr/bin/true']\n",
    );
    let drop = host(
        "drop",
        "create_host_user_mode: insecure-drop",
        "dev, tmp",
        "'*': '*'",
        "    host_groups: [docker, audio]\n    host_sudoers: ['ALL=(ALL) NOPASSWD: /usr/bin/true', 'ALL=(root) NOPASSWD: /usr/bin/id']\n",
    );
    let off = host("off", "create_host_user_mode: off", "dev", "'*': '*'", "");
    let unset = host("unset", "", "dev", "'*': '*'", "");
    let off_elsewhere = host(
        "offprod",
        "create_host_user_mode: off",
        "dev",
        "env: prod",
        "",
    );
    let other_login = host("other", "create_host_user_mode: off", "ops", "'*': '*'", "");
    let deny = role(
        "kind: role\nversion: v1\nmetadata: {name: deny}\nspec:\n  deny:\n    host_groups: [audio]\n    host_sudoers: ['ALL=(root) NOPASSWD: /usr/bin/id']\n",
    );
    let deny_all_sudo = role(
        "kind: role\nversion: v1\nmetadata: {name: nosudo}\nspec:\n  deny:\n    host_sudoers: ['*']\n",
    );
    let dev = labels(&[("env", "dev")]);
    let prod = labels(&[("env", "prod")]);
    let g = |v: &[&str]| -> Vec<String> { v.iter().map(|s| s.to_string()).collect() };
    let true_only = "ALL=(ALL) NOPASSWD: /usr/bin/true";
    let id_too = "ALL=(root) NOPASSWD: /usr/bin/id";
    #[allow(clippy::type_complexity)]
    let cases: Vec<(
        &str,
        Vec<&Role>,
        &str,
        &BTreeMap<String, String>,
        Option<(HostUserMode, Vec<String>, Vec<String>)>,
    )> = vec![
        (
            "one role keeps",
            vec![&keep],
            "dev",
            &dev,
            Some((HostUserMode::Keep, g(&["adm", "docker"]), g(&[true_only]))),
        ),
        ("not on its nodes", vec![&keep], "dev", &prod, None),
        ("a login no role allows", vec![&keep], "tmp", &dev, None),
        (
            "drop alone",
            vec![&drop],
            "tmp",
            &prod,
            Some((
                HostUserMode::InsecureDrop,
                g(&["docker", "audio"]),
                g(&[true_only, id_too]),
            )),
        ),
        (
            "keep beats drop, groups and lines unite",
            vec![&drop, &keep],
            "dev",
            &dev,
            Some((
                HostUserMode::Keep,
                g(&["docker", "audio", "adm"]),
                g(&[true_only, id_too]),
            )),
        ),
        (
            "one explicit off refuses",
            vec![&keep, &off],
            "dev",
            &dev,
            None,
        ),
        (
            "off first refuses too",
            vec![&off, &keep],
            "dev",
            &dev,
            None,
        ),
        (
            "unset counts as off",
            vec![&keep, &unset],
            "dev",
            &dev,
            None,
        ),
        (
            "off for other nodes does not count",
            vec![&keep, &off_elsewhere],
            "dev",
            &dev,
            Some((HostUserMode::Keep, g(&["adm", "docker"]), g(&[true_only]))),
        ),
        (
            "off for another login does not count",
            vec![&keep, &other_login],
            "dev",
            &dev,
            Some((HostUserMode::Keep, g(&["adm", "docker"]), g(&[true_only]))),
        ),
        (
            "deny removes a group and a line",
            vec![&drop, &deny],
            "tmp",
            &dev,
            Some((HostUserMode::InsecureDrop, g(&["docker"]), g(&[true_only]))),
        ),
        (
            "deny * removes every line",
            vec![&drop, &deny_all_sudo],
            "tmp",
            &dev,
            Some((HostUserMode::InsecureDrop, g(&["docker", "audio"]), vec![])),
        ),
    ];
    for (what, roles, login, node, want) in cases {
        let roles: Vec<Role> = roles.into_iter().cloned().collect();
        let got = RoleSet::new(&roles, &traits(&[]))
            .host_user(login, node)
            .map(|h| {
                (
                    h.mode,
                    h.groups
                        .iter()
                        .map(|g| g.as_str().to_string())
                        .collect::<Vec<_>>(),
                    h.sudoers
                        .iter()
                        .map(|l| l.as_str().to_string())
                        .collect::<Vec<_>>(),
                )
            });
        assert_eq!(got, want, "{what}");
    }
}

#[test]
fn bad_host_user_options_are_refused_where_they_are_wrong() {
    let cases = [
        (
            "spec:\n  options: {create_host_user_mode: drop}\n",
            "unknown variant `drop`, expected one of off, keep, insecure-drop",
            "line 6",
        ),
        (
            "spec:\n  allow:\n    host_groups: [adm, '-G root']\n",
            "bad host group \"-G root\": a group name starts with a letter or `_`",
            "line 7",
        ),
        (
            "spec:\n  allow:\n    host_groups: ['wheel,root']\n",
            "bad host group \"wheel,root\"",
            "line 7",
        ),
        (
            "spec:\n  allow:\n    host_sudoers: [\"ALL=(ALL) ALL\\nroot ALL=(ALL) ALL\"]\n",
            "has a line break: each entry is one sudoers line",
            "line 7",
        ),
        (
            "spec:\n  allow:\n    host_sudoers: ['ALL=(ALL) \\']\n",
            "which would continue it on the next line",
            "line 7",
        ),
        (
            "spec:\n  allow:\n    host_sudoers: ['  ']\n",
            "empty host_sudoers entry",
            "line 7",
        ),
    ];
    for (spec, want, line) in cases {
        let text = format!("kind: role\nversion: v1\nmetadata:\n  name: r\n{spec}");
        let e = serde_saphyr::from_str::<Role>(&text)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains(want) && e.contains(line), "{spec}: {e}");
    }
}

#[test]
fn the_shipped_host_users_role_means_what_its_comments_say() {
    use crate::resource::{Resource, parse_all};
    let roles: Vec<Role> = parse_all(
        include_str!("../../../config/roles/host-users.yaml"),
        "host-users.yaml",
    )
    .unwrap_or_else(|e| panic!("{e}"))
    .into_iter()
    .filter_map(|r| match r {
        Resource::Role(r) => Some(r),
        _ => None,
    })
    .collect();
    let set = RoleSet::new(&roles, &traits(&["jo"]));
    let h = set
        .host_user("jo", &labels(&[("env", "dev")]))
        .unwrap_or_else(|| panic!("no host user on dev"));
    assert_eq!(h.mode, HostUserMode::InsecureDrop);
    assert_eq!(
        h.groups.iter().map(HostGroup::as_str).collect::<Vec<_>>(),
        ["adm", "docker"]
    );
    assert_eq!(
        h.sudoers
            .iter()
            .map(SudoersLine::as_str)
            .collect::<Vec<_>>(),
        ["ALL=(root) NOPASSWD: /usr/bin/systemctl restart app"]
    );
    assert_eq!(set.host_user("jo", &labels(&[("env", "prod")])), None);
    assert_eq!(set.host_user("root", &labels(&[("env", "dev")])), None);
    // With the preset `access` role allowing the same login everywhere, and not asking: off.
    let mut with_access = roles.clone();
    with_access.extend(presets().into_iter().filter(|r| r.name() == "access"));
    let set = RoleSet::new(&with_access, &traits(&["jo"]));
    assert_eq!(set.host_user("jo", &labels(&[("env", "dev")])), None);
}
