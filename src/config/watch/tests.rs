use super::*;
use notify::event::{CreateKind, ModifyKind, RenameMode};

fn event(kind: EventKind, path: &Path) -> Event {
    Event::new(kind).add_path(path.to_path_buf())
}

/// A config directory `cfg` in a temporary directory, with an anchor beside it.
fn dir_scope() -> (tempfile::TempDir, Scope) {
    let root = tempfile::tempdir().unwrap();
    let cfg = root.path().join("cfg");
    std::fs::create_dir(&cfg).unwrap();
    let scope = Scope {
        path: cfg.clone(),
        anchors: vec![cfg, root.path().join("current")],
    };
    (root, scope)
}

#[test]
fn reads_are_ignored_and_writes_count() {
    let (_root, scope) = dir_scope();
    let file = scope.path.join("a.yaml");
    let open = EventKind::Access(AccessKind::Open(AccessMode::Any));
    assert_eq!(scope.classify(&event(open, &file)), None);
    let closed = EventKind::Access(AccessKind::Close(AccessMode::Write));
    assert!(scope.classify(&event(closed, &file)).unwrap().files);
    let data = EventKind::Modify(ModifyKind::Name(RenameMode::To));
    let swapped = scope.path.join("..data");
    assert!(scope.classify(&event(data, &swapped)).unwrap().files);
}

#[test]
fn errors_add_up_over_a_burst() {
    let mut change = Change::default();
    let error = Change {
        rescan: true,
        errors: 1,
        ..Change::default()
    };
    change.merge(error);
    change.merge(error);
    assert_eq!((change.rescan, change.errors), (true, 2));
}

#[test]
fn anchors_and_strangers() {
    let (root, scope) = dir_scope();
    let create = EventKind::Create(CreateKind::Any);
    assert!(scope.classify(&event(create, &scope.path)).unwrap().moved);
    let current = root.path().join("current");
    assert!(scope.classify(&event(create, &current)).unwrap().moved);
    assert_eq!(
        scope.classify(&event(create, &root.path().join("other"))),
        None
    );
    let beside = root.path().join("cfgx").join("a.yaml");
    assert_eq!(scope.classify(&event(create, &beside)), None);
}

/// Beside a config file: the file, and directories or symlinks (Kubernetes'
/// `..data`), never a regular file such as the server's own log.
#[test]
fn beside_a_file_only_the_file_and_what_may_retarget_it_count() {
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("x.yaml");
    std::fs::write(&file, "domain: x\n").unwrap();
    let log = root.path().join("serve.log");
    std::fs::write(&log, "a line\n").unwrap();
    let data = root.path().join("..data");
    std::fs::create_dir(&data).unwrap();
    let scope = Scope {
        path: file.clone(),
        anchors: vec![],
    };
    let create = EventKind::Create(CreateKind::Any);
    assert!(scope.classify(&event(create, &file)).unwrap().files);
    assert!(scope.classify(&event(create, &data)).unwrap().files);
    assert_eq!(scope.classify(&event(create, &log)), None);
    let elsewhere = tempfile::tempdir().unwrap();
    let other = elsewhere.path().join("x.yaml");
    assert_eq!(scope.classify(&event(create, &other)), None);
}

/// A config path that does not exist yet: only its creation counts (the log of
/// a server started without a config must not reload it line by line).
#[test]
fn a_missing_config_is_an_anchor_and_nothing_beside_it_counts() {
    let root = tempfile::tempdir().unwrap();
    let watcher = ConfigWatcher::new(WatchOptions::new(root.path().join("config")));
    let scope = &watcher.scope;
    let log = root.path().join("serve.log");
    std::fs::write(&log, "a line\n").unwrap();
    let modify = EventKind::Modify(ModifyKind::Any);
    assert_eq!(scope.classify(&event(modify, &log)), None);
    std::fs::create_dir(root.path().join("config")).unwrap();
    let create = EventKind::Create(CreateKind::Any);
    let config = std::path::absolute(root.path().join("config")).unwrap();
    assert!(scope.classify(&event(create, &config)).unwrap().moved);
}
