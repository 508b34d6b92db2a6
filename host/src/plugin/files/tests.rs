use super::*;

fn pattern(text: &str) -> Pattern {
    Pattern::parse(text).unwrap()
}

fn names(path: &str) -> Vec<&str> {
    plain_components(path).unwrap()
}

#[test]
fn patterns_match_names_globs_and_any_depth() {
    let hwmon = pattern("/sys/class/hwmon/**");
    assert!(hwmon.matches(&names("/sys/class/hwmon/hwmon0/temp1_input")));
    assert!(hwmon.leads_below(&names("/sys/class/hwmon")));
    assert!(hwmon.leads_below(&names("/sys")));
    assert!(!hwmon.matches(&names("/sys/class/net/eth0")));
    let cpu = pattern("/sys/devices/system/cpu/cpu*/cpufreq/scaling_cur_freq");
    assert!(cpu.matches(&names(
        "/sys/devices/system/cpu/cpu12/cpufreq/scaling_cur_freq"
    )));
    assert!(!cpu.matches(&names("/sys/devices/system/cpu/online")));
    assert!(cpu.leads_below(&names("/sys/devices/system/cpu/cpu3")));
    let exact = pattern("/proc/loadavg");
    assert!(exact.matches(&names("//proc//loadavg/")));
    assert!(!exact.matches(&names("/proc")));
    assert!(exact.leads_below(&names("/proc")));
    assert!(!exact.leads_below(&names("/proc/loadavg")));
    assert!(glob("a*b*c", "axxbyyc") && !glob("a*b*c", "axxbyy") && glob("*", ""));
}

#[test]
fn paths_with_dot_dot_or_relative_or_nul_are_refused() {
    for bad in [
        "proc/stat",
        "/proc/../etc/passwd",
        "/proc/./stat",
        "/proc/st\0at",
    ] {
        assert!(plain_components(bad).is_err(), "{bad:?}");
    }
    assert!(plain_components(&format!("/{}", "a".repeat(MAX_PATH))).is_err());
}

#[test]
fn per_process_and_kernel_entries_are_denied_whatever_the_grant() {
    for path in [
        "/proc/self/environ",
        "/proc/thread-self/environ",
        "/proc/1/mem",
        "/proc/123/task/124/environ",
        "/proc/kcore",
        "/proc/kallsyms",
        "/dev/mem",
    ] {
        assert!(denied(&names(path), false).is_some(), "{path}");
    }
    for path in [
        "/proc/stat",
        "/proc/net/dev",
        "/sys/class/hwmon",
        "/proc/sys/kernel/hostname",
    ] {
        assert!(denied(&names(path), false).is_none(), "{path}");
    }
    // The network view is admitted only when asked for through /proc/net.
    assert!(denied(&names("/proc/77/net/dev"), true).is_none());
    assert!(denied(&names("/proc/77/environ"), true).is_some());
    assert!(denied(&names("/proc/77/net/dev"), false).is_some());
    // A grant naming a refused entry outright is a configuration error.
    let err = Pattern::parse("/proc/self/environ").unwrap_err();
    assert!(err.contains("per-process"), "{err}");
    assert!(Pattern::parse("/proc/a**").is_err());
}

#[test]
fn secrets_are_refused_by_inode_through_links_and_below_a_secret_directory() {
    let root = tempfile::tempdir().unwrap();
    let at = |p: &str| root.path().join(p);
    std::fs::create_dir_all(at("keys")).unwrap();
    std::fs::write(at("keys/inner.key"), "k").unwrap();
    std::fs::write(at("token"), "t").unwrap();
    std::fs::write(at("other"), "fine").unwrap();
    std::fs::hard_link(at("token"), at("innocent")).unwrap();
    std::os::unix::fs::symlink("keys", at("keys-link")).unwrap();
    // The secrets as the agent may be told them: a file, and a directory through a link.
    let secrets: Arc<[PathBuf]> = Arc::from(vec![at("token"), at("keys-link")]);
    let grants = FileGrants::new(&["/**".to_owned()], Some(root.path()), 1 << 20)
        .unwrap()
        .with_secrets(secrets);
    for path in ["/token", "/innocent", "/keys/inner.key"] {
        let err = grants.read(path).unwrap_err();
        assert!(err.contains("agent's own secrets"), "{path}: {err}");
    }
    assert_eq!(grants.read("/other").unwrap(), b"fine");
    // A replaced token file is caught by the next call: secrets are looked up once per
    // call.
    std::fs::remove_file(at("token")).unwrap();
    std::fs::rename(at("other"), at("token")).unwrap();
    grants.begin_call();
    assert!(grants.read("/innocent").is_ok());
    assert!(grants.read("/token").is_err());
}

