//! The shell scripts' manners: `. scripts/bootstrap` in an interactive bash leaves
//! that shell as it was (options, functions, variables) but for the two variables it
//! exports, and a bootstrap that fails returns non-zero instead of closing the
//! terminal (`set -e` leaked into the caller once made the next failing command end
//! the session).

use std::path::Path;
use std::process::Command;

use crate::common::process::{root, text};

/// What an interactive bash reports about itself around sourcing `bootstrap` (a
/// copy of the script when `tree` is given), then after a failing command.
fn source_in_interactive_bash(tree: &Path) -> String {
    let script = r#"
snapshot() { printf '%s|' "$-"; set -o | tr -s ' \t' ' ' | tr '\n' ';'; declare -F | tr '\n' ';'; }
before="$(snapshot)"
vars_before="$(compgen -v | sort)"
. scripts/bootstrap 2>/dev/null
echo "sourced: $?"
[ "$before" = "$(snapshot)" ] && echo "shell: unchanged" || echo "shell: CHANGED $(snapshot)"
echo "new variables: $(comm -13 <(echo "$vars_before") <(compgen -v | sort | grep -vx 'before\|vars_before') | tr '\n' ' ')"
false
echo "alive after a failing command"
"#;
    let out = Command::new("bash")
        .args(["-i", "-c", script])
        .current_dir(tree)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", std::env::var_os("HOME").unwrap_or_default())
        .output()
        .expect("run bash");
    text(&out.stdout)
}

#[test]
fn sourcing_bootstrap_exports_two_variables_and_changes_nothing_else() {
    let stamp = root().join(".venv/.requirements.sha256");
    assert!(
        stamp.exists(),
        "no venv at .venv: run scripts/bootstrap (scripts/test does) before this test"
    );
    let out = source_in_interactive_bash(root());
    assert!(out.contains("sourced: 0\n"), "{out}");
    assert!(out.contains("shell: unchanged\n"), "{out}");
    assert!(
        out.contains("new variables: TOLLGATE_ENVOY TOLLGATE_PYTHON \n"),
        "{out}"
    );
    assert!(out.contains("alive after a failing command\n"), "{out}");
}

#[test]
fn a_failing_bootstrap_returns_non_zero_and_the_shell_lives_on() {
    // The script alone, without the requirements it installs from: it must fail.
    let tree = tempfile::tempdir().unwrap();
    std::fs::create_dir(tree.path().join("scripts")).unwrap();
    std::fs::copy(
        root().join("scripts/bootstrap"),
        tree.path().join("scripts/bootstrap"),
    )
    .unwrap();
    let out = source_in_interactive_bash(tree.path());
    assert!(out.contains("sourced: 1\n"), "{out}");
    assert!(out.contains("shell: unchanged\n"), "{out}");
    assert!(out.contains("new variables: \n"), "{out}");
    assert!(out.contains("alive after a failing command\n"), "{out}");
}
