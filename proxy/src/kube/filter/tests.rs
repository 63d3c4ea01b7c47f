//! The filter over bodies shaped as the API server writes them (`tests/kube/apiserver.py`
//! copies the real server's: compact JSON, Go's HTML-safe escapes, one watch event a line).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::*;

/// Alice's roles in the tests: dev's web-1 only.
fn web_1() -> Filter {
    Filter::new(|ns, name| ns == "dev" && name == "web-1", false)
}

fn watching(f: Filter) -> Filter {
    Filter { watch: true, ..f }
}

/// As the fixture's `gojson`: compact, `<`, `>`, `&` escaped.
fn gojson(v: &Value) -> String {
    v.to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

fn pod(ns: &str, name: &str, rv: u32) -> Value {
    json!({
        "metadata": {
            "name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}"),
            "resourceVersion": rv.to_string(), "creationTimestamp": "2025-05-15T08:55:49Z",
            "labels": {"app": name.split('-').next().unwrap()},
            "annotations": {"note": "a <b> & c", "big": 12345678901234567890u64},
        },
        "spec": {
            "containers": [{"name": "main", "image": "docker.io/library/busybox:1.36",
                "ports": [{"containerPort": 80, "protocol": "TCP"}]}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "nodeName": "node-1",
        },
        "status": {"phase": "Running", "podIP": "10.244.0.7", "startTime": "2025-05-15T08:55:49Z",
            "conditions": [{"type": "Ready", "status": "True", "lastProbeTime": null}]},
    })
}

fn pods() -> Vec<Value> {
    vec![
        pod("default", "shell", 1010),
        pod("dev", "web-1", 1007),
        pod("dev", "web-2", 1008),
        pod("prod", "db-1", 1009),
    ]
}

fn typed(p: &Value) -> Value {
    let mut o = json!({"kind": "Pod", "apiVersion": "v1"});
    for (k, v) in p.as_object().unwrap() {
        o[k] = v.clone();
    }
    o
}

/// In the API server's order of members (serde_json's `Value` would sort them).
fn pod_list() -> String {
    let items: Vec<String> = pods().iter().map(gojson).collect();
    format!(
        r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{"resourceVersion":"1012"}},"items":[{}]}}"#,
        items.join(",")
    ) + "\n"
}

fn columns() -> Value {
    json!([
        {"name": "Name", "type": "string", "format": "name", "description": "Name must be unique", "priority": 0},
        {"name": "Ready", "type": "string", "format": "", "description": "The aggregate readiness", "priority": 0},
        {"name": "Age", "type": "string", "format": "", "description": "CreationTimestamp", "priority": 0},
    ])
}

fn row(p: &Value) -> Value {
    json!({
        "cells": [p["metadata"]["name"], "1/1", "2h"],
        "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": p["metadata"]},
    })
}

fn table(objs: &[Value], version: &str, headers: bool) -> Value {
    json!({
        "kind": "Table", "apiVersion": format!("meta.k8s.io/{version}"),
        "metadata": {"resourceVersion": "1012"},
        "columnDefinitions": if headers { columns() } else { Value::Null },
        "rows": objs.iter().map(row).collect::<Vec<_>>(),
    })
}

fn event(kind: &str, object: Value) -> String {
    gojson(&json!({"type": kind, "object": object})) + "\n"
}