#[test]
fn files_of_proc_and_sys_need_no_secret_lookup_and_other_files_still_do() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "t").unwrap();
    let granted = [
        "/proc/loadavg".to_owned(),
        "/sys/kernel/mm/transparent_hugepage/enabled".to_owned(),
        format!("{}/**", dir.path().display()),
    ];
    let grants = FileGrants::new(&granted, None, 1 << 20)
        .unwrap()
        .with_secrets(Arc::from(vec![token.clone()]));
    for _ in 0..3 {
        grants.begin_call();
        assert!(grants.read("/proc/loadavg").is_ok());
    }
    if Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
        grants.begin_call();
        assert!(
            grants
                .read("/sys/kernel/mm/transparent_hugepage/enabled")
                .is_ok()
        );
    }
    assert_eq!(grants.secret_lookups(), 0, "looked up for kernel files");
    // A file elsewhere is checked against the secrets as they are now.
    let other = dir.path().join("other");
    std::fs::write(&other, "fine").unwrap();
    grants.begin_call();
    assert!(grants.read(other.to_str().unwrap()).is_ok());
    assert_eq!(grants.secret_lookups(), 1);
    std::fs::hard_link(&token, dir.path().join("innocent")).unwrap();
    let err = grants
        .read(dir.path().join("innocent").to_str().unwrap())
        .unwrap_err();
    assert!(err.contains("agent's own secrets"), "{err}");
}

#[test]
fn a_link_leaving_its_top_level_tree_is_refused_whichever_way_it_is_resolved() {
    let root = tempfile::tempdir().unwrap();
    let at = |p: &str| root.path().join(p);
    std::fs::create_dir_all(at("sys/devices/hwmon0")).unwrap();
    std::fs::create_dir_all(at("sys/class/hwmon")).unwrap();
    std::fs::create_dir_all(at("etc")).unwrap();
    std::fs::write(at("sys/devices/hwmon0/temp1_input"), "41000\n").unwrap();
    std::fs::write(at("etc/shadow"), "x").unwrap();
    std::os::unix::fs::symlink("../../devices/hwmon0", at("sys/class/hwmon/hwmon0")).unwrap();
    std::os::unix::fs::symlink("../../../etc", at("sys/class/hwmon/hwmon1")).unwrap();
    let absolute = at("sys/devices/hwmon0");
    std::os::unix::fs::symlink(&absolute, at("sys/class/hwmon/hwmon2")).unwrap();
    let grants = FileGrants::new(&["/sys/**".to_owned()], Some(root.path()), 1 << 20).unwrap();
    // A relative link within /sys is followed, for reading and for listing.
    let path = "/sys/class/hwmon/hwmon0/temp1_input";
    assert_eq!(grants.read(path).unwrap(), b"41000\n");
    assert_eq!(
        grants.list("/sys/class/hwmon/hwmon0").unwrap(),
        ["temp1_input"]
    );
    assert_eq!(
        grants.list("/sys/class/hwmon").unwrap(),
        ["hwmon0", "hwmon1", "hwmon2"]
    );
    // One out of /sys is not.
    let err = grants.read("/sys/class/hwmon/hwmon1/shadow").unwrap_err();
    assert!(err.contains("leads outside /sys"), "{err}");
    // An absolute link (which `openat2` beneath /sys refuses to follow) is resolved on
    // the host instead, and is served as it leads into /sys.
    let path = "/sys/class/hwmon/hwmon2/temp1_input";
    assert_eq!(grants.read(path).unwrap(), b"41000\n");
    // A missing file is reported as missing.
    let err = grants
        .read("/sys/class/hwmon/hwmon0/temp1_label")
        .unwrap_err();
    assert!(err.contains("No such file"), "{err}");
}

