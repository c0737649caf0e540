#!/usr/bin/env python3
"""The layers of src/ point one way: fails, naming the file and line, when a source includes a header
from a layer above its own (or beside it), or writes an include relative to its folder.

The layer table comes from CMake (flashlab_layer in the top CMakeLists.txt), as NAME:DEP,DEP items, so
there is one list of layers. Folders of src/ that are not layers (cli) sit on top and may include any
layer. python/, viz/, tests/ and lessons/ sit on top too; every file there and in src/ must write its includes
without "../".

    check_layers.py --root REPO --layer core: --layer model:core ...   check the tree
    check_layers.py --self-test --layer ...                            plant an upward include in a copy
                                                                       of a small tree; it must be caught
"""
import argparse
import os
import re
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCE_SUFFIXES = (".hpp", ".cpp", ".h", ".cu", ".cuh")
TOP_FOLDERS = ("python", "viz", "tests", "lessons")


def closure(direct):
    """Every layer reachable downward from each layer, itself included."""
    reach = {}

    def visit(name):
        if name not in reach:
            reach[name] = {name}
            for dep in direct[name]:
                reach[name] |= visit(dep)
        return reach[name]

    for name in direct:
        visit(name)
    return reach


def parse_layers(items):
    direct = {}
    for item in items:
        name, _, deps = item.partition(":")
        direct[name] = [d for d in deps.split(",") if d]
    for name, deps in direct.items():
        for dep in deps:
            if dep not in direct:
                raise SystemExit(f"check_layers: layer {name} depends on {dep}, which is not in the table")
    return direct


def sources(folder):
    for dirpath, _, files in os.walk(folder):
        for f in sorted(files):
            if f.endswith(SOURCE_SUFFIXES):
                yield os.path.join(dirpath, f)


def problems_in(root, direct):
    """(path, line, message) for each include that breaks the rules."""
    reach = closure(direct)
    found = []
    src = os.path.join(root, "src")
    for folder in sorted(os.listdir(src)):
        if not os.path.isdir(os.path.join(src, folder)):
            continue
        for path in sources(os.path.join(src, folder)):
            text = open(path, encoding="utf-8").read()
            for m in INCLUDE.finditer(text):
                target = m.group(1)
                line = text.count("\n", 0, m.start()) + 1
                rel = os.path.relpath(path, root)
                first = target.split("/")[0]
                if target.startswith((".", "/")) or "/" not in target:
                    found.append((rel, line, f'includes "{target}": write includes from src/ '
                                             f'("{folder}/{os.path.basename(target)}"), never relative'))
                elif folder in direct and first in direct and first not in reach[folder]:
                    allowed = ", ".join(sorted(reach[folder]))
                    found.append((rel, line, f'layer {folder} includes "{target}" from layer {first}, '
                                             f"which is not below it (it may include: {allowed})"))
    for top in TOP_FOLDERS:
        if not os.path.isdir(os.path.join(root, top)):
            continue
        for path in sources(os.path.join(root, top)):
            text = open(path, encoding="utf-8").read()
            for m in INCLUDE.finditer(text):
                if m.group(1).startswith("../"):
                    line = text.count("\n", 0, m.start()) + 1
                    found.append((os.path.relpath(path, root), line,
                                  f'includes "{m.group(1)}": write includes from the folder\'s root, never "../"'))
    return found


def report(found):
    for rel, line, message in found:
        print(f"{rel}:{line}: {message}")


def self_test(direct):
    """A clean two-layer tree passes; the same tree with one upward include fails, naming the file."""
    lower = next(n for n, deps in direct.items() if not deps)
    upper = next(n for n, deps in direct.items() if lower in closure(direct)[n] and n != lower)
    with tempfile.TemporaryDirectory() as tmp:
        for layer in (lower, upper):
            os.makedirs(os.path.join(tmp, "src", layer))
        open(os.path.join(tmp, "src", lower, "base.hpp"), "w").write("#pragma once\n")
        open(os.path.join(tmp, "src", upper, "top.hpp"), "w").write(f'#include "{lower}/base.hpp"\n')
        clean = problems_in(tmp, direct)
        if clean:
            report(clean)
            print("self-test: FAILED: a tree whose includes all point down was reported")
            return 1
        planted = os.path.join(tmp, "src", lower, "planted.hpp")
        open(planted, "w").write(f'#pragma once\n#include "{upper}/top.hpp"\n')
        caught = problems_in(tmp, direct)
        report(caught)
        want = os.path.join("src", lower, "planted.hpp")
        if len(caught) != 1 or caught[0][0] != want or caught[0][1] != 2:
            print(f"self-test: FAILED: the upward include planted in {want} (line 2) was not reported as the one problem")
            return 1
    print(f"self-test: ok: the include of {upper}/ planted in {lower}/ was caught, naming the file")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
    ap.add_argument("--layer", action="append", required=True, help="NAME:DEP,DEP (direct dependencies)")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    direct = parse_layers(args.layer)
    if args.self_test:
        return self_test(direct)
    found = problems_in(os.path.abspath(args.root), direct)
    report(found)
    if found:
        print(f"check_layers: {len(found)} include(s) break the layer order (see docs/ARCHITECTURE.md)")
        return 1
    print(f"check_layers: every include under src/ points down ({', '.join(direct)}); none is relative")
    return 0


if __name__ == "__main__":
    sys.exit(main())
