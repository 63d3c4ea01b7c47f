use super::*;

fn c(method: &str, path: &str, query: &str) -> Classified {
    classify(method, path, query).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn paths_read_as_the_api_server_reads_them() {
    let x = c("GET", "/api/v1/namespaces/dev/pods/web-1", "");
    assert_eq!(
        (
            x.kind.as_str(),
            x.namespace.as_str(),
            x.name.as_str(),
            x.verb
        ),
        ("pod", "dev", "web-1", "get")
    );
    let x = c("GET", "/api/v1/namespaces/dev/pods", "limit=500");
    assert_eq!(
        (x.kind.as_str(), x.name.as_str(), x.verb),
        ("pod", "", "list")
    );
    assert_eq!(
        c("GET", "/api/v1/namespaces/dev/pods", "watch=true").verb,
        "watch"
    );
    assert_eq!(
        c(
            "GET",
            "/api/v1/namespaces/dev/pods",
            "watch=1&resourceVersion=3"
        )
        .verb,
        "watch"
    );
    assert_eq!(
        c("GET", "/api/v1/watch/namespaces/dev/pods", "").verb,
        "watch"
    );
    assert_eq!(
        c("GET", "/api/v1/namespaces/dev/pods", "watch=false").verb,
        "list"
    );
    assert_eq!(
        c("DELETE", "/api/v1/namespaces/dev/pods", "").verb,
        "deletecollection"
    );
    assert_eq!(
        c("DELETE", "/api/v1/namespaces/dev/pods/web-1", "").verb,
        "delete"
    );
    assert_eq!(c("POST", "/api/v1/namespaces/dev/pods", "").verb, "create");
    assert_eq!(
        c("PATCH", "/apis/apps/v1/namespaces/dev/deployments/api", "").kind,
        "deployment"
    );
    let x = c(
        "POST",
        "/api/v1/namespaces/dev/pods/web-1/exec",
        "command=sh",
    );
    assert!(x.is_exec() && x.verb == "exec" && x.name == "web-1");
    assert_eq!(
        c("GET", "/api/v1/namespaces/dev/pods/web-1/attach", "").verb,
        "exec"
    );
    let x = c("GET", "/api/v1/namespaces/dev/pods/web-1/portforward", "");
    assert!(x.is_portforward() && x.verb == "portforward");
    // Other subresources use the parent's verb.
    let x = c("GET", "/api/v1/namespaces/dev/pods/web-1/log", "");
    assert_eq!(
        (x.kind.as_str(), x.verb, x.subresource.as_str()),
        ("pod", "get", "log")
    );
    assert_eq!(
        c("PUT", "/api/v1/namespaces/dev/pods/web-1/status", "").verb,
        "update"
    );
    // A proxy subresource: the pod's own path follows, a trailing slash included.
    let x = c(
        "GET",
        "/api/v1/namespaces/dev/pods/web-1/proxy/healthz/",
        "",
    );
    assert_eq!(
        (
            x.kind.as_str(),
            x.name.as_str(),
            x.subresource.as_str(),
            x.verb
        ),
        ("pod", "web-1", "proxy", "proxy")
    );
    // Its own path is the pod's: encoded there, as the pod may need.
    assert_eq!(
        c("GET", "/api/v1/namespaces/dev/services/web/proxy/a%20b", "").verb,
        "proxy"
    );
    assert!(
        classify(
            "POST",
            "/api/v1/nodes/n1/proxy/run/kube-system/p/c",
            "cmd=sh"
        )
        .is_err()
    );
    // The namespace's own subresources.
    let x = c("PUT", "/api/v1/namespaces/dev/finalize", "");
    assert_eq!(
        (
            x.kind.as_str(),
            x.name.as_str(),
            x.namespace.as_str(),
            x.subresource.as_str()
        ),
        ("namespace", "dev", "dev", "finalize")
    );
    // `watch` as the API server reads the query: decoded, and anything but 0/false is true.
    for q in ["watch=yes", "watch=True", "%77atch=1", "watch=", "watch"] {
        assert_eq!(
            c("GET", "/api/v1/namespaces/dev/pods", q).verb,
            "watch",
            "{q}"
        );
    }
    for q in ["watch=0", "watch=false", "watch=FALSE", "watchx=1"] {
        assert_eq!(
            c("GET", "/api/v1/namespaces/dev/pods", q).verb,
            "list",
            "{q}"
        );
    }
    assert_eq!(
        c("GET", "/api/v1/namespaces/dev/pods/web-1/proxy/", "").subresource,
        "proxy"
    );
    // All namespaces.
    let x = c("GET", "/api/v1/pods", "");
    assert_eq!((x.namespace.as_str(), x.verb), ("", "list"));
    // The namespace object is in itself.
    let x = c("GET", "/api/v1/namespaces/dev", "");
    assert_eq!(
        (x.kind.as_str(), x.namespace.as_str(), x.name.as_str()),
        ("namespace", "dev", "dev")
    );
    // Custom resources keep their own word, which only kind '*' matches.
    assert_eq!(
        c("GET", "/apis/example.com/v1/namespaces/dev/widgets", "").kind,
        "widgets.example.com"
    );
    // A core-named resource in another group is not the core kind.
    assert_eq!(
        c("GET", "/apis/example.com/v1/namespaces/dev/pods", "").kind,
        "pods.example.com"
    );
}

#[test]
fn discovery_is_recognised_and_nothing_else_is() {
    for p in [
        "/api",
        "/api/v1",
        "/apis",
        "/apis/apps",
        "/apis/apps/v1",
        "/version",
        "/openapi/v2",
        "/openapi/v3/api/v1",
    ] {
        assert!(c("GET", p, "").discovery, "{p}");
    }
    for p in [
        "/api/v1/pods",
        "/metrics",
        "/logs/x",
        "/apis/apps/v1/deployments",
    ] {
        assert!(!c("GET", p, "").discovery, "{p}");
    }
    assert!(!c("POST", "/api/v1", "").discovery);
}

#[test]
fn ambiguous_paths_are_refused() {
    for p in [
        "/api/v1/namespaces/dev/pods/../../prod/pods",
        "/api/v1/namespaces/dev/pods/./x",
        "/api//v1/pods",
        "/api/v1/namespaces/dev%2Fpods",
        "/api/v1/namespaces/dev%2fpods",
        "/api/v1/namespaces/%2E%2E/pods",
        "/api/v1/namespaces\\dev/pods",
        "/api/v1/pods/",
        "/api/v1/namespaces/dev/pods/web-1/",
        "/api/v1/namespaces/dev/pods/web-1/proxy//x",
        "/api/v1/namespaces/dev/pods/web-1/proxy/../../../secrets",
        "api/v1/pods",
        // The API server decodes these to secrets, kube-system, nodes.
        "/api/v1/namespaces/dev/%73ecrets/db",
        "/api/v1/namespaces/kube-%73ystem/secrets/x",
        "/api/v1/%6eodes",
    ] {
        assert!(classify("GET", p, "").is_err(), "{p} was accepted");
    }
    assert!(classify("GET", "/api/v1/namespaces/dev/pods/a/b/c/d", "").is_err());
}

#[test]
fn impersonation_picks_from_what_the_roles_allow() {
    let none = AskedImpersonation::default();
    let p = impersonate("alice", &[], &["devs".into()], &none).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.user, "alice");
    assert_eq!(
        p.groups,
        vec!["devs".to_string(), AUTHENTICATED.to_string()]
    );
    let two = ["a".to_string(), "b".to_string()];
    let e = impersonate("alice", &two, &[], &none)
        .err()
        .unwrap_or_default();
    assert!(
        e.starts_with("impersonation request has been denied") && e.contains("--as"),
        "{e}"
    );
    let asked = AskedImpersonation {
        users: vec!["b".into()],
        ..Default::default()
    };
    assert_eq!(
        impersonate("alice", &two, &[], &asked).map(|p| p.user),
        Ok("b".to_string())
    );
    let asked = AskedImpersonation {
        users: vec!["root".into()],
        ..Default::default()
    };
    assert!(impersonate("alice", &two, &[], &asked).is_err());
    let asked = AskedImpersonation {
        users: vec!["a".into(), "b".into()],
        ..Default::default()
    };
    assert!(impersonate("alice", &two, &[], &asked).is_err());
    // An empty user is none.
    let asked = AskedImpersonation {
        users: vec![String::new()],
        ..Default::default()
    };
    assert_eq!(
        impersonate("alice", &[], &[], &asked).map(|p| p.user),
        Ok("alice".to_string())
    );
    let asked = AskedImpersonation {
        groups: vec!["system:masters".into()],
        ..Default::default()
    };
    assert!(impersonate("alice", &[], &["devs".into()], &asked).is_err());
    let asked = AskedImpersonation {
        groups: vec!["devs".into()],
        ..Default::default()
    };
    assert!(
        impersonate("alice", &[], &["devs".into(), "ops".into()], &asked)
            .is_ok_and(|p| !p.groups.contains(&"ops".to_string()))
    );
    let asked = AskedImpersonation {
        other: vec!["Impersonate-Uid".into()],
        ..Default::default()
    };
    assert!(impersonate("alice", &[], &[], &asked).is_err());
}

