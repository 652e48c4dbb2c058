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
        (vec!["serve", "--help"], "--kubeconfig"),
        (vec!["serve", "--help"], "--webhook-cert"),
        (vec!["serve", "--help"], "--tenants-file"),
        (vec!["processor", "--help"], "--spec-path"),
        (vec!["crds", "--help"], "--out"),
        (vec!["queue", "--help"], "--data-dir"),
        (vec!["gateway", "--help"], "--control-plane"),
        (vec!["dev", "--help"], "--max-connections-per-client"),
        (vec!["dev", "--help"], "--max-dataflows"),
        (vec!["dev", "--help"], "--region"),
        (vec!["serve", "--help"], "--api-rate"),
        (vec!["gateway", "--help"], "--header-timeout"),
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

#[test]
fn serve_names_a_missing_kubeconfig() {
    let out = sless(&[
        "serve",
        "--redis-url",
        "redis://127.0.0.1:6379",
        "--kubeconfig",
        "/nonexistent/kubeconfig",
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("cannot read the kubeconfig /nonexistent/kubeconfig"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// A region goes into queue ARNs and ElasticMQ's configuration: only a
/// region's name is taken.
#[test]
fn a_region_that_is_no_regions_name_is_refused() {
    for command in [
        vec!["dev"],
        vec!["queue"],
        vec!["serve", "--redis-url", "redis://127.0.0.1:1"],
    ] {
        let mut args = command.clone();
        args.extend(["--region", "eu\"}\nx {"]);
        let out = sless(&args);
        assert!(!out.status.success(), "{args:?}");
        let text = String::from_utf8(out.stderr).unwrap();
        assert!(text.contains("a region's name is 1 to 32"), "{args:?}: {text}");
    }
}
