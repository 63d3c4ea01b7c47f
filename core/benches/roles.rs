//! Role evaluation cost: one SSH access decision with 10 to 10,000 roles held by the user, and
//! filtering 10,000 nodes for `sally ls`. Goals: a decision under 20 µs at 1,000 roles; a
//! listing of 10,000 nodes under 20 ms.

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use sallyport_core::identity::internal_traits;
use sallyport_core::role::RoleSet;

/// `n` roles shaped like real ones: per-team node labels with globs and a regex, templated
/// logins, a deny rule in every tenth role.
fn roles(n: usize) -> Vec<sallyport_core::role::Role> {
    (0..n)
        .map(|i| {
            let deny = if i % 10 == 0 { format!("  deny:\n    node_labels: {{env: prod, team: team-{i}}}\n") } else { String::new() };
            let yaml = format!(
                "kind: role\nversion: v1\nmetadata: {{name: role-{i}}}\nspec:\n  options: {{max_session_ttl: 8h}}\n  allow:\n    logins: ['{{{{internal.logins}}}}', login-{i}]\n    node_labels: {{env: [staging, 'dev-*'], team: team-{i}, region: '^(eu|us)-[0-9]+$'}}\n{deny}"
            );
            serde_saphyr::from_str(&yaml).unwrap_or_else(|e| panic!("{e}"))
        })
        .collect()
}

fn node(team: usize, env: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("env".to_string(), env.to_string()),
        ("team".to_string(), format!("team-{team}")),
        ("region".to_string(), "eu-1".to_string()),
        ("hostname".to_string(), format!("web-{team}")),
    ])
}

fn decision(c: &mut Criterion) {
    let traits = internal_traits(&["alice".into(), "ubuntu".into()], &[], &[]);
    let mut g = c.benchmark_group("access decision");
    for n in [10usize, 100, 1_000, 10_000] {
        let set = RoleSet::new(&roles(n), &traits);
        // The worst case for the allow side: the matching role is the last one.
        let target = node(n - 1, "dev-7");
        assert!(set.check_node(&format!("login-{}", n - 1), &target).allowed);
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| black_box(set.check_node(black_box("alice"), black_box(&target))))
        });
    }
    g.finish();
}

fn listing(c: &mut Criterion) {
    let traits = internal_traits(&["alice".into()], &[], &[]);
    let nodes: Vec<_> = (0..10_000)
        .map(|i| node(i % 200, if i % 3 == 0 { "prod" } else { "staging" }))
        .collect();
    let mut g = c.benchmark_group("sally ls over 10,000 nodes");
    g.sample_size(20);
    for n in [10usize, 100] {
        let set = RoleSet::new(&roles(n), &traits);
        g.bench_with_input(BenchmarkId::new("roles", n), &n, |b, _| {
            b.iter(|| nodes.iter().filter(|l| set.can_see_node(l)).count())
        });
    }
    g.finish();
}

criterion_group!(benches, decision, listing);
criterion_main!(benches);
