//! The recorder's own tests: the asciicast it writes, its limits, and what it does when its
//! file cannot be written.

use super::*;

/// The recorder's async calls, run to their end on this thread (a test's relay is a thread).
trait Now {
    fn output_now(&self, data: bytes::Bytes) -> usize;
    fn input_now(&self, data: bytes::Bytes) -> usize;
    fn settle_now(&self) -> bool;
    fn complete_now(&self) -> Option<Stop>;
    fn finish_now(&self) -> Option<Stop>;
    fn resize_now(&self, cols: u32, rows: u32);
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap_or_else(|e| panic!("a runtime for the test: {e}"));
}

fn now<T>(f: impl std::future::Future<Output = T>) -> T {
    RUNTIME.with(|rt| rt.block_on(f))
}

impl Now for Recorder {
    fn output_now(&self, data: bytes::Bytes) -> usize {
        now(self.output(data))
    }
    fn input_now(&self, data: bytes::Bytes) -> usize {
        now(self.input(data))
    }
    fn settle_now(&self) -> bool {
        now(self.settle())
    }
    fn complete_now(&self) -> Option<Stop> {
        now(self.complete())
    }
    fn finish_now(&self) -> Option<Stop> {
        now(self.finish())
    }
    fn resize_now(&self, cols: u32, rows: u32) {
        now(self.resize(cols, rows))
    }
}

const UNLIMITED: Limits = Limits {
    input: true,
    max_bytes: u64::MAX,
    strict: false,
};

fn header() -> Header<'static> {
    Header {
        width: 80,
        height: 24,
        term: "xterm",
        title: "t",
        command: None,
    }
}

#[test]
fn binary_output_reads_as_lossy_utf8_however_it_is_cut() {
    let dir = std::env::temp_dir().join(format!("rec-bin-{}", std::process::id()));
    let h = header();
    use rand::Rng;
    let mut data = vec![0u8; 20_000];
    rand::rng().fill_bytes(&mut data);
    data.extend_from_slice("snow ☃ and \"quotes\" \\ \u{1} end".as_bytes());
    let r = Recorder::create(&dir, "bin", &h, UNLIMITED).unwrap_or_else(|e| panic!("{e}"));
    let mut at = 0;
    let mut step = 1;
    while at < data.len() {
        let end = (at + step).min(data.len());
        r.output_now(bytes::Bytes::copy_from_slice(&data[at..end]));
        at = end;
        step = step % 97 + 1;
    }
    let path = r.path.clone();
    r.finish_now();
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let mut got = String::new();
    for l in text.lines().skip(1) {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        got.push_str(v[2].as_str().unwrap_or_default());
    }
    assert_eq!(got, String::from_utf8_lossy(&data));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn utf8_split_across_chunks_and_escaped_lines() {
    let dir = std::env::temp_dir().join(format!("rec-test-{}", std::process::id()));
    let h = header();
    let r = Recorder::create(&dir, "s1", &h, UNLIMITED).unwrap_or_else(|e| panic!("{e}"));
    let snow = "☃".as_bytes();
    r.output_now(bytes::Bytes::copy_from_slice(&snow[..1]));
    r.output_now(bytes::Bytes::copy_from_slice(&snow[1..]));
    r.output_now(bytes::Bytes::from_static(b"a\nb\x1b[0m\xff"));
    r.resize_now(100, 30);
    let path = r.path.clone();
    r.finish_now();
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_default())
        .collect();
    assert_eq!(lines[0]["version"], 2);
    assert_eq!(lines[1][2], "☃");
    assert_eq!(lines[2][2], "a\nb\u{1b}[0m\u{fffd}");
    assert_eq!(lines[3][1], "r");
    let _ = std::fs::remove_dir_all(dir);
}