#[test]
fn a_plain_path_that_turns_into_a_link_is_checked_where_it_leads_at_the_next_read() {
    let root = tempfile::tempdir().unwrap();
    let at = |p: &str| root.path().join(p);
    std::fs::create_dir_all(at("sys/devices/hwmon0")).unwrap();
    std::fs::create_dir_all(at("sys/class/hwmon/hwmon0")).unwrap();
    std::fs::create_dir_all(at("etc")).unwrap();
    std::fs::write(at("sys/devices/hwmon0/temp1_input"), "41000\n").unwrap();
    std::fs::write(at("sys/class/hwmon/hwmon0/temp1_input"), "1\n").unwrap();
    std::fs::write(at("etc/temp1_input"), "outside").unwrap();
    let grants = FileGrants::new(&["/sys/**".to_owned()], Some(root.path()), 1 << 20).unwrap();
    let path = "/sys/class/hwmon/hwmon0/temp1_input";
    // Read without a link on the way, twice (the second read takes the same way).
    assert_eq!(grants.read(path).unwrap(), b"1\n");
    assert_eq!(grants.read(path).unwrap(), b"1\n");
    // The directory becomes a link out of /sys: refused, not read the way it was.
    std::fs::remove_dir_all(at("sys/class/hwmon/hwmon0")).unwrap();
    std::os::unix::fs::symlink("../../../etc", at("sys/class/hwmon/hwmon0")).unwrap();
    let err = grants.read(path).unwrap_err();
    assert!(err.contains("leads outside /sys"), "{err}");
    // A link within /sys is followed; then the link is a directory again.
    std::fs::remove_file(at("sys/class/hwmon/hwmon0")).unwrap();
    std::os::unix::fs::symlink("../../devices/hwmon0", at("sys/class/hwmon/hwmon0")).unwrap();
    assert_eq!(grants.read(path).unwrap(), b"41000\n");
    std::fs::remove_file(at("sys/class/hwmon/hwmon0")).unwrap();
    std::fs::create_dir_all(at("sys/class/hwmon/hwmon0")).unwrap();
    std::fs::write(at("sys/class/hwmon/hwmon0/temp1_input"), "2\n").unwrap();
    assert_eq!(grants.read(path).unwrap(), b"2\n");
    // The file itself turning into a link to a secret of the agent is caught too.
    std::fs::write(at("sys/token"), "t").unwrap();
    let grants = grants.with_secrets(Arc::from(vec![at("sys/token")]));
    assert_eq!(grants.read(path).unwrap(), b"2\n");
    std::fs::remove_file(at("sys/class/hwmon/hwmon0/temp1_input")).unwrap();
    std::os::unix::fs::symlink("../../../token", at("sys/class/hwmon/hwmon0/temp1_input")).unwrap();
    let err = grants.read(path).unwrap_err();
    assert!(err.contains("agent's own secrets"), "{err}");
    assert!(grants.read("/sys/token").is_err());
}

#[test]
fn the_root_and_top_level_names_are_opened_beneath_the_root_and_links_there_checked() {
    let root = tempfile::tempdir().unwrap();
    let at = |p: &str| root.path().join(p);
    std::fs::create_dir_all(at("scratch")).unwrap();
    std::fs::create_dir_all(at("real")).unwrap();
    std::fs::write(at("scratch/file"), "x").unwrap();
    std::os::unix::fs::symlink("/etc", at("outside")).unwrap();
    std::os::unix::fs::symlink("real", at("inside")).unwrap();
    let grants = FileGrants::new(
        &[
            "/".to_owned(),
            "/scratch".to_owned(),
            "/outside".to_owned(),
            "/inside".to_owned(),
            "/missing".to_owned(),
        ],
        Some(root.path()),
        1 << 20,
    )
    .unwrap();
    let s = grants.statvfs("/").unwrap();
    assert!(s.block_size > 0 && s.blocks > 0, "{s:?}");
    assert_eq!(grants.statvfs("/scratch").unwrap().blocks, s.blocks);
    assert_eq!(
        grants.list("/").unwrap(),
        ["inside", "outside", "scratch"].map(String::from)
    );
    // A top-level link is resolved on the host: out of the root it is refused, and a
    // link beside a top-level name does not lead into another tree either.
    let err = grants.statvfs("/outside").unwrap_err();
    assert!(err.contains("outside the plugin's file root"), "{err}");
    let err = grants.statvfs("/inside").unwrap_err();
    assert!(err.contains("leads outside /inside"), "{err}");
    let err = grants.statvfs("/missing").unwrap_err();
    assert!(err.contains("No such file"), "{err}");
    // A top-level name that was a directory and turned into a link is checked again.
    std::fs::remove_dir_all(at("scratch")).unwrap();
    std::os::unix::fs::symlink("/etc", at("scratch")).unwrap();
    let err = grants.statvfs("/scratch").unwrap_err();
    assert!(err.contains("outside the plugin's file root"), "{err}");
}

