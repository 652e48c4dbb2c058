//! The `sless` command line: help on every subcommand, clear start-up errors.

use std::process::Command;

fn sless(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sless")).args(args).output().unwrap()
}

#[test]
fn every_subcommand_has_help() {
    for (args, expect) in [
        (vec!["--help"], "dev"),
        (vec!["dev", "--help"], "--data-dir"),
        (vec!["serve", "--help"], "--redis-url"),
        (vec!["queue", "--help"], "--data-dir"),
        (vec!["gateway", "--help"], "--control-plane"),
    ] {
        let out = sless(&args);
        assert!(out.status.success(), "{args:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains(expect), "{args:?}: {text}");
    }
}

#[test]
fn bad_tenant_flag_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("sless-cli-{}", std::process::id()));
    let out = sless(&[
        "dev",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        dir.to_str().unwrap(),
        "--tenant",
        "acme=short",
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("at least 16 characters"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