fn events(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn input_is_written_only_when_asked_for() {
    let dir = std::env::temp_dir().join(format!("rec-input-{}", std::process::id()));
    for input in [false, true] {
        let id = format!("in-{input}");
        let limits = Limits {
            input,
            max_bytes: u64::MAX,
            strict: false,
        };
        let r = Recorder::create(&dir, &id, &header(), limits).unwrap_or_else(|e| panic!("{e}"));
        r.input_now(bytes::Bytes::from_static(b"hunter2\n"));
        r.output_now(bytes::Bytes::from_static(b"ok\n"));
        let path = r.path.clone();
        r.finish_now();
        let kinds: Vec<String> = events(&path)
            .iter()
            .map(|e| e[1].as_str().unwrap_or_default().to_string())
            .collect();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if input {
            assert_eq!(kinds, ["i", "o"]);
        } else {
            assert_eq!(kinds, ["o"]);
            assert!(!text.contains("hunter2"), "{text}");
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_recording_stops_whole_at_its_size_limit() {
    let dir = std::env::temp_dir().join(format!("rec-limit-{}", std::process::id()));
    let max = 4096;
    let limits = Limits {
        input: false,
        max_bytes: max,
        strict: false,
    };
    let r = Recorder::create(&dir, "limit", &header(), limits).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.stopped(), None);
    for i in 0..200 {
        r.output_now(bytes::Bytes::from(format!("line {i} \x01\n")));
    }
    let path = r.path.clone();
    assert_eq!(r.finish_now(), Some(Stop::Full));
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    assert!(size <= max && size > max / 2, "{size}");
    // Every line written is whole, and they stop at a line, not in the middle.
    let got = events(&path);
    assert!(!got.is_empty());
    for (i, e) in got.iter().enumerate() {
        assert_eq!(e[2], format!("line {i} \u{1}\n"));
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn under_strict_only_what_the_recording_will_hold_is_taken() {
    let dir = std::env::temp_dir().join(format!("rec-strict-{}", std::process::id()));
    let max = 64 * 1024;
    let limits = Limits {
        input: false,
        max_bytes: max,
        strict: true,
    };
    let r = Recorder::create(&dir, "strict", &header(), limits).unwrap_or_else(|e| panic!("{e}"));
    // 32 KiB chunks (an SSH packet each), control bytes and a UTF-8 sequence cut between
    // chunks among them, queued faster than the writer writes.
    let mut chunk = Vec::new();
    while chunk.len() < 32 * 1024 {
        chunk.extend_from_slice("ligne \x01 é\n".as_bytes());
    }
    chunk.truncate(32 * 1024 - 1);
    let mut taken = Vec::new();
    for _ in 0..40 {
        let n = r.output_now(bytes::Bytes::from(chunk.clone()));
        taken.extend_from_slice(&chunk[..n]);
        if n < chunk.len() {
            break;
        }
    }
    assert_eq!(r.stopped(), Some(Stop::Full), "the limit was reached");
    assert_eq!(r.output_now(bytes::Bytes::from_static(b"more")), 0);
    let path = r.path.clone();
    r.finish_now();
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    assert!(size <= max, "{size}");
    // Close to the limit: the writer caught up before the last pieces were cut.
    assert!(size > max * 3 / 4, "{size}");
    let recorded: String = events(&path)
        .iter()
        .map(|e| e[2].as_str().unwrap_or_default().to_string())
        .collect();
    // Everything taken (the relay shows exactly that) is in the recording, a UTF-8
    // sequence cut at the very end included (as U+FFFD).
    assert_eq!(recorded, String::from_utf8_lossy(&taken));
    let _ = std::fs::remove_dir_all(dir);
}

/// A destination that takes `room` bytes, then fails once (as a full disk does), then would
/// take anything again: what reaches it after the failure shows whether the recorder stopped.
#[derive(Clone, Default)]
struct Failing {
    got: Arc<Mutex<Vec<u8>>>,
    room: usize,
    failed: Arc<AtomicBool>,
    fail_sync: bool,
    /// A sync waits while a test holds this.
    sync_gate: Arc<Mutex<()>>,
}

impl std::io::Write for Failing {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut got = self.got.lock().unwrap_or_else(|e| e.into_inner());
        let room = self.room.saturating_sub(got.len());
        if room == 0 && !self.failed.swap(true, Ordering::AcqRel) {
            return Err(std::io::Error::other("disk full (test)"));
        }
        let n = if self.failed.load(Ordering::Acquire) {
            buf.len()
        } else {
            buf.len().min(room)
        };
        got.extend_from_slice(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl writer::Durable for Failing {
    fn sync_all(&self) -> std::io::Result<()> {
        drop(self.sync_gate.lock());
        if self.fail_sync {
            return Err(std::io::Error::other("sync failed (test)"));
        }
        Ok(())
    }
}

fn failing(sink: &Failing, strict: bool) -> Recorder {
    let limits = Limits {
        input: true,
        max_bytes: u64::MAX,
        strict,
    };
    let w = std::io::BufWriter::new(sink.clone());
    Recorder::start(w, PathBuf::from("mem.cast"), &header(), limits)
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_write_error_stops_the_recording_and_nothing_is_written_after_it() {
    for strict in [false, true] {
        let sink = Failing {
            room: 20_000,
            ..Failing::default()
        };
        let r = failing(&sink, strict);
        let chunk = bytes::Bytes::from(vec![b'x'; 4096]);
        let mut taken = 0;
        for _ in 0..10 {
            taken += r.output_now(chunk.clone());
        }
        // Everything queued so far is written (or met the error).
        assert!(
            r.settle_now(),
            "the writer goes on answering after a failure"
        );
        let stop = r.stopped();
        assert!(
            matches!(&stop, Some(Stop::Failed(e)) if e.contains("disk full (test)")),
            "strict {strict}: {stop:?}"
        );
        // Nothing more is taken under strict (the relay shows nothing more and ends the
        // session); under best_effort the session goes on, unrecorded.
        let more = r.output_now(chunk.clone());
        let typed = r.input_now(bytes::Bytes::from_static(b"ls\n"));
        if strict {
            assert_eq!((more, typed), (0, 0));
        } else {
            assert_eq!((taken, more, typed), (40_960, 4096, 3));
        }
        r.resize_now(100, 40);
        assert_eq!(r.finish_now(), stop);
        // The failed write's buffer was let go, not flushed when the file was dropped.
        let got = sink.got.lock().map(|g| g.len()).unwrap_or_default();
        assert_eq!(got, 20_000, "strict {strict}");
    }
}

#[test]
fn a_sync_error_at_the_end_is_a_failure() {
    let sink = Failing {
        room: usize::MAX,
        fail_sync: true,
        ..Failing::default()
    };
    let r = failing(&sink, true);
    assert_eq!(r.output_now(bytes::Bytes::from_static(b"hello\n")), 6);
    assert_eq!(
        r.finish_now(),
        Some(Stop::Failed("sync failed (test)".into()))
    );
}

/// The session's end is told once the recording is complete, before its sync: the file then
/// holds every line, and a sync that fails afterwards is still the recording's failure.
#[test]
fn a_recording_is_whole_before_its_sync_and_a_failed_sync_still_counts() {
    let sink = Failing {
        room: usize::MAX,
        fail_sync: true,
        ..Failing::default()
    };
    let r = Arc::new(failing(&sink, true));
    assert_eq!(
        r.output_now(bytes::Bytes::from_static(b"hello \xe2\x98")),
        8
    );
    let syncing = sink.sync_gate.lock().unwrap_or_else(|e| e.into_inner());
    // Completing must not wait for the sync the gate holds back.
    let (tx, completed) = std::sync::mpsc::channel();
    let completing = r.clone();
    std::thread::spawn(move || tx.send(completing.complete_now()));
    let stop = completed.recv_timeout(std::time::Duration::from_secs(20));
    assert_eq!(
        stop,
        Ok(None),
        "complete, and nothing failed yet: the sync is still to come"
    );
    let written = sink.got.lock().map(|g| g.clone()).unwrap_or_default();
    let text = String::from_utf8_lossy(&written);
    let output: String = text
        .lines()
        .skip(1)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|e| e[2].as_str().map(String::from))
        .collect();
    assert_eq!(
        output, "hello \u{fffd}",
        "the cut sequence's tail is written too: {text}"
    );
    assert_eq!(
        r.output_now(bytes::Bytes::from_static(b"late")),
        0,
        "nothing is taken after"
    );
    drop(syncing);
    assert_eq!(
        r.finish_now(),
        Some(Stop::Failed("sync failed (test)".into()))
    );
    assert_eq!(
        sink.got.lock().map(|g| g.len()).unwrap_or_default(),
        written.len()
    );
}

#[test]
fn two_tasks_taking_at_once_under_strict_never_pass_the_limit() {
    let dir = std::env::temp_dir().join(format!("rec-two-{}", std::process::id()));
    let max = 512 * 1024;
    let limits = Limits {
        input: true,
        max_bytes: max,
        strict: true,
    };
    let r = Recorder::create(&dir, "two", &header(), limits).unwrap_or_else(|e| panic!("{e}"));
    let ready = std::sync::Barrier::new(2);
    // Shared by reference between the output and the input side, as the relay's two tasks
    // share it: no lock around it.
    let (out, inp) = std::thread::scope(|s| {
        let take = |input: bool| {
            let (r, ready) = (&r, &ready);
            s.spawn(move || {
                ready.wait();
                let chunk = bytes::Bytes::from("a\x01".repeat(1000));
                let mut taken = 0;
                loop {
                    let n = if input {
                        r.input_now(chunk.clone())
                    } else {
                        r.output_now(chunk.clone())
                    };
                    taken += n;
                    if n < chunk.len() {
                        return taken;
                    }
                }
            })
        };
        let (o, i) = (take(false), take(true));
        (o.join().unwrap_or_default(), i.join().unwrap_or_default())
    });
    assert_eq!(r.finish_now(), Some(Stop::Full));
    let size = std::fs::metadata(&r.path).map(|m| m.len()).unwrap_or(0);
    assert!(size <= max, "{size}");
    // Everything either side took is in the recording.
    let mut recorded = [0, 0];
    for e in events(&r.path) {
        let i = usize::from(e[1] == "i");
        recorded[i] += e[2].as_str().unwrap_or_default().len();
    }
    assert_eq!(recorded, [out, inp]);
    // Close to the limit: the writer caught up before the last pieces were cut.
    assert!(size > max * 3 / 4, "{size}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A destination whose writes wait while a test holds `gate` (a disk that stalls), and fail
/// once `fail` is set (a disk that then fills up).
#[derive(Clone, Default)]
struct Gated {
    gate: Arc<Mutex<()>>,
    got: Arc<AtomicU64>,
    fail: Arc<AtomicBool>,
}

impl std::io::Write for Gated {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        drop(self.gate.lock());
        if self.fail.load(Ordering::Acquire) {
            return Err(std::io::Error::other("disk full (test)"));
        }
        self.got.fetch_add(buf.len() as u64, Ordering::AcqRel);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl writer::Durable for Gated {
    fn sync_all(&self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A recorder writing to `sink` (its header already written), shared with a relay thread.
fn gated(sink: &Gated, limits: Limits) -> Arc<Recorder> {
    gated_stalling_after(sink, limits, STALL)
}

/// As [`gated`], the recording failing once its writer took nothing for `stall`.
fn gated_stalling_after(sink: &Gated, limits: Limits, stall: Duration) -> Arc<Recorder> {
    let mut r = Recorder::start(
        std::io::BufWriter::new(sink.clone()),
        PathBuf::from("mem.cast"),
        &header(),
        limits,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    r.stall = stall;
    Arc::new(r)
}

/// Runs `event` on a relay thread until it answers false (nothing taken) or `most` times, while
/// `sink`'s disk is stalled; answers how many were taken before the relay was held back.
fn taken_while_stalled(
    r: &Arc<Recorder>,
    sink: &Gated,
    most: u64,
    event: fn(&Recorder) -> bool,
) -> u64 {
    let held = sink.gate.lock().unwrap_or_else(|e| e.into_inner());
    let sent = Arc::new(AtomicU64::new(0));
    let relay = {
        let (r, sent) = (r.clone(), sent.clone());
        std::thread::spawn(move || {
            for _ in 0..most {
                if !event(&r) {
                    return;
                }
                sent.fetch_add(1, Ordering::AcqRel);
            }
        })
    };
    // Taken until the count stands still for a while.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut last = u64::MAX;
    while std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(300));
        let n = sent.load(Ordering::Acquire);
        if n == last || n == most {
            break;
        }
        last = n;
    }
    let waiting = sent.load(Ordering::Acquire);
    drop(held);
    relay
        .join()
        .unwrap_or_else(|_| panic!("the relay thread panicked"));
    waiting
}

#[test]
fn a_writer_behind_holds_the_relay_back_at_a_few_mebibytes() {
    let sink = Gated::default();
    let r = gated(&sink, UNLIMITED);
    // The header is written: now the disk stalls.
    let held = sink.gate.lock().unwrap_or_else(|e| e.into_inner());
    const EVENTS: usize = 400;
    const CHUNK: usize = 32 * 1024;
    let sent = Arc::new(AtomicU64::new(0));
    let relay = {
        let (r, sent) = (r.clone(), sent.clone());
        std::thread::spawn(move || {
            for _ in 0..EVENTS {
                assert_eq!(r.output_now(bytes::Bytes::from(vec![b'x'; CHUNK])), CHUNK);
                sent.fetch_add(1, Ordering::AcqRel);
            }
        })
    };
    // The disk stalls: the relay is held back once 4 MiB wait (the event being written
    // counts until it is written), not after 1024 events.
    let most = QUEUE_BYTES / cost(CHUNK) + 1;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while sent.load(Ordering::Acquire) < most - 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let waiting = sent.load(Ordering::Acquire);
    assert!(
        waiting >= most - 1 && waiting <= most,
        "{waiting} events of 32 KiB were taken while the writer was stalled"
    );
    drop(held);
    relay
        .join()
        .unwrap_or_else(|_| panic!("the relay thread panicked"));
    assert_eq!(sent.load(Ordering::Acquire), EVENTS as u64);
    r.finish_now();
    // Everything reached the destination: 400 lines of 32 KiB of text and their framing.
    let got = sink.got.load(Ordering::Acquire);
    assert!(got > (EVENTS * CHUNK) as u64, "{got}");
}

#[test]
fn a_strict_relay_waiting_for_its_writer_takes_nothing_once_the_writer_failed() {
    let sink = Gated::default();
    let strict = Limits {
        input: false,
        max_bytes: u64::MAX,
        strict: true,
    };
    let r = gated(&sink, strict);
    let held = sink.gate.lock().unwrap_or_else(|e| e.into_inner());
    const CHUNK: usize = 32 * 1024;
    // What the relay was told it may show, chunk by chunk, until it is told nothing.
    let taken = Arc::new(Mutex::new(Vec::new()));
    let relay = {
        let (r, taken) = (r.clone(), taken.clone());
        std::thread::spawn(move || {
            for _ in 0..1000 {
                let n = r.output_now(bytes::Bytes::from(vec![b'x'; CHUNK]));
                taken.lock().unwrap_or_else(|e| e.into_inner()).push(n);
                if n == 0 {
                    break;
                }
            }
        })
    };
    // The relay fills the queue and waits for the stalled writer...
    let full = (QUEUE_BYTES / cost(CHUNK)) as usize;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while taken.lock().map_or(0, |t| t.len()) < full && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let before = taken.lock().map_or(0, |t| t.len());
    assert!(
        before >= full,
        "only {before} chunks were taken before the queue was full"
    );
    // ...which then fails: the chunk the relay waited with is not taken, nor anything after.
    sink.fail.store(true, Ordering::Release);
    drop(held);
    relay
        .join()
        .unwrap_or_else(|_| panic!("the relay thread panicked"));
    let taken = taken.lock().map(|t| t.clone()).unwrap_or_default();
    assert_eq!(taken.len(), before + 1, "{taken:?}");
    assert_eq!(taken.last(), Some(&0), "{taken:?}");
    assert!(
        matches!(r.stopped(), Some(Stop::Failed(_))),
        "{:?}",
        r.stopped()
    );
    r.finish_now();
}

/// The wait for a stalled writer is the relay task's alone: on a runtime of one thread, other
/// tasks (other sessions) go on meanwhile, and a wait dropped midway (its session's task
/// cancelled) leaves nothing counted in the queue.
#[test]
fn a_relay_waiting_for_a_stalled_writer_holds_up_no_other_task_and_counts_nothing_when_dropped() {
    let sink = Gated::default();
    let r = gated(&sink, UNLIMITED);
    let held = sink.gate.lock().unwrap_or_else(|e| e.into_inner());
    const CHUNK: usize = 32 * 1024;
    let one_thread = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let sent = Arc::new(AtomicU64::new(0));
    one_thread.block_on(async {
        let relay = {
            let (r, sent) = (r.clone(), sent.clone());
            tokio::spawn(async move {
                for _ in 0..400 {
                    r.output(bytes::Bytes::from(vec![b'x'; CHUNK])).await;
                    sent.fetch_add(1, Ordering::AcqRel);
                }
            })
        };
        // Another task on the same (only) thread keeps running while the relay waits.
        let mut ticks = 0;
        while ticks < 20 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            ticks += 1;
        }
        let waiting = sent.load(Ordering::Acquire);
        assert!(
            waiting < 400 && waiting >= QUEUE_BYTES / cost(CHUNK) - 1,
            "the relay took {waiting} chunks with the writer stalled"
        );
        assert!(!relay.is_finished(), "the relay waits for the writer");
        relay.abort();
        assert!(relay.await.is_err_and(|e| e.is_cancelled()));
    });
    drop(held);
    assert!(r.settle_now());
    let queued = *r.shared.queued.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(queued, 0, "the dropped wait left a count behind");
    // Everything taken before the relay was dropped was written, and the recorder goes on.
    assert_eq!(r.output_now(bytes::Bytes::from_static(b"after\n")), 6);
    assert_eq!(r.finish_now(), None);
    let got = sink.got.load(Ordering::Acquire);
    assert!(got > sent.load(Ordering::Acquire) * CHUNK as u64, "{got}");
}

/// The queue's bound holds for events of any size, under `strict` too: one-byte events and
/// resizes for a stalled writer hold the relay back at the queue's count, not millions later.
#[test]
fn small_events_and_resizes_for_a_stalled_writer_are_bounded_by_the_queue() {
    const MOST: u64 = 200_000;
    for strict in [false, true] {
        let limits = Limits {
            input: true,
            max_bytes: u64::MAX,
            strict,
        };
        let sink = Gated::default();
        let r = gated(&sink, limits);
        let bytes = taken_while_stalled(&r, &sink, MOST, |r| {
            r.output_now(bytes::Bytes::from_static(b"x")) == 1
        });
        let fit = QUEUE_BYTES / cost(1);
        // Up to `fit` wait, plus the lines the file's 8 KiB buffer took before the disk.
        assert!(
            bytes >= fit - 1 && bytes <= fit + 1000,
            "strict {strict}: {bytes} one-byte events were taken with the writer stalled ({fit} fit)"
        );
        assert_eq!(r.finish_now(), None);

        let sink = Gated::default();
        let r = gated(&sink, limits);
        let resizes = taken_while_stalled(&r, &sink, MOST, |r| {
            r.resize_now(120, 40);
            true
        });
        let fit = QUEUE_BYTES / cost(0);
        assert!(
            resizes >= fit - 1 && resizes <= fit + 1000,
            "strict {strict}: {resizes} resizes were taken with the writer stalled ({fit} fit)"
        );
        assert_eq!(r.finish_now(), None);
        let queued = *r.shared.queued.lock().unwrap_or_else(|e| e.into_inner());
        assert_eq!(queued, 0, "strict {strict}: the count went back to nothing");
    }
}

/// A recordings disk that hangs: once the writer took nothing for `stall`, the recording has
/// failed, named so; under `strict` nothing more is taken (the session ends), otherwise the
/// session goes on unrecorded without waiting; the end does not hang either.
#[test]
fn a_writer_that_takes_nothing_for_its_stall_time_fails_the_recording() {
    const CHUNK: usize = 32 * 1024;
    for strict in [false, true] {
        let limits = Limits {
            input: false,
            max_bytes: u64::MAX,
            strict,
        };
        let sink = Gated::default();
        let r = gated_stalling_after(&sink, limits, Duration::from_secs(1));
        let held = sink.gate.lock().unwrap_or_else(|e| e.into_inner());
        let started = std::time::Instant::now();
        let mut taken = 0;
        for _ in 0..1000 {
            let n = r.output_now(bytes::Bytes::from(vec![b'x'; CHUNK]));
            taken += 1;
            if n < CHUNK || r.stopped().is_some() {
                assert_eq!(n, if strict { 0 } else { CHUNK }, "strict {strict}");
                break;
            }
        }
        let waited = started.elapsed();
        assert!(
            taken < 1000 && waited >= Duration::from_secs(1) && waited < Duration::from_secs(15),
            "strict {strict}: {taken} chunks, {waited:?}"
        );
        let stop = r.stopped();
        assert!(
            matches!(&stop, Some(Stop::Failed(e)) if e.contains("wrote nothing for 1 s")),
            "strict {strict}: {stop:?}"
        );
        // Past the failure: nothing more taken under strict, the rest unrecorded at once
        // otherwise.
        let more = r.output_now(bytes::Bytes::from(vec![b'x'; CHUNK]));
        assert_eq!(more, if strict { 0 } else { CHUNK }, "strict {strict}");
        // The end does not wait for the hung disk for ever either.
        let ending = std::time::Instant::now();
        assert_eq!(r.finish_now(), stop, "strict {strict}");
        assert!(
            ending.elapsed() < Duration::from_secs(10),
            "{:?}",
            ending.elapsed()
        );
        drop(held);
    }
}

/// A destination whose writes panic once `armed` (a bug in the writer's path).
#[derive(Clone, Default)]
struct Panicking {
    armed: Arc<AtomicBool>,
}

impl std::io::Write for Panicking {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        assert!(!self.armed.load(Ordering::Acquire), "a writer's bug (test)");
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.write(&[]).map(|_| ())
    }
}

impl writer::Durable for Panicking {
    fn sync_all(&self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A writer thread that panics fails the recording: under `strict` nothing more is taken, so
/// nothing more is shown that no recording holds.
#[test]
fn a_writer_that_panics_fails_the_recording_and_strict_takes_nothing_after() {
    let sink = Panicking::default();
    let strict = Limits {
        input: false,
        max_bytes: u64::MAX,
        strict: true,
    };
    let r = Recorder::start(
        std::io::BufWriter::new(sink.clone()),
        PathBuf::from("mem.cast"),
        &header(),
        strict,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.output_now(bytes::Bytes::from_static(b"before\n")), 7);
    assert!(r.settle_now());
    sink.armed.store(true, Ordering::Release);
    // The writer panics on its next write: a line's flush, at the latest within a second.
    r.output_now(bytes::Bytes::from_static(b"boom\n"));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while r.stopped().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(r.stopped(), Some(Stop::Failed(WRITER_FAILED.into())));
    assert_eq!(r.output_now(bytes::Bytes::from_static(b"after\n")), 0);
    assert_eq!(r.finish_now(), Some(Stop::Failed(WRITER_FAILED.into())));
}

/// A wait for the end that was cancelled (its task dropped while the writer was behind) leaves
/// the wait to the next call: that one answers only once the file is complete.
#[test]
fn a_cancelled_wait_for_the_end_leaves_the_wait_to_the_next_call() {
    let sink = Gated::default();
    let r = gated(&sink, UNLIMITED);
    assert_eq!(r.output_now(bytes::Bytes::from(vec![b'x'; 4096])), 4096);
    let held = sink.gate.lock().unwrap_or_else(|e| e.into_inner());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    rt.block_on(async {
        let first = tokio::time::timeout(Duration::from_millis(200), r.complete()).await;
        assert!(first.is_err(), "the end was answered with the writer held");
    });
    // The next call waits for the writer, however long the disk takes.
    let next = {
        let r = r.clone();
        std::thread::spawn(move || r.complete_now())
    };
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !next.is_finished(),
        "the next call answered with the writer held"
    );
    let before = sink.got.load(Ordering::Acquire);
    drop(held);
    let answer = next
        .join()
        .unwrap_or_else(|_| panic!("the waiting thread panicked"));
    assert_eq!(answer, None);
    let after = sink.got.load(Ordering::Acquire);
    assert!(
        after >= before + 4096,
        "the next call answered before the output was written ({before} → {after})"
    );
    assert_eq!(r.finish_now(), None);
}