fn names(items: &Value) -> Vec<String> {
    items
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let m = if i.get("object").is_some() {
                &i["object"]["metadata"]
            } else {
                &i["metadata"]
            };
            format!(
                "{}/{}",
                m["namespace"].as_str().unwrap_or(""),
                m["name"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn a_list_keeps_the_allowed_items_and_everything_else_as_it_came() {
    let body = pod_list();
    let out = String::from_utf8(web_1().list(body.as_bytes()).unwrap()).unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(names(&v["items"]), vec!["dev/web-1"]);
    assert_eq!(v["metadata"]["resourceVersion"], "1012");
    // Byte for byte: the members in their order, the item kept exactly (escapes, a number
    // past f64), one line.
    assert!(
        out.starts_with(r#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1012"},"items":[{"#),
        "{out}"
    );
    let web1 = gojson(&pod("dev", "web-1", 1007));
    assert!(out.contains(&format!("[{web1}]")), "{out}");
    assert!(out.contains(r#""a \u003cb\u003e \u0026 c""#));
    assert!(out.contains("12345678901234567890"));
    assert!(out.ends_with("}\n"));

    // Every namespace's, nothing allowed, nothing there.
    let none = Filter::new(|_, _| false, false);
    let v: Value = serde_json::from_slice(&none.list(body.as_bytes()).unwrap()).unwrap();
    assert_eq!(v["items"], json!([]));
    let empty =
        r#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":null}"#;
    assert_eq!(web_1().list(empty.as_bytes()).unwrap(), empty.as_bytes());
    // An item with no metadata cannot be told: not shown.
    let odd = r#"{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[{"spec":{}},{"metadata":{"name":"web-1","namespace":"dev"}}]}"#;
    let v: Value = serde_json::from_slice(&web_1().list(odd.as_bytes()).unwrap()).unwrap();
    assert_eq!(names(&v["items"]), vec!["dev/web-1"]);
}

#[test]
fn partial_object_metadata_lists_are_lists() {
    let body = gojson(&json!({
        "kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": "1012"},
        "items": pods().iter().map(|p| json!({"metadata": p["metadata"]})).collect::<Vec<_>>(),
    }));
    let v: Value = serde_json::from_slice(&web_1().list(body.as_bytes()).unwrap()).unwrap();
    assert_eq!(names(&v["items"]), vec!["dev/web-1"]);
    assert_eq!(v["kind"], "PartialObjectMetadataList");
}

#[test]
fn a_table_keeps_the_rows_of_allowed_objects() {
    for version in ["v1", "v1beta1"] {
        let body = gojson(&table(&pods(), version, true)) + "\n";
        let out = web_1().list(body.as_bytes()).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(names(&v["rows"]), vec!["dev/web-1"], "{version}");
        assert_eq!(v["columnDefinitions"], columns());
        assert_eq!(v["rows"][0]["cells"], json!(["web-1", "1/1", "2h"]));
        assert_eq!(v["metadata"]["resourceVersion"], "1012");
    }
    // includeObject=None: rows that cannot be told are not shown; includeObject=Object: whole
    // objects are read by their metadata.
    let mut t = table(&pods(), "v1", true);
    t["rows"][1]["object"] = Value::Null;
    t["rows"][2]["object"] = typed(&pod("dev", "web-1", 1007));
    let v: Value = serde_json::from_slice(&web_1().list(gojson(&t).as_bytes()).unwrap()).unwrap();
    assert_eq!(v["rows"].as_array().unwrap().len(), 1);
    assert_eq!(v["rows"][0]["object"]["kind"], "Pod");
    // A Table of another group is no Table here, and not a list either.
    let mut t = table(&pods(), "v1", true);
    t["apiVersion"] = json!("example.com/v1");
    let r = web_1().list(gojson(&t).as_bytes()).unwrap_err();
    assert_eq!(r.code, StatusCode::BAD_GATEWAY);
}

#[test]
fn what_is_not_a_list_is_refused() {
    for body in [
        gojson(&typed(&pod("dev", "web-1", 1))),
        "[1, 2]".to_string(),
        "not json".to_string(),
        r#"{"kind":"PodList","items":{"a":1}}"#.to_string(),
        // A member twice could be read two ways.
        r#"{"kind":"PodList","items":[],"items":[{"metadata":{"name":"db-1"}}]}"#.to_string(),
    ] {
        let r = web_1().list(body.as_bytes()).unwrap_err();
        assert_eq!(r.code, StatusCode::BAD_GATEWAY, "{body}");
    }
    assert!(web_1().list(&[0xff, 0xfe]).is_err());
}

/// Feeds `stream` to a watch filter in pieces ending at `cuts`, and returns what it sent.
fn watch_in_pieces(f: &Filter, stream: &[u8], cuts: &[usize]) -> Result<String, String> {
    let mut w = Watch {
        filter: f.clone(),
        framer: Framer::new(MAX_EVENT),
        gzip: None,
        carry: Carry::default(),
    };
    let mut out = Vec::new();
    let mut at = 0;
    for &cut in cuts.iter().chain([stream.len()].iter()) {
        out.extend(w.feed(&stream[at..cut])?);
        at = cut;
    }
    Ok(String::from_utf8(out).unwrap())
}

fn pod_watch() -> String {
    let mut s = String::new();
    for p in pods() {
        s += &event("ADDED", typed(&p));
    }
    s += &event("MODIFIED", typed(&pod("prod", "db-1", 1013)));
    s += &event("MODIFIED", typed(&pod("dev", "web-1", 1014)));
    s += &event(
        "BOOKMARK",
        json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "1015",
            "annotations": {"k8s.io/initial-events-end": "true"}}}),
    );
    s += &event("DELETED", typed(&pod("dev", "web-1", 1016)));
    s += &event(
        "ERROR",
        sallyport_core::kube::status(410, "Expired", "too old resource version: 1 (1012)"),
    );
    s
}

fn watch_expected() -> String {
    let mut s = String::new();
    s += &event("ADDED", typed(&pod("dev", "web-1", 1007)));
    s += &event("MODIFIED", typed(&pod("dev", "web-1", 1014)));
    s += &event(
        "BOOKMARK",
        json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "1015",
            "annotations": {"k8s.io/initial-events-end": "true"}}}),
    );
    s += &event("DELETED", typed(&pod("dev", "web-1", 1016)));
    s += &event(
        "ERROR",
        sallyport_core::kube::status(410, "Expired", "too old resource version: 1 (1012)"),
    );
    s
}

