//! Tests of granted commands: parsing, checks, users, runs and counters.

use std::collections::BTreeMap;

use super::identity::lookup_user;
use super::prepared::unrunnable;
use super::*;

#[test]
fn a_grant_parses_with_its_defaults_and_is_checked() {
    let grants: BTreeMap<String, RunGrant> = serde_json::from_str(
        r#"{"sensors": {"path": "/usr/bin/true", "args": ["-x"]},
            "slow": {"path": "/bin/sleep", "timeout": "250ms", "max-output-bytes": 10,
                     "user": "nobody", "max-processes": 8}}"#,
    )
    .unwrap();
    let sensors = &grants["sensors"];
    assert_eq!(sensors.timeout, DEFAULT_TIMEOUT);
    assert_eq!(sensors.max_output_bytes, DEFAULT_MAX_OUTPUT);
    assert_eq!(sensors.user, None);
    assert_eq!(grants["slow"].timeout, Duration::from_millis(250));
    validate(&grants).unwrap();

    for (json, expected) in [
        (r#"{"x": {"path": "true"}}"#, "must be an absolute path"),
        (
            r#"{"x": {"path": "/bin/true", "timeout": "0s"}}"#,
            "timeout",
        ),
        (
            r#"{"x": {"path": "/bin/true", "max-output-bytes": 0}}"#,
            "max-output-bytes",
        ),
        (r#"{"x": {"path": "/bin/true", "user": ""}}"#, "user"),
        (r#"{"a b": {"path": "/bin/true"}}"#, "a name has"),
        (r#"{"": {"path": "/bin/true"}}"#, "a name has"),
    ] {
        let grants: BTreeMap<String, RunGrant> = serde_json::from_str(json).unwrap();
        let err = validate(&grants).unwrap_err();
        assert!(err.contains(expected), "{json}: {err}");
    }
    assert!(
        serde_json::from_str::<RunGrant>(r#"{"path": "/bin/true", "env": {}}"#).is_err(),
        "a grant has no environment to set"
    );
}

#[test]
fn modes_decide_who_may_run_a_file() {
    // SAFETY: plain data.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    st.st_mode = libc::S_IFREG | 0o750;
    st.st_uid = 10;
    st.st_gid = 20;
    assert_eq!(unrunnable(&st, 10, &[]), None);
    assert_eq!(unrunnable(&st, 11, &[20]), None);
    assert!(
        unrunnable(&st, 11, &[21])
            .unwrap()
            .contains("not executable")
    );
    assert_eq!(unrunnable(&st, 0, &[]), None);
    st.st_mode = libc::S_IFREG | 0o757;
    assert!(
        unrunnable(&st, 10, &[])
            .unwrap()
            .contains("writable by every user")
    );
    st.st_mode = libc::S_IFDIR | 0o755;
    assert!(
        unrunnable(&st, 10, &[])
            .unwrap()
            .contains("not a regular file")
    );
    st.st_mode = libc::S_IFREG | 0o644;
    assert!(unrunnable(&st, 0, &[]).unwrap().contains("not executable"));
}

#[test]
fn users_are_looked_up_with_their_groups() {
    let root = lookup_user("root").unwrap();
    assert_eq!((root.uid, root.gid), (0, 0));
    assert!(root.groups.contains(&0));
    let err = lookup_user("no-such-user-ccfleet").unwrap_err();
    assert!(err.contains("unknown user"), "{err}");
}

#[tokio::test]
async fn a_call_spends_at_most_the_sum_of_its_commands_timeouts() {
    let grants: BTreeMap<String, RunGrant> = [
        ("a".to_owned(), RunGrant::new("/bin/true")),
        (
            "b".to_owned(),
            RunGrant {
                timeout: Duration::from_millis(300),
                ..RunGrant::new("/bin/true")
            },
        ),
        // Unusable grants add nothing.
        ("c".to_owned(), RunGrant::new("/no/such/tool")),
    ]
    .into();
    let grants = std::sync::Arc::new(CommandGrants::open(&grants, Default::default()));
    assert_eq!(
        grants.call_budget(),
        DEFAULT_TIMEOUT + Duration::from_millis(300)
    );
    let mut store = StoreCommands::new(grants.clone());
    store.spent(Duration::from_secs(10));
    let (_, left) = store.begin();
    assert_eq!(left, Duration::ZERO);
    let err = grants.run_within("a", Some(left)).await.unwrap_err();
    assert_eq!(err.result, RunResult::Timeout);
    assert!(err.message.contains("was not started"), "{}", err.message);
    store.new_call();
    assert_eq!(store.begin().1, grants.call_budget());
    let out = grants.run_within("a", Some(store.begin().1)).await.unwrap();
    assert_eq!(out.status, Some(0));
}

#[test]
fn counters_count_by_result() {
    let stats = CommandStats::default();
    stats.record(RunResult::Ok, Duration::from_millis(3));
    stats.record(RunResult::Timeout, Duration::from_secs(1));
    stats.record(RunResult::Timeout, Duration::ZERO);
    let snap = stats.snapshot();
    assert_eq!(snap.count(RunResult::Ok), 1);
    assert_eq!(snap.count(RunResult::Timeout), 2);
    assert_eq!(snap.count(RunResult::Refused), 0);
    assert!((snap.seconds - 1.003).abs() < 1e-9);
    assert_eq!(
        RunResult::ALL.map(|r| r.index()),
        [0, 1, 2, 3, 4, 5],
        "ALL lists the results in index order"
    );
}
