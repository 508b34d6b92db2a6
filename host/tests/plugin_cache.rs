//! The compile cache holds native code the agent runs: it stays private, is written without
//! following planted links, and an entry this host did not write is never run.

#[path = "support/guests.rs"]
mod guests;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ccfleet_host::events::EventKind;
use ccfleet_host::sink;
use ccfleet_host::{FeedSenders, PluginSpec, Runtime, RuntimeOptions};

fn runtime(cache: &Path) -> Runtime {
    Runtime::new(RuntimeOptions {
        cache_dir: Some(cache.to_path_buf()),
        watch_interval: Duration::from_millis(50),
        ..RuntimeOptions::default()
    })
    .expect("runtime")
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o777
}

/// The single entry in the cache directory.
fn entry(dir: &Path) -> PathBuf {
    let entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    entries.into_iter().next().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_directory_and_its_entries_are_private() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("components");
    runtime(&dir)
        .load(&PluginSpec::new(guests::component("roster-logger")))
        .await
        .unwrap();
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&entry(&dir)), 0o600);
    assert_eq!(mode(&base.path().join("components.key")), 0o600);

    // A directory left open to others is narrowed before use.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let again = runtime(&dir)
        .load(&PluginSpec::new(guests::component("roster-logger")))
        .await
        .unwrap();
    assert!(again.cached);
    assert_eq!(mode(&dir), 0o700);

    // A cache directory that is a link is not used at all.
    let linked = base.path().join("linked");
    std::os::unix::fs::symlink(&dir, &linked).unwrap();
    let through_link = runtime(&linked)
        .load(&PluginSpec::new(guests::component("roster-logger")))
        .await
        .unwrap();
    assert!(!through_link.cached);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planted_cache_entry_is_compiled_again_not_run() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("components");
    let logger = PluginSpec::new(guests::component("roster-logger"));
    let trap = PluginSpec::new(guests::component("hostile-trap"));
    // Valid native code for this very engine, of another component: what an attacker with
    // write access to the directory would plant.
    let other = base.path().join("other");
    runtime(&other).load(&trap).await.unwrap();
    let planted = std::fs::read(entry(&other)).unwrap();
    runtime(&dir).load(&logger).await.unwrap();
    let target = entry(&dir);
    std::fs::write(&target, &planted).unwrap();

    let runtime = runtime(&dir);
    let loaded = runtime.load(&logger).await.unwrap();
    assert!(!loaded.cached, "a planted entry was taken from the cache");

    // A truncated or bit-flipped entry is no better.
    for damage in [
        |bytes: &mut Vec<u8>| bytes.truncate(bytes.len() / 2),
        |bytes: &mut Vec<u8>| {
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x40;
        },
    ] {
        let mut bytes = std::fs::read(&target).unwrap();
        damage(&mut bytes);
        std::fs::write(&target, &bytes).unwrap();
        assert!(!runtime.load(&logger).await.unwrap().cached);
        // The entry was rewritten by the recompilation and verifies again.
        assert!(runtime.load(&logger).await.unwrap().cached);
    }

    // What runs is the component asked for.
    let mut events = runtime.subscribe();
    let (sink, _rx) = sink::channel(4);
    let feeds = FeedSenders::new();
    let plugin = runtime.spawn(logger, feeds.subscribe(), sink);
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Ok(e) = events.recv().await
                && matches!(&e.kind, EventKind::Log { message, .. } if message.contains("roster-logger ready"))
            {
                return;
            }
        }
    })
    .await
    .expect("roster-logger runs");
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_writes_do_not_follow_planted_links() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("components");
    let spec = PluginSpec::new(guests::component("roster-logger"));
    runtime(&dir).load(&spec).await.unwrap();
    let target = entry(&dir);
    std::fs::remove_file(&target).unwrap();

    // Links at the entry's name and at the (predictable) temporary name an earlier version
    // wrote through.
    let victim = base.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    std::os::unix::fs::symlink(&victim, &target).unwrap();
    let name = target.file_name().unwrap().to_str().unwrap();
    let pid = std::process::id();
    std::os::unix::fs::symlink(&victim, dir.join(format!(".{name}.{pid}.tmp"))).unwrap();
    let loaded = runtime(&dir).load(&spec).await.unwrap();
    assert!(!loaded.cached);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    let meta = std::fs::symlink_metadata(&target).unwrap();
    assert!(meta.file_type().is_file(), "the entry is a file of its own");
    assert!(runtime(&dir).load(&spec).await.unwrap().cached);
}

/// The lines of this process's memory map that map `path`.
fn mappings_of(path: &Path) -> Vec<String> {
    let path = path.to_str().unwrap();
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|line| line.ends_with(path))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_component_runs_from_its_mapped_entry_not_from_a_copy() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("components");
    let spec = PluginSpec::new(guests::component("roster-logger"));
    let compiled = runtime(&dir).load(&spec).await.unwrap();
    assert!(!compiled.cached);
    let target = entry(&dir);
    assert!(
        mappings_of(&target).is_empty(),
        "a fresh compilation is not mapped"
    );

    // Loaded from the cache, the code is the entry's file mapped (executable where the
    // text is): page-cache pages, not a private copy.
    let cached = runtime(&dir).load(&spec).await.unwrap();
    assert!(cached.cached);
    let maps = mappings_of(&target);
    assert!(
        maps.iter()
            .any(|line| line.split_whitespace().nth(1) == Some("r-xp")),
        "the entry's code is not mapped from it: {maps:?}"
    );
    drop(cached);
    assert!(mappings_of(&target).is_empty(), "dropped, it is unmapped");

    // The tag is checked all the same: a flipped byte anywhere, the tag included, and the
    // entry is compiled again.
    for at in [
        0,
        1 << 12,
        std::fs::metadata(&target).unwrap().len() as usize - 1,
    ] {
        let mut bytes = std::fs::read(&target).unwrap();
        bytes[at] ^= 0x01;
        std::fs::write(&target, &bytes).unwrap();
        assert!(
            !runtime(&dir).load(&spec).await.unwrap().cached,
            "byte {at}"
        );
    }
}