#[test]
fn a_watch_keeps_allowed_events_bookmarks_and_errors_wherever_the_chunks_end() {
    let f = watching(web_1());
    let stream = pod_watch();
    let want = watch_expected();
    assert_eq!(watch_in_pieces(&f, stream.as_bytes(), &[]).unwrap(), want);
    // Every cut point, and runs of one byte.
    for cut in 0..stream.len() {
        assert_eq!(
            watch_in_pieces(&f, stream.as_bytes(), &[cut]).unwrap(),
            want,
            "cut at {cut}"
        );
    }
    let bytes: Vec<usize> = (1..stream.len()).collect();
    assert_eq!(
        watch_in_pieces(&f, stream.as_bytes(), &bytes).unwrap(),
        want
    );
    // Objects one after another with no newline, or spread over lines, are events too.
    let joined: String = stream.lines().collect();
    assert_eq!(
        watch_in_pieces(&f, joined.as_bytes(), &[17, 900]).unwrap(),
        want
    );
    let pretty: String = stream
        .lines()
        .map(|l| serde_json::to_string_pretty(&serde_json::from_str::<Value>(l).unwrap()).unwrap())
        .collect();
    let out = watch_in_pieces(&f, pretty.as_bytes(), &[3]).unwrap();
    let kept: Vec<Value> = serde_json::Deserializer::from_str(&out)
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(kept.len(), 5);
    assert!(
        kept.iter()
            .all(|e| e["object"]["metadata"]["name"] == "web-1"
                || matches!(e["type"].as_str(), Some("BOOKMARK" | "ERROR")))
    );
}

#[test]
fn braces_and_quotes_inside_strings_do_not_cut_an_event() {
    let mut p = pod("dev", "web-1", 1);
    p["metadata"]["annotations"]["tricky"] = json!("} { \" \\\" ] [ \\ }}}\n{");
    let stream = event("ADDED", typed(&p)) + &event("ADDED", typed(&pod("prod", "db-1", 2)));
    let f = watching(web_1());
    for cut in 0..stream.len() {
        assert_eq!(
            watch_in_pieces(&f, stream.as_bytes(), &[cut]).unwrap(),
            event("ADDED", typed(&p)),
            "cut at {cut}"
        );
    }
}

