//! `host.emit-lines` (cc:fleet 0.3) against a real component: the `raw-lines` test plugin
//! hands the bytes of a granted file to the agent as they are, so each test writes the batch
//! it checks into that file. Also `cc:fleet/commands` as a plugin without grants sees it.

#[path = "support/guests.rs"]
mod guests;

use std::path::Path;

use ccfleet::lineproto::Decoder;
use ccfleet_host::plugin::Instance;
use ccfleet_host::sink::{self, BatchReceiver};
use ccfleet_host::{PluginSpec, Runtime, RuntimeOptions};

fn runtime() -> Runtime {
    Runtime::new(RuntimeOptions {
        cache_dir: None,
        ..RuntimeOptions::default()
    })
    .unwrap()
}

/// The `raw-lines` plugin reading its batch from `root/batch`.
fn spec(root: &Path) -> PluginSpec {
    let mut spec = PluginSpec::new(guests::component("raw-lines"));
    spec.capabilities.read_files = vec!["/batch".to_owned()];
    spec.capabilities.files_root = Some(root.to_path_buf());
    spec
}

async fn start(runtime: &Runtime, spec: &PluginSpec) -> (Instance, BatchReceiver) {
    let loaded = runtime.load(spec).await.unwrap();
    let (sink, rx) = sink::channel(16);
    let instance = loaded.instantiate(runtime, spec, sink).await.unwrap();
    (instance, rx)
}

/// Writes `batch` for the plugin and has it emitted: the plugin's own answer (the agent's
/// refusal, if any).
async fn emit(instance: &mut Instance, root: &Path, batch: &[u8]) -> Result<(), String> {
    std::fs::write(root.join("batch"), batch).unwrap();
    instance
        .collect(1)
        .await
        .expect("a refused batch never traps the plugin")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_lines_reach_the_sink_as_written_with_the_time_appended_only_where_missing() {
    let root = tempfile::tempdir().unwrap();
    let runtime = runtime();
    let (mut instance, mut rx) = start(&runtime, &spec(root.path())).await;
    let before = ccfleet::wire::now_ns();
    let batch = b"# a comment, left out\ncpu,host=a\\ b,type=node usage=0.5,n=3i 17\r\n\n\
                  mem,host=a text=\"x\ny\"\nup ok=true";
    assert_eq!(emit(&mut instance, root.path(), batch).await, Ok(()));
    let after = ccfleet::wire::now_ns();
    let sent = rx.try_recv().expect("the batch was sent");
    assert_eq!(sent.points, 3);
    assert!(rx.try_recv().is_err(), "one batch");
    let text = String::from_utf8(sent.lines.to_vec()).unwrap();
    let (first, rest) = text.split_once('\n').unwrap();
    assert_eq!(first, "cpu,host=a\\ b,type=node usage=0.5,n=3i 17");
    let times: Vec<i64> = Decoder::new(rest.as_bytes())
        .map(|line| line.unwrap().time().expect("every line sent has a time"))
        .collect();
    assert_eq!(times.len(), 2);
    assert_eq!(times[0], times[1], "the clock is read once per batch");
    assert!((before..=after).contains(&times[0]), "{times:?}");
    assert_eq!(
        rest,
        format!(
            "mem,host=a text=\"x\ny\" {t}\nup ok=true {t}\n",
            t = times[0]
        )
    );

    // An empty batch, or one of comments only, sends nothing and is no error.
    assert_eq!(emit(&mut instance, root.path(), b"").await, Ok(()));
    assert_eq!(
        emit(&mut instance, root.path(), b"# only\n\n").await,
        Ok(())
    );
    assert!(rx.try_recv().is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_line_refuses_the_whole_batch_naming_it_and_nothing_is_sent() {
    let root = tempfile::tempdir().unwrap();
    let runtime = runtime();
    let (mut instance, mut rx) = start(&runtime, &spec(root.path())).await;
    let mut wrong = Vec::new();
    for (batch, error) in [
        (
            &b"a v=1\nb v=\nc v=1\n"[..],
            "line 2: invalid field value (column 5)",
        ),
        (b"a v=1\nb\n", "line 2: no fields (column 2)"),
        (
            b"a v=1 1\n,t=1 v=1\n",
            "line 2: unexpected character ',' (column 1)",
        ),
        (b"a v=NaN\n", "line 1: invalid field value (column 5)"),
        (b"a v=1\n\xff\xfe v=1\n", "line 2: invalid UTF-8 (column 1)"),
        (b"a v=1 12x\n", "line 1: invalid timestamp (column 7)"),
        (
            b"a s=\"open\n",
            "line 1: unterminated string field (column 5)",
        ),
        (b"a v=1\x00\n", "line 1: invalid field value (column 5)"),
    ] {
        let got = emit(&mut instance, root.path(), batch).await;
        if got != Err(error.to_owned()) {
            wrong.push(format!("{}: {got:?}", batch.escape_ascii()));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert!(rx.try_recv().is_err(), "no batch may reach the sink");
    // The plugin runs on, and its next good batch goes out.
    assert_eq!(emit(&mut instance, root.path(), b"a v=1 1\n").await, Ok(()));
    assert_eq!(&rx.try_recv().unwrap().lines[..], b"a v=1 1\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_s_limits_are_enforced_on_every_line() {
    let root = tempfile::tempdir().unwrap();
    let runtime = runtime();
    let mut spec = spec(root.path());
    spec.limits.max_points = 2;
    spec.limits.max_emit_bytes = 64;
    spec.limits.max_line_bytes = 24;
    spec.limits.max_tags = 1;
    spec.limits.max_fields = 2;
    let (mut instance, mut rx) = start(&runtime, &spec).await;
    for (batch, error) in [
        (
            "a v=1\nb v=1\nc v=1\n",
            "line 3: the batch has more than 2 points",
        ),
        ("a,x=1,y=2 v=1\n", "line 1: the point has more than 1 tags"),
        (
            "a v=1,w=2,z=3\n",
            "line 1: the point has more than 2 fields",
        ),
        (
            "a,x=1 v=1 1700000000000000000\n",
            "line 1: line longer than this plugin's limit of 24 bytes (column 25)",
        ),
        (
            "a v=1 1\n# a comment that makes the batch longer than the 64 bytes allowed\n",
            "batch of 74 bytes exceeds this plugin's limit of 64 bytes",
        ),
    ] {
        assert_eq!(
            emit(&mut instance, root.path(), batch.as_bytes()).await,
            Err(error.to_owned()),
            "{batch}"
        );
    }
    assert!(rx.try_recv().is_err(), "no batch may reach the sink");
    // At the limits, a batch passes.
    let fits = "a,x=1 v=1,w=2 1\nb v=1\n";
    assert_eq!(
        emit(&mut instance, root.path(), fits.as_bytes()).await,
        Ok(())
    );
    let sent = rx.try_recv().unwrap();
    assert_eq!(sent.points, 2);
    assert!(sent.lines.starts_with(b"a,x=1 v=1,w=2 1\nb v=1 "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_not_granted_is_refused_by_name() {
    let runtime = runtime();
    let mut spec = PluginSpec::new(guests::component("run-command"));
    spec.config = serde_json::json!("ipmitool-sdr");
    let (mut instance, mut rx) = start(&runtime, &spec).await;
    assert_eq!(
        instance.collect(1).await,
        Ok(Err(
            "command ipmitool-sdr is not granted to this plugin (capabilities.run)".to_owned()
        ))
    );
    assert!(rx.try_recv().is_err());
}
