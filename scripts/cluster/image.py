#!/usr/bin/env python3
"""Builds the sless image from the project's Dockerfile without a registry
or a daemon, for the test cluster (`ctr images import`).

    image.py --name ghcr.io/kube5s/sless:test --out sless.tar [--cache DIR]

The Dockerfile stays the one description of the image; this reads it and
does what it says, where it can do so faithfully, and refuses otherwise:

- the runtime stage's `FROM debian:bookworm-slim` is a bookworm root
  filesystem made by Debian's debootstrap (`--variant=minbase`, cached),
  since no registry can be reached; its `RUN` lines run in a chroot of it
  (cache mounts dropped: they only speed a build), its `COPY`, `USER`,
  `ENTRYPOINT` and `CMD` are applied as written;
- the build stage (`FROM rust:<version>-bookworm`) runs on this machine,
  whose toolchain must be that same version: its `cargo build` command is
  run as written in the checkout, and its `install` of the binary gives
  what `COPY --from` takes. Any other instruction in it is refused.
  `--profile dev` runs no build and takes the binary from target/debug:
  the test suite has built that one already (with the workspace's
  features; `cargo build -p sless` alone would build much of it again),
  and a release build would add twenty minutes on two cores.
"""

import argparse
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
HERE = pathlib.Path(__file__).resolve().parent


def instructions(dockerfile):
    """(stage name, FROM image, [(instruction, argument)]) for each stage."""
    lines, current = [], ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        current += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            lines.append(current.strip())
            current = ""
    stages = []
    for line in lines:
        word, _, arg = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            parts = arg.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else str(len(stages))
            stages.append((name, parts[0], []))
        else:
            stages[-1][2].append((word, arg.strip()))
    return stages


def fail(message):
    sys.exit(f"image.py: {message}")


def build_stage(stage, profile):
    """Runs a `rust:<version>-bookworm` stage on this machine (its cargo
    profile `profile`); returns the files it installs, by their path in the
    stage."""
    name, base, steps = stage
    match = re.fullmatch(r"rust:([0-9.]+)-bookworm", base)
    if not match:
        fail(f"stage {name}: only rust:<version>-bookworm is run on this machine, not {base}")
    rustc = subprocess.run(["rustc", "--version"], capture_output=True, text=True, check=True).stdout
    if not rustc.startswith(f"rustc {match.group(1)}"):
        fail(f"stage {name} wants Rust {match.group(1)}; this machine has {rustc.strip()}")
    produced = {}
    for word, arg in steps:
        if word in ("WORKDIR", "COPY") or (word == "RUN" and "apt-get" in arg):
            # The checkout is the context; the build packages are
            # scripts/install-test-deps.sh's.
            continue
        if word != "RUN":
            fail(f"stage {name}: {word} is not run on this machine")
        command = re.sub(r"--mount=\S+\s*", "", arg)
        for part in command.split("&&"):
            words = shlex.split(part)
            if profile == "dev":
                words = [w.replace("target/release/", "target/debug/") for w in words]
            if words[:2] == ["cargo", "build"] and profile == "dev":
                if not (ROOT / "target" / "debug" / "sless").exists():
                    fail("target/debug/sless is missing: run `cargo build` first")
            elif words[:2] == ["cargo", "build"]:
                print(f"==> {' '.join(words)}", file=sys.stderr)
                subprocess.run(words, cwd=ROOT, check=True)
            elif words[:1] == ["install"]:
                source, target = words[-2], words[-1]
                produced[target] = ROOT / source
            else:
                fail(f"stage {name}: cannot run {part.strip()!r} here")
    return produced