#[test]
fn a_table_watch_keeps_allowed_rows_and_the_columns_kubectl_needs() {
    // The first event carries the columns; its only row is hidden, so the next event shown
    // carries them instead.
    let stream = event("ADDED", table(&[pod("prod", "db-1", 1)], "v1", true))
        + &event("ADDED", table(&[pod("dev", "web-1", 2)], "v1", false))
        + &event("ADDED", table(&[pod("dev", "web-2", 3)], "v1", false))
        + &event(
            "MODIFIED",
            table(
                &[pod("dev", "web-2", 4), pod("dev", "web-1", 4)],
                "v1",
                false,
            ),
        );
    let out = watch_in_pieces(&watching(web_1()), stream.as_bytes(), &[100]).unwrap();
    let events: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 2, "{out}");
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["columnDefinitions"], columns());
    assert_eq!(names(&events[0]["object"]["rows"]), vec!["dev/web-1"]);
    assert_eq!(events[1]["object"]["columnDefinitions"], Value::Null);
    assert_eq!(names(&events[1]["object"]["rows"]), vec!["dev/web-1"]);
    assert_eq!(events[1]["object"]["metadata"]["resourceVersion"], "1012");
}

#[test]
fn a_watch_that_is_not_json_objects_or_too_big_ends() {
    let f = watching(web_1());
    assert!(watch_in_pieces(&f, b"[1,2]\n", &[]).is_err());
    assert!(watch_in_pieces(&f, b"\n\n  x", &[]).is_err());
    // An event that does not parse once whole.
    assert!(watch_in_pieces(&f, b"{\"type\":\"ADDED\",]}", &[]).is_err());
    let mut fr = Framer::new(300);
    let big = event("ADDED", typed(&pod("dev", "web-1", 1)));
    assert!(big.len() > 300);
    let mut seen = 0;
    let r = fr.push(big.as_bytes(), |_| {
        seen += 1;
        Ok(())
    });
    assert!(r.unwrap_err().contains("over"));
    assert_eq!(seen, 0);
}

async fn collect(body: Body) -> Result<Vec<u8>, String> {
    let mut s = body.into_data_stream();
    let mut out = Vec::new();
    while let Some(c) = s.next().await {
        out.extend_from_slice(&c.map_err(|e| e.to_string())?);
    }
    Ok(out)
}

fn upstream(code: u16, content_type: &str, gzip: bool, chunks: Vec<Vec<u8>>) -> Response<Body> {
    let stream = futures::stream::iter(
        chunks
            .into_iter()
            .map(|c| Ok::<_, std::io::Error>(Bytes::from(c))),
    );
    let mut resp = Response::new(Body::from_stream(stream));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(content_type).unwrap(),
    );
    h.insert("audit-id", HeaderValue::from_static("f00"));
    if gzip {
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("1234"));
    }
    resp
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

#[tokio::test]
async fn a_gzipped_list_is_read_through_gzip_and_served_plain() {
    let zipped = gzip(pod_list().as_bytes());
    let pieces: Vec<Vec<u8>> = zipped.chunks(100).map(<[u8]>::to_vec).collect();
    let (resp, allowed, why) = web_1()
        .narrow(upstream(200, "application/json", true, pieces))
        .await;
    assert!(allowed);
    assert_eq!(why, FILTERED);
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.headers().get(header::CONTENT_ENCODING).is_none());
    assert!(resp.headers().get(header::CONTENT_LENGTH).is_none());
    assert_eq!(resp.headers()["audit-id"], "f00");
    let v: Value = serde_json::from_slice(&collect(resp.into_body()).await.unwrap()).unwrap();
    assert_eq!(names(&v["items"]), vec!["dev/web-1"]);
}

