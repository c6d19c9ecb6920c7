#!/usr/bin/env python3
"""Checks the include rules between the stages of torchcompile (docs/architecture.md).

Every file of a stage -- src/<stage>/ and its public headers include/torchcompile/<stage>/ --
may include only files of its own stage or of a stage below it:

    support < ir < hooks < capture < backends < aot < repro < compile < runtime < frontend
    < distributed < tools

src/backends/ is the registry and the backend contract; the built-in backends (backends/<name>/,
at the top level) sit above the compile stage and below the runtime: a backend may use the
partitioner or aot_autograd, never the runtime or the frontend. Since an include may only point
down this order, there is no include cycle between folders either; the check also looks for one
directly, so that a cycle is named as such. Tests (test/, backends/<name>/tests/) reach what they
test through include directories, never through a relative path out of their folder ("../").

Usage: check_layering.py [--root DIR]     check the tree (exit 1 and one line per violation)
       check_layering.py --self-test      check that violations and cycles are caught
"""
import argparse
import os
import re
import shutil
import sys
import tempfile

ORDER = ["support", "ir", "hooks", "capture", "backends", "aot", "repro", "compile",
         "builtin-backends", "runtime", "frontend", "distributed", "tools"]
RANK = {stage: i for i, stage in enumerate(ORDER)}
# Public headers at the top of include/torchcompile/.
TOP_HEADERS = {"compat.h": "support", "torchcompile.h": "frontend"}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
SOURCE_EXT = (".h", ".hpp", ".cpp", ".cc", ".inc")


def stage_of_file(rel):
    """The stage of a repository file, or None for files the rules do not cover."""
    parts = rel.split("/")
    if parts[0] == "src" and len(parts) > 2:
        return parts[1] if parts[1] in RANK else None
    if parts[:2] == ["include", "torchcompile"]:
        if len(parts) == 3:
            return TOP_HEADERS.get(parts[2])
        return parts[2] if parts[2] in RANK else None
    if parts[0] == "backends" and len(parts) > 2 and parts[2] != "tests":
        return "builtin-backends"
    return None


def stage_of_include(path, quote, including_rel):
    """The stage an include names, or None (system and third-party headers)."""
    if quote == "<":
        if not path.startswith("torchcompile/"):
            return None
        rest = path[len("torchcompile/"):].split("/")
        if len(rest) == 1:
            return TOP_HEADERS.get(rest[0], "unknown:" + path)
        return rest[0] if rest[0] in RANK else "unknown:" + path
    first = path.split("/")[0]
    if "/" in path and first in RANK:
        return first  # "runtime/guards.h": relative to src/
    # Relative to the including file's folder: the same stage.
    return stage_of_file(including_rel)


def scan(root):
    """(file, stage, include, included stage) for every include of a covered file."""
    found = []
    for top in ("src", "include", "backends"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(SOURCE_EXT):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                stage = stage_of_file(rel)
                if stage is None:
                    continue
                with open(full, encoding="utf-8", errors="replace") as f:
                    text = f.read()
                for m in INCLUDE.finditer(text):
                    target = stage_of_include(m.group(2), m.group(1), rel)
                    if target is not None:
                        found.append((rel, stage, m.group(2), target))
    return found


def relative_test_includes(root):
    """(test file, include) for every include of a test file that climbs out with '../'."""
    found = []
    for top in ("test", "backends"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
            if top == "backends" and "/tests" not in rel_dir + "/":
                continue
            for name in sorted(files):
                if not name.endswith(SOURCE_EXT):
                    continue
                with open(os.path.join(dirpath, name), encoding="utf-8", errors="replace") as f:
                    for m in INCLUDE.finditer(f.read()):
                        if m.group(2).startswith("../") or "/../" in m.group(2):
                            found.append((rel_dir + "/" + name, m.group(2)))
    return found


def find_cycle(edges):
    """A cycle in the folder graph {a: {b, ...}} as a list of folders, or None."""
    state = {}
    stack = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if state.get(nxt) is None:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if state.get(node) is None:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def check(root):
    problems = []
    edges = {}
    for rel, stage, path, target in scan(root):
        if target.startswith("unknown:"):
            problems.append(f"{rel}: includes {path}, which belongs to no stage")
            continue
        if target != stage:
            edges.setdefault(stage, set()).add(target)
        if RANK[target] > RANK[stage]:
            problems.append(f"{rel}: includes {path}: stage '{stage}' may not include the higher stage '{target}'")
    for rel, path in relative_test_includes(root):
        problems.append(f"{rel}: includes {path}: a test reaches code through an include directory, not '../'")
    cycle = find_cycle(edges)
    if cycle:
        problems.append("include cycle between folders: " + " -> ".join(cycle))
    return problems


def self_test():
    """The checker fails on a violating include and on a cycle, and passes a clean tree."""
    failures = []

    def tree(files):
        root = tempfile.mkdtemp(prefix="layering-")
        for rel, text in files.items():
            os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(root, rel), "w") as f:
                f.write(text)
        return root

    cases = [
        ("clean", {"src/ir/graph.cpp": '#include <torchcompile/ir/graph.h>\n#include "text_internal.h"\n',
                   "src/runtime/guards.cpp": '#include "runtime/guards.h"\n#include "compile/pipeline.h"\n',
                   "backends/fused/fused.cpp": '#include <torchcompile/compile/partitioner.h>\n'}, False),
        ("ir includes runtime", {"src/ir/graph.cpp": '#include "runtime/call_state.h"\n'}, True),
        ("registry includes compile", {"src/backends/registry.cpp": '#include "compile/pipeline.h"\n'}, True),
        ("compile includes runtime", {"src/compile/pipeline.cpp": '#include <torchcompile/runtime/compiled_function.h>\n'}, True),
        ("public ir header includes a backends header",
         {"include/torchcompile/ir/graph.h": '#include <torchcompile/backends/registry.h>\n'}, True),
        ("a backend includes the runtime", {"backends/onednn/x.cpp": '#include <torchcompile/runtime/explain_output.h>\n'}, True),
        ("a test climbs out of its folder",
         {"backends/onednn/tests/test_x.cpp": '#include "../../../backends/onednn/onednn_backend.h"\n'}, True),
        ("unknown public header", {"src/ir/graph.cpp": '#include <torchcompile/nowhere.h>\n'}, True),
    ]
    for name, files, should_fail in cases:
        root = tree(files)
        try:
            problems = check(root)
        finally:
            shutil.rmtree(root)
        if bool(problems) != should_fail:
            failures.append(f"self-test '{name}': expected {'violations' if should_fail else 'none'}, got {problems}")
    if find_cycle({"compile": {"repro"}, "repro": {"compile"}}) is None:
        failures.append("self-test: a two-folder cycle was not found")
    if find_cycle({"runtime": {"compile"}, "compile": {"ir"}}) is not None:
        failures.append("self-test: a cycle was reported in an acyclic graph")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    problems = self_test() if args.self_test else check(os.path.abspath(args.root))
    for p in problems:
        print(p)
    if problems:
        print(f"check_layering: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print("check_layering: " + ("self-test passed" if args.self_test else "every include points down the stage order"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
