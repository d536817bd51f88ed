#!/usr/bin/env python3
"""The README's first command needs nothing but a Rust toolchain.

`cargo run --example quickstart`, run from the workspace root, resolves
features across every workspace member (a virtual workspace selects them
all, dev-dependencies included, because examples may use them), so one
member asking for Diesel's `PgConnection` would make the quickstart link
libpq. This check reads that very resolution (`cargo metadata` resolves the
same way) and walks what the quickstart's package builds; then it does the
same for the facade crate with default features, as a user's project
depending on `outbox` would build it. Any crate on those graphs that links
a native library (its manifest's `links` key) fails the check, unless it
compiles that library from source bundled in the crate with nothing but a
C compiler (ALLOWED below): no system package, no server.

Exit 0 and one line per graph when clean; exit 1 naming each offending
crate and the path that pulls it in.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

# Crates with a `links` key that compile their native code from sources
# they carry, so a Rust toolchain (with its C compiler) is enough. The
# value says which resolved feature makes it so (None: always).
ALLOWED = {
    "libsqlite3-sys": "bundled",  # SQLite's amalgamation, built by cc
    "ring": None,  # its own C and assembly, built by cc
}


def cargo(*args):
    run = subprocess.run(["cargo", *args], capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"cargo {' '.join(args)} failed:\n{run.stderr}")
    return run.stdout


def host():
    for line in subprocess.run(["rustc", "-vV"], check=True, capture_output=True, text=True).stdout.splitlines():
        if line.startswith("host: "):
            return line.split(": ", 1)[1]
    raise SystemExit("rustc -vV printed no host")


def graph(metadata):
    packages = {p["id"]: p for p in metadata["packages"]}
    nodes = {n["id"]: n for n in metadata["resolve"]["nodes"]}
    return packages, nodes


def reachable(packages, nodes, root, root_kinds):
    """Package ids `root` builds: its edges of `root_kinds`, then the
    normal and build edges of everything below (a dependency's
    dev-dependencies are never built). Returns {id: parent id}."""
    parent = {root: None}
    stack = [root]
    while stack:
        here = stack.pop()
        kinds = root_kinds if here == root else {None, "build"}
        for dep in nodes[here]["deps"]:
            if not any(k["kind"] in kinds for k in dep["dep_kinds"]):
                continue
            if dep["pkg"] not in parent:
                parent[dep["pkg"]] = here
                stack.append(dep["pkg"])
    return parent


def offenders(packages, nodes, parent):
    found = []
    for pkg_id in parent:
        package = packages[pkg_id]
        if not package.get("links"):
            continue
        name = package["name"]
        if name in ALLOWED:
            needed = ALLOWED[name]
            if needed is None or needed in nodes[pkg_id]["features"]:
                continue
        chain, at = [], pkg_id
        while at is not None:
            chain.append(packages[at]["name"])
            at = parent[at]
        found.append(f"{name} (links {package['links']}): {' <- '.join(chain)}")
    return sorted(found)


def check(label, metadata, root_name, root_kinds):
    packages, nodes = graph(metadata)
    roots = [i for i in metadata["workspace_members"] if packages[i]["name"] == root_name]
    if len(roots) != 1:
        raise SystemExit(f"{label}: no workspace member named {root_name}")
    parent = reachable(packages, nodes, roots[0], root_kinds)
    bad = offenders(packages, nodes, parent)
    if bad:
        print(f"FAIL {label}: crates that link a native library the machine must provide:")
        for line in bad:
            print(f"  {line}")
        return False
    native = sorted(packages[i]["name"] for i in parent if packages[i].get("links"))
    print(f"ok   {label}: {len(parent)} crates, none needs a system library"
          f" (native code built from bundled sources: {', '.join(native) or 'none'})")
    return True


def facade_as_a_dependency(target):
    """`cargo metadata` of a throwaway project whose one dependency is the
    facade with default features: its graph is what a user's build gets."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory(prefix="outbox-bare-") as project:
        with open(os.path.join(project, "Cargo.toml"), "w") as manifest:
            manifest.write(
                '[package]\nname = "facade-user"\nversion = "0.0.0"\nedition = "2021"\n'
                f'[dependencies]\noutbox = {{ path = {json.dumps(os.path.join(root, "outbox"))} }}\n'
                "[workspace]\n")
        os.makedirs(os.path.join(project, "src"))
        open(os.path.join(project, "src", "lib.rs"), "w").close()
        # The workspace's lock file: the same versions the workspace tests.
        shutil.copy(os.path.join(root, "Cargo.lock"), project)
        return json.loads(cargo("metadata", "--format-version", "1", "--filter-platform", target,
                                "--manifest-path", os.path.join(project, "Cargo.toml")))


def main():
    target = host()
    # The quickstart: the whole workspace's resolution, as `cargo run
    # --example quickstart` from the root resolves it.
    workspace = json.loads(cargo("metadata", "--format-version", "1", "--filter-platform", target))
    ok = check("cargo run --example quickstart", workspace, "outbox-examples",
               {None, "build", "dev"})
    ok &= check("a project depending on `outbox` (default features)",
                facade_as_a_dependency(target), "facade-user", {None, "build"})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