#[tokio::test]
async fn a_gzipped_watch_streams_event_by_event() {
    let zipped = gzip(pod_watch().as_bytes());
    let pieces: Vec<Vec<u8>> = zipped.chunks(7).map(<[u8]>::to_vec).collect();
    let (resp, allowed, _) = watching(web_1())
        .narrow(upstream(200, "application/json", true, pieces))
        .await;
    assert!(allowed);
    assert!(resp.headers().get(header::CONTENT_ENCODING).is_none());
    let out = collect(resp.into_body()).await.unwrap();
    assert_eq!(String::from_utf8(out).unwrap(), watch_expected());
}

#[tokio::test]
async fn a_watch_sends_each_event_as_it_arrives() {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let mut resp = Response::new(Body::from_stream(receiver_stream(rx)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let (resp, _, _) = watching(web_1()).narrow(resp).await;
    let mut out = resp.into_body().into_data_stream();
    async fn next(out: &mut axum::body::BodyDataStream) -> Option<Result<Bytes, axum::Error>> {
        tokio::time::timeout(std::time::Duration::from_secs(5), out.next())
            .await
            .expect("an event was held back")
    }
    // web-1's event in two pieces, then db-1's (hidden), then web-1's again: each shown as it
    // completes, while the watch stays open.
    let web1 = event("ADDED", typed(&pod("dev", "web-1", 1)));
    let (a, b) = web1.as_bytes().split_at(50);
    tx.send(Ok(Bytes::copy_from_slice(a))).await.unwrap();
    tx.send(Ok(Bytes::copy_from_slice(b))).await.unwrap();
    assert_eq!(next(&mut out).await.unwrap().unwrap(), web1.as_bytes());
    let db1 = event("ADDED", typed(&pod("prod", "db-1", 2)));
    let again = event("MODIFIED", typed(&pod("dev", "web-1", 3)));
    tx.send(Ok(Bytes::from(db1))).await.unwrap();
    tx.send(Ok(Bytes::from(again.clone()))).await.unwrap();
    assert_eq!(next(&mut out).await.unwrap().unwrap(), again.as_bytes());
    // Upstream ends: so does the watch.
    drop(tx);
    assert!(next(&mut out).await.is_none());
}

/// An mpsc receiver as a stream (tokio-stream is not a dependency).
fn receiver_stream<T: Send + 'static>(
    rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) })
}

#[tokio::test]
async fn a_watch_event_over_the_limit_ends_the_watch_with_an_error_event() {
    let f = watching(web_1());
    // A small event, then one over the limit, then one that never comes through.
    let small = event(
        "ADDED",
        json!({"metadata": {"name": "web-1", "namespace": "dev"}}),
    );
    let big = event("MODIFIED", typed(&pod("dev", "web-1", 2)));
    let limit = 300;
    assert!(small.len() < limit && big.len() > limit);
    let chunks = futures::stream::iter(vec![
        Ok::<_, std::io::Error>(Bytes::from(small.clone())),
        Ok(Bytes::from(big)),
        Ok(Bytes::from(small.clone())),
    ]);
    let body = Body::from_stream(watch_stream(f, Body::from_stream(chunks), false, limit));
    let out = String::from_utf8(collect(body).await.unwrap()).unwrap();
    let events: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 2, "{out}");
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[1]["type"], "ERROR");
    assert_eq!(events[1]["object"]["kind"], "Status");
    assert!(
        events[1]["object"]["message"]
            .as_str()
            .unwrap()
            .contains("watch event is over"),
        "{out}"
    );
}