def base_rootfs(cache):
    """A bookworm minbase root filesystem, made once."""
    rootfs = cache / "debian-bookworm-slim"
    if (rootfs / "etc" / "debian_version").exists():
        return rootfs
    if not shutil.which("debootstrap"):
        subprocess.run(["apt-get", "install", "-y", "-qq", "debootstrap"], check=True,
                       env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    # The mirror this machine's apt uses (a URIs or deb line, not a comment).
    mirror = "http://deb.debian.org/debian"
    for sources in [pathlib.Path("/etc/apt/sources.list"), *pathlib.Path("/etc/apt/sources.list.d").glob("*")]:
        text = sources.read_text() if sources.is_file() else ""
        found = re.search(r"^(?:URIs:|deb)\s+(https?://\S+/debian)/?\s*$", text, re.MULTILINE)
        if found:
            mirror = found.group(1)
            break
    partial = cache / "debian-bookworm-slim.partial"
    shutil.rmtree(partial, ignore_errors=True)
    print(f"==> debootstrap bookworm from {mirror}", file=sys.stderr)
    subprocess.run(["debootstrap", "--variant=minbase", "bookworm", str(partial), mirror], check=True,
                   stdout=subprocess.DEVNULL)
    partial.rename(rootfs)
    return rootfs


def run_in(rootfs, command):
    """Runs a RUN line in a chroot of `rootfs`, with /proc, /dev and the
    host's DNS, all let go after."""
    mounts = [(["-t", "proc", "proc"], "proc"), (["--bind", "/dev"], "dev"), (["--bind", "/dev/pts"], "dev/pts")]
    shutil.copy("/etc/resolv.conf", rootfs / "etc" / "resolv.conf")
    done = []
    try:
        for options, target in mounts:
            subprocess.run(["mount", *options, str(rootfs / target)], check=True)
            done.append(rootfs / target)
        subprocess.run(["chroot", str(rootfs), "/bin/sh", "-c", command], check=True,
                       env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                            "DEBIAN_FRONTEND": "noninteractive", "HOME": "/root"})
    finally:
        for target in reversed(done):
            subprocess.run(["umount", "-l", str(target)], check=False)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--dockerfile", default=str(ROOT / "Dockerfile"))
    p.add_argument("--cache", default=os.path.expanduser("~/.cache/sless/image"))
    p.add_argument("--profile", choices=["release", "dev"], default="release",
                   help="the cargo profile of the build stage (default: the Dockerfile's release)")
    a = p.parse_args()
    cache = pathlib.Path(a.cache)
    cache.mkdir(parents=True, exist_ok=True)
    stages = instructions(pathlib.Path(a.dockerfile))
    *builders, (name, base, steps) = stages
    if base != "debian:bookworm-slim":
        fail(f"the image's stage starts FROM {base}; only debian:bookworm-slim is assembled here")
    produced = {}
    for stage in builders:
        produced[stage[0]] = build_stage(stage, a.profile)
    work = cache / "rootfs"
    if work.exists():
        subprocess.run(["rm", "-rf", str(work)], check=True)
    subprocess.run(["cp", "-a", str(base_rootfs(cache)), str(work)], check=True)
    config = {"Entrypoint": None, "Cmd": None, "User": "", "Env": [], "WorkingDir": "/"}
    for word, arg in steps:
        if word == "RUN":
            run_in(work, re.sub(r"--mount=\S+\s*", "", arg))
        elif word == "COPY":
            words = shlex.split(arg)
            source_stage = next((w.split("=", 1)[1] for w in words if w.startswith("--from=")), None)
            source, target = [w for w in words if not w.startswith("--")][-2:]
            if source_stage is None or source not in produced.get(source_stage, {}):
                fail(f"COPY {arg}: only files a build stage installs are copied here")
            dest = work / target.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(produced[source_stage][source], dest)
        elif word in ("ENTRYPOINT", "CMD"):
            config["Entrypoint" if word == "ENTRYPOINT" else "Cmd"] = json.loads(arg)
        elif word == "USER":
            config["User"] = arg
        elif word == "ENV":
            key, _, value = arg.partition("=")
            config["Env"].append(f"{key}={value}")
        elif word == "WORKDIR":
            config["WorkingDir"] = arg
        else:
            fail(f"{word} is not applied here")
    # The image carries no apt lists or caches the RUN lines left.
    for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for entry in (work / leftover).glob("*"):
            if entry.is_file():
                entry.unlink()
    command = [sys.executable, str(HERE / "oci_image.py"), "--name", a.name, "--out", a.out,
               "--add-tree", f"{work}:/", "--user", config["User"], "--workdir", config["WorkingDir"]]
    for key in ("Entrypoint", "Cmd"):
        if config[key]:
            command += [f"--{key.lower()}={json.dumps(config[key])}"]
    for env in config["Env"]:
        command += ["--env", env]
    subprocess.run(command, check=True)


if __name__ == "__main__":
    main()