#[test]
fn the_certificate_extension_round_trips_through_a_certificate() {
    crate::install_crypto_provider();
    let ext = KubeCertExt {
        kube_cluster: "prod".into(),
        kube_users: vec!["alice".into()],
        kube_groups: vec!["x".repeat(300)],
    };
    let ca = crate::x509::TlsCa::generate("user", "example").unwrap_or_else(|e| panic!("{e}"));
    let kp = russh::keys::ssh_key::private::Ed25519Keypair::from_seed(&[3u8; 32]);
    let spki = crate::x509::ed25519_spki(&kp.public.0);
    let now = time::OffsetDateTime::now_utc();
    let subject = crate::x509::Subject {
        common_name: "alice".into(),
        organizations: vec!["access".into()],
        dns_names: vec![],
        server: false,
        not_before: now,
        not_after: now + time::Duration::hours(1),
    };
    let pem = ca
        .sign_with(&spki, &subject, Some(&ext))
        .unwrap_or_else(|e| panic!("{e}"));
    let der = crate::x509::pem_to_der(&pem).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(KubeCertExt::from_cert(&der), Some(ext));
    let plain = ca.sign(&spki, &subject).unwrap_or_else(|e| panic!("{e}"));
    let der = crate::x509::pem_to_der(&plain).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(KubeCertExt::from_cert(&der), None);
}