#[tokio::test]
async fn what_cannot_be_filtered_is_refused_never_passed_on() {
    for (ct, gz) in [
        ("application/vnd.kubernetes.protobuf", false),
        ("application/vnd.kubernetes.protobuf;stream=watch", false),
        ("application/yaml", false),
        ("application/cbor", false),
        ("", false),
    ] {
        for f in [web_1(), watching(web_1())] {
            let mut up = upstream(200, "text/plain", gz, vec![pod_list().into_bytes()]);
            if ct.is_empty() {
                up.headers_mut().remove(header::CONTENT_TYPE);
            } else {
                up.headers_mut()
                    .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
            }
            let (resp, allowed, why) = f.narrow(up).await;
            assert!(!allowed, "{ct}");
            assert_eq!(resp.status(), StatusCode::NOT_ACCEPTABLE, "{ct}");
            assert!(why.contains("cannot filter"), "{why}");
            let body = String::from_utf8(collect(resp.into_body()).await.unwrap()).unwrap();
            assert!(!body.contains("db-1") && !body.contains("web-1"), "{body}");
            let v: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["kind"], "Status");
            assert_eq!(v["reason"], "NotAcceptable");
        }
    }
    // An encoding it cannot read.
    let mut up = upstream(
        200,
        "application/json",
        false,
        vec![pod_list().into_bytes()],
    );
    up.headers_mut()
        .insert(header::CONTENT_ENCODING, HeaderValue::from_static("br"));
    let (resp, allowed, _) = web_1().narrow(up).await;
    assert!(!allowed);
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    // JSON that is not gzip though it says so.
    let (resp, allowed, _) = web_1()
        .narrow(upstream(
            200,
            "application/json",
            true,
            vec![pod_list().into_bytes()],
        ))
        .await;
    assert!(!allowed);
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
}

#[tokio::test]
async fn the_api_servers_refusals_pass_as_they_are() {
    let status = gojson(&sallyport_core::kube::status(
        403,
        "Forbidden",
        "pods is forbidden: User \"alice\" cannot list resource \"pods\"",
    ));
    let (resp, allowed, _) = web_1()
        .narrow(upstream(
            403,
            "application/json",
            false,
            vec![status.clone().into_bytes()],
        ))
        .await;
    assert!(allowed);
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    assert_eq!(collect(resp.into_body()).await.unwrap(), status.as_bytes());
}