#[test]
fn a_fixture_root_serves_its_files_and_nothing_beside_it() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("proc/net")).unwrap();
    std::fs::write(root.path().join("proc/stat"), "cpu 1 2 3\n").unwrap();
    std::fs::write(root.path().join("proc/net/dev"), "eth0\n").unwrap();
    std::fs::write(root.path().join("secret"), "s3cret").unwrap();
    std::os::unix::fs::symlink("../secret", root.path().join("proc/leak")).unwrap();
    std::os::unix::fs::symlink("/proc/self/environ", root.path().join("proc/env")).unwrap();
    let grants = FileGrants::new(&["/proc/**".to_owned()], Some(root.path()), 1 << 20).unwrap();
    assert_eq!(grants.read("/proc/stat").unwrap(), b"cpu 1 2 3\n");
    assert_eq!(grants.read("/proc/net/dev").unwrap(), b"eth0\n");
    let err = grants.read("/proc/leak").unwrap_err();
    assert!(err.contains("leads outside /proc"), "{err}");
    let err = grants.read("/proc/env").unwrap_err();
    assert!(err.contains("outside the plugin's file root"), "{err}");
    let err = grants.read("/secret").unwrap_err();
    assert!(err.contains("not granted"), "{err}");
    assert_eq!(
        grants.list("/proc").unwrap(),
        ["env", "leak", "net", "stat"]
    );
    assert_eq!(grants.list("/").unwrap(), ["proc"]);
    assert!(grants.list("/proc/stat").is_err());
    let small = FileGrants::new(&["/proc/stat".to_owned()], Some(root.path()), 4).unwrap();
    let err = small.read("/proc/stat").unwrap_err();
    assert!(
        err.contains("larger than this plugin's limit of 4 bytes"),
        "{err}"
    );
    assert_eq!(small.list("/proc").unwrap(), ["stat"]);
}

fn held(grants: &FileGrants) -> (usize, u64) {
    let held = grants.held.lock().unwrap();
    (held.held(), held.reused())
}

#[test]
fn a_kernel_file_read_every_round_is_opened_once_and_still_read_fresh() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain");
    std::fs::write(&plain, "one").unwrap();
    let granted = [
        "/proc/uptime".to_owned(),
        format!("{}/*", dir.path().display()),
    ];
    let grants = FileGrants::new(&granted, None, 1 << 20).unwrap();
    let first = grants.read("/proc/uptime").unwrap();
    assert_eq!(held(&grants), (1, 0));
    // The uptime counts hundredths of a second: a later read sees a later time.
    std::thread::sleep(std::time::Duration::from_millis(30));
    let second = grants.read("/proc/uptime").unwrap();
    assert_eq!(
        held(&grants),
        (1, 1),
        "the second read opened the file again"
    );
    let seconds = |b: &[u8]| -> f64 {
        let text = std::str::from_utf8(b).unwrap();
        text.split_whitespace().next().unwrap().parse().unwrap()
    };
    assert!(
        seconds(&second) > seconds(&first),
        "a held file gave old content: {:?} then {:?}",
        String::from_utf8_lossy(&first),
        String::from_utf8_lossy(&second)
    );
    // A file elsewhere is opened at every read, and so sees a replaced file.
    let path = plain.to_str().unwrap();
    assert_eq!(grants.read(path).unwrap(), b"one");
    std::fs::remove_file(&plain).unwrap();
    std::fs::write(&plain, "two").unwrap();
    assert_eq!(grants.read(path).unwrap(), b"two");
    assert_eq!(held(&grants), (1, 1));
    // A held file still answers to the size limit.
    let small = FileGrants::new(&granted, None, 2).unwrap();
    small.read("/proc/uptime").unwrap_err();
    let err = small.read("/proc/uptime").unwrap_err();
    assert!(err.contains("larger than this plugin's limit"), "{err}");
}

#[test]
fn a_held_file_that_fails_is_dropped_and_the_path_opened_again() {
    let grants = FileGrants::new(&["/proc/uptime".to_owned()], None, 1 << 20).unwrap();
    grants.read("/proc/uptime").unwrap();
    assert_eq!(held(&grants), (1, 0));
    // A descriptor whose read fails, as one of a device that went away does (ENODEV);
    // a directory's fails with EISDIR.
    let dir = tempfile::tempdir().unwrap();
    grants
        .held
        .lock()
        .unwrap()
        .replace("/proc/uptime", File::open(dir.path()).unwrap());
    let again = grants.read("/proc/uptime").unwrap();
    assert!(again.first().is_some_and(u8::is_ascii_digit), "{again:?}");
    assert_eq!(held(&grants), (1, 0), "the failed read counted as served");
    grants.read("/proc/uptime").unwrap();
    assert_eq!(held(&grants), (1, 1), "the file opened again is not held");
}
