#!/usr/bin/env python3
"""Assembles an OCI image archive from local files, for the test cluster's
containerd (`ctr images import`), which can reach no registry: no daemon,
no base image, one layer.

    oci_image.py --name registry.k8s.io/pause:3.10.1 --out pause.tar \
        --add /tmp/pause:/pause --entrypoint '["/pause"]' [--user 65535:65535]
        [--cmd '["--help"]'] [--add-tree DIR:/] [--env K=V] [--workdir /]

`--add SRC:DEST` puts one file (mode kept), `--add-tree DIR:DEST` a whole
directory tree. Owners are root unless --owner UID:GID is given.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import tarfile
import time


def layer(adds, trees, owner):
    """The layer as an uncompressed tar, in memory."""
    uid, gid = owner
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        made = set()

        def parents(path):
            parts = path.strip("/").split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in made:
                    info = tarfile.TarInfo(d)
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    info.mtime = 0
                    tar.addfile(info)
                    made.add(d)

        def owned(info):
            info.uid, info.gid, info.uname, info.gname, info.mtime = uid, gid, "", "", 0
            return info

        for src, dest in adds:
            parents(dest)
            tar.add(src, arcname=dest.strip("/"), recursive=False, filter=owned)
        for src, dest in trees:
            base = dest.strip("/")
            if base:
                parents(dest + "/x")
            for root, dirs, files in os.walk(src):
                dirs.sort()
                rel = os.path.relpath(root, src)
                arc_root = base if rel == "." else os.path.join(base, rel) if base else rel
                if arc_root and arc_root not in made:
                    tar.add(root, arcname=arc_root, recursive=False, filter=owned)
                    made.add(arc_root)
                for name in sorted(files) + sorted(d for d in dirs if os.path.islink(os.path.join(root, d))):
                    path = os.path.join(root, name)
                    tar.add(path, arcname=os.path.join(arc_root, name) if arc_root else name,
                            recursive=False, filter=owned)
    return buf.getvalue()


def blob(tar, data, media):
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))
    return {"mediaType": media, "digest": f"sha256:{digest}", "size": len(data)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--add", action="append", default=[])
    p.add_argument("--add-tree", action="append", default=[])
    p.add_argument("--entrypoint", type=json.loads, default=None, help="a JSON list")
    p.add_argument("--cmd", type=json.loads, default=None, help="a JSON list")
    p.add_argument("--env", action="append", default=["PATH=/usr/local/bin:/usr/bin:/bin"])
    p.add_argument("--user", default="")
    p.add_argument("--workdir", default="/")
    p.add_argument("--owner", default="0:0")
    a = p.parse_args()
    pairs = lambda items: [tuple(i.split(":", 1)) for i in items]
    owner = tuple(int(x) for x in a.owner.split(":"))
    raw = layer(pairs(a.add), pairs(a.add_tree), owner)
    diff_id = "sha256:" + hashlib.sha256(raw).hexdigest()
    packed = gzip.compress(raw, mtime=0)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(0)),
        "config": {"Env": a.env, "Entrypoint": a.entrypoint, "Cmd": a.cmd, "User": a.user,
                   "WorkingDir": a.workdir},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    with tarfile.open(a.out, "w") as tar:
        layer_desc = blob(tar, packed, "application/vnd.oci.image.layer.v1.tar+gzip")
        config_desc = blob(tar, json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json")
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": config_desc, "layers": [layer_desc]}
        manifest_desc = blob(tar, json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
        manifest_desc["annotations"] = {"io.containerd.image.name": a.name,
                                        "org.opencontainers.image.ref.name": a.name.rsplit(":", 1)[-1]}
        manifest_desc["platform"] = {"architecture": "amd64", "os": "linux"}
        for name, data in (("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
                           ("index.json", json.dumps({"schemaVersion": 2, "manifests": [manifest_desc]}).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))


if __name__ == "__main__":
    main()