#[tokio::test]
async fn lists_past_the_limit_are_refused() {
    // Read: a body larger than the limit.
    let chunks: Vec<Vec<u8>> = vec![vec![b' '; 600], vec![b' '; 600]];
    let r = read_bounded(
        upstream(200, "application/json", false, chunks).into_body(),
        1000,
    )
    .await
    .unwrap_err();
    assert_eq!(r.code, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(r.why.contains("over 64 MiB"), "{}", r.why);
    // Inflated: a small gzip of much.
    let bomb = gzip(&vec![b' '; 10 << 20]);
    assert!(bomb.len() < 64 << 10);
    assert_eq!(
        gunzip(&bomb, 1 << 20).unwrap_err().code,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(gunzip(&bomb, 10 << 20).unwrap().len(), 10 << 20);
}

#[test]
fn the_request_asks_for_json_only() {
    let f = web_1();
    let accept = |asked: &[&str], encoding: Option<&str>| {
        let mut h = HeaderMap::new();
        for a in asked {
            h.append(header::ACCEPT, HeaderValue::from_str(a).unwrap());
        }
        if let Some(e) = encoding {
            h.insert(header::ACCEPT_ENCODING, HeaderValue::from_str(e).unwrap());
        }
        f.ask_for_json(&mut h).map(|()| {
            let gzip = h
                .get(header::ACCEPT_ENCODING)
                .map(|v| v.to_str().unwrap().to_string());
            (h[header::ACCEPT].to_str().unwrap().to_string(), gzip)
        })
    };
    let accept = |asked: &[&str], encoding: Option<&str>| accept(asked, encoding).map(|a| a.0);
    // gzip only for whom takes it (kubectl's Go transport always does).
    let encoding = |e: Option<&str>| accept_with(&f, e);
    assert_eq!(encoding(Some("gzip")), Some("gzip".into()));
    assert_eq!(
        encoding(Some("br, GZIP;q=0.5, deflate")),
        Some("gzip".into())
    );
    assert_eq!(encoding(Some("gzip;q=0, br")), None);
    assert_eq!(encoding(Some("br")), None);
    assert_eq!(encoding(None), None);
    let kubectl_get = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
    assert_eq!(accept(&[kubectl_get], Some("gzip")).unwrap(), kubectl_get);
    assert_eq!(
        accept(
            &["application/vnd.kubernetes.protobuf, application/json"],
            None
        )
        .unwrap(),
        "application/json"
    );
    assert_eq!(
        accept(
            &["application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1;g=meta.k8s.io,application/json"],
            None
        )
        .unwrap(),
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    );
    assert_eq!(accept(&[], None).unwrap(), "application/json");
    assert_eq!(accept(&["*/*"], None).unwrap(), "application/json");
    assert_eq!(
        accept(&["application/yaml", "Application/JSON"], None).unwrap(),
        "application/json"
    );
    let r = accept(&["application/vnd.kubernetes.protobuf"], None).unwrap_err();
    assert_eq!(r.code, StatusCode::NOT_ACCEPTABLE);
    assert!(r.why.contains("ask for application/json"));
    assert!(accept(&["application/yaml"], None).is_err());
}

/// The `Accept-Encoding` the API server is sent.
fn accept_with(f: &Filter, encoding: Option<&str>) -> Option<String> {
    let mut h = HeaderMap::new();
    if let Some(e) = encoding {
        h.insert(header::ACCEPT_ENCODING, HeaderValue::from_str(e).unwrap());
    }
    f.ask_for_json(&mut h).unwrap();
    h.get(header::ACCEPT_ENCODING)
        .map(|v| v.to_str().unwrap().to_string())
}

/// The roles' side: which requests are filtered, with whose principals, and what the filter
/// keeps.
#[test]
fn the_roles_decide_which_lists_are_filtered() {
    let role = |v: Value| -> sallyport_core::role::Role {
        let r: sallyport_core::role::Role = serde_json::from_value(v).unwrap();
        r.validate().unwrap();
        r
    };
    let roles = vec![
        role(json!({
            "kind": "role", "version": "v1", "metadata": {"name": "web-1"},
            "spec": {
                "allow": {
                    "kubernetes_labels": {"env": "dev"},
                    "kubernetes_groups": ["web"],
                    "kubernetes_resources": [
                        {"kind": "pod", "namespace": "dev", "name": "web-1", "verbs": ["get", "list", "watch"]},
                        {"kind": "namespace", "name": "staging", "verbs": ["list"]},
                        {"kind": "configmap", "namespace": "dev", "verbs": ["list"]},
                    ],
                },
                "deny": {
                    "kubernetes_resources": [
                        {"kind": "configmap", "namespace": "dev", "name": "secret-*", "verbs": ["list"]},
                    ],
                },
            },
        })),
        role(json!({
            "kind": "role", "version": "v1", "metadata": {"name": "services"},
            "spec": {"allow": {
                "kubernetes_labels": {"env": "dev"},
                "kubernetes_groups": ["svc"],
                "kubernetes_resources": [{"kind": "service", "namespace": "dev", "verbs": ["list"]}],
            }},
        })),
    ];
    let cluster = sallyport_core::api::KubeClusterInfo {
        name: "lab".into(),
        id: "c1".into(),
        labels: BTreeMap::from([("env".to_string(), "dev".to_string())]),
        online: true,
    };
    let snap = Arc::new(Snapshot {
        user: "alice".into(),
        roles: sallyport_core::role::RoleSet::new(&roles, &BTreeMap::new()),
        labels: sallyport_core::kube::cluster_labels(&cluster.name, &cluster.labels),
        cluster,
    });
    let decide = |method: &str, path: &str, query: &str| {
        let c = sallyport_core::kube::classify(method, path, query).unwrap();
        let d = snap.roles.check_kube(&snap.labels, &c.request());
        super::decide(&snap, &c, d)
    };
    // Filtered: every namespace's pods, dev's (the rule names one), a watch of either, the
    // legacy watch path; impersonating the role that allows them.
    for (path, query) in [
        ("/api/v1/pods", ""),
        ("/api/v1/namespaces/dev/pods", ""),
        ("/api/v1/namespaces/dev/pods", "watch=true"),
        (
            "/api/v1/namespaces/dev/pods",
            "watch=1&resourceVersion=1012",
        ),
        ("/api/v1/watch/namespaces/dev/pods", ""),
        ("/api/v1/watch/pods", ""),
    ] {
        let f = decide("GET", path, query)
            .unwrap()
            .unwrap_or_else(|| panic!("{path}?{query} not filtered"));
        assert_eq!(f.watch, query.contains("watch") || path.contains("/watch/"));
        assert_eq!(f.groups, vec!["web"]);
        assert!((f.allows)("dev", "web-1"));
        assert!(!(f.allows)("dev", "web-2") && !(f.allows)("prod", "web-1"));
    }
    // Refused before anything is sent: no pod of prod, no secret of dev, no node, no
    // deployment of dev, no single other pod, no deletecollection.
    for (method, path) in [
        ("GET", "/api/v1/namespaces/prod/pods"),
        ("GET", "/api/v1/namespaces/dev/secrets"),
        ("GET", "/api/v1/nodes"),
        ("GET", "/apis/apps/v1/namespaces/dev/deployments"),
        ("GET", "/api/v1/namespaces/dev/pods/web-2"),
        ("DELETE", "/api/v1/namespaces/dev/pods"),
    ] {
        assert!(decide(method, path, "").is_err(), "{method} {path}");
    }
    let why = decide("GET", "/api/v1/namespaces/prod/pods", "").unwrap_err();
    assert!(why.contains("no role allows"), "{why}");
    // Allowed whole: as it is, with no filter.
    assert!(
        decide("GET", "/api/v1/namespaces/dev/services", "")
            .unwrap()
            .is_none()
    );
    assert!(
        decide("GET", "/api/v1/namespaces/dev/pods/web-1", "")
            .unwrap()
            .is_none()
    );
    // Allowed whole but for a deny rule on some names: filtered.
    let f = decide("GET", "/api/v1/namespaces/dev/configmaps", "")
        .unwrap()
        .unwrap();
    assert!((f.allows)("dev", "web-config") && !(f.allows)("dev", "secret-db"));
    // Namespaces: each is its own namespace to the rules.
    let f = decide("GET", "/api/v1/namespaces", "").unwrap().unwrap();
    assert!((f.allows)("", "staging") && !(f.allows)("", "dev"));
    // Not a collection's list: decided as before.
    assert!(decide("GET", "/api/v1/namespaces/dev/pods/web-1/log", "").is_ok());
}

#[test]
fn a_filtered_list_names_nothing_hidden_by_its_paging() {
    let items: Vec<String> = pods().iter().map(gojson).collect();
    // A continue token is base64 JSON naming the page's last item as the API server saw it.
    let page = format!(
        r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{"resourceVersion":"1012","continue":"eyJzdGFydCI6InByb2QvZGItMVx1MDAwMCJ9","remainingItemCount":7}},"items":[{}]}}"#,
        items.join(",")
    );
    for f in [web_1(), Filter::new(|_, _| true, false)] {
        let v: Value = serde_json::from_slice(&f.list(page.as_bytes()).unwrap()).unwrap();
        assert_eq!(v["metadata"]["resourceVersion"], "1012");
        assert!(v["metadata"].get("continue").is_none(), "{v}");
        assert!(v["metadata"].get("remainingItemCount").is_none(), "{v}");
    }
    // And the list is asked for whole: no limit, no continue; the rest as written.
    assert_eq!(
        whole_list_query("limit=1&labelSelector=app%3Dweb&continue=abc&watch=0"),
        "labelSelector=app%3Dweb&watch=0"
    );
    assert_eq!(whole_list_query("li%6Dit=1&x=1"), "x=1");
    assert_eq!(whole_list_query(""), "");
}

#[tokio::test]
async fn a_head_answer_has_no_body_to_filter() {
    let resp = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::empty())
        .unwrap();
    let (resp, allowed, _) = web_1().narrow(resp).await;
    assert!(allowed);
    assert_eq!(resp.status(), StatusCode::OK);
}
