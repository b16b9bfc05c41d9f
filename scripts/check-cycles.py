#!/usr/bin/env python3
"""Reports dependency cycles between the modules of the crate (and of each binary).

A module is one file (src/a/b.rs or src/a/b/mod.rs is `a::b`). Module X depends
on Y when X's code names a path into Y: `use crate::...`, `use super::...`, or
an inline `crate::y::item`; a name that a module only re-exports (`pub use`) is
followed to the module that defines it, so `crate::backend::cuda::CudaDevice`
depends on `backend::cuda::context`, not on `backend::cuda` itself. Comments
and `mod tests` blocks are ignored (test code may reach anywhere).

Two graphs are checked: modules, and top-level folders (`device`, `backend`,
`nn`, ...; each file directly under src/ is its own). A cycle in either is
printed and fails the script, except the cycles in KNOWN (printed as known:
they belong to work in progress elsewhere; remove an entry once it is broken).
Usage: scripts/check-cycles.py [SRC_DIR]
"""

import os
import re
import sys

PATH_RE = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_RE = re.compile(r"\b(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.S)


# Cycles tolerated for now, as the sorted member names this script prints. Only
# module-level cycles inside one folder may be here (the CPU cast dispatch picks
# an instruction set after a self-check that calls back into the dispatch); an
# entry that no longer occurs fails the script, so the list cannot go stale.
KNOWN = {
    ("convert::dispatch", "convert::isa", "convert::self_check"),
}


def strip_comments(text):
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def strip_test_modules(text):
    """Drops `#[cfg(test)] mod NAME { ... }` blocks (brace-matched)."""
    out, i = [], 0
    pattern = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")
    while True:
        m = pattern.search(text, i)
        if not m:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i : m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j


def expand_use_tree(tree):
    """`a::{b, c::{d, e as f}}` -> ['a::b', 'a::c::d', 'a::c::e']."""
    tree = re.sub(r"\s+as\s+\w+", "", tree)
    tree = re.sub(r"\s+", "", tree)

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += {"{": 1, "}": -1}.get(ch, 0)
            cur += ch
        if cur:
            parts.append(cur)
        return parts

    def walk(prefix, s):
        if "{" in s and s.endswith("}"):
            head, inner = s.split("{", 1)
            head = head.rstrip(":")
            base = f"{prefix}::{head}" if prefix and head else (prefix or head)
            result = []
            for part in split_top(inner[:-1]):
                result += walk(base, part)
            return result
        if s == "self":
            return [prefix]
        return [f"{prefix}::{s}" if prefix else s]

    return walk("", tree)


class Crate:
    def __init__(self, root_file):
        self.root_dir = os.path.dirname(root_file)
        self.modules = {}  # module path (tuple) -> file
        self.collect(root_file, ())
        self.reexports = {m: {} for m in self.modules}  # module -> name -> absolute path
        self.texts = {}
        for m, f in self.modules.items():
            with open(f) as fh:
                self.texts[m] = strip_test_modules(strip_comments(fh.read()))
        for m, text in self.texts.items():
            for vis, tree in USE_RE.findall(text):
                if not vis.startswith("pub"):
                    continue
                for p in expand_use_tree(tree):
                    absolute = self.absolute(m, p.split("::"))
                    if absolute:
                        self.reexports[m][absolute[-1]] = absolute

    def collect(self, file, path):
        self.modules[path] = file
        with open(file) as fh:
            text = strip_comments(fh.read())
        here = os.path.dirname(file)
        is_dir_module = os.path.basename(file) in ("mod.rs", "lib.rs", "main.rs")
        base = here if is_dir_module else os.path.join(here, os.path.splitext(os.path.basename(file))[0])
        # Test-only file modules (`#[cfg(test)] mod name;`) are skipped like inline test modules:
        # tests may use any part of the crate.
        text = re.sub(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*;", "", text)
        for name in re.findall(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;", text, re.M):
            for cand in (os.path.join(base, name + ".rs"), os.path.join(base, name, "mod.rs")):
                if os.path.exists(cand):
                    self.collect(cand, path + (name,))
                    break

    def absolute(self, module, segments):
        """A `crate::` / `super::` / `self::` / child-module path as an absolute tuple, None for external crates."""
        if not segments:
            return None
        head, rest = segments[0], segments[1:]
        if head == "crate":
            return tuple(rest)
        if head == "self":
            return module + tuple(rest)
        if head == "super":
            up = module[:-1]
            while rest and rest[0] == "super":
                up, rest = up[:-1], rest[1:]
            return up + tuple(rest)
        if module + (head,) in self.modules:  # `use child::item` (a path relative to this module)
            return module + tuple(segments)
        return None

    def resolve(self, path, depth=0):
        """The module that defines what `path` names (following re-exports)."""
        for cut in range(len(path), -1, -1):
            prefix = path[:cut]
            if prefix in self.modules:
                if cut < len(path) and depth < 8:
                    target = self.reexports[prefix].get(path[cut])
                    if target and target != path:
                        return self.resolve(target + path[cut + 1 :], depth + 1)
                return prefix
        return ()

    def edges(self):
        graph = {m: set() for m in self.modules}
        for m, text in self.texts.items():
            names = []
            for _, tree in USE_RE.findall(text):
                names += [p.split("::") for p in expand_use_tree(tree)]
            names += [[h] + t.split("::")[1:] for h, t in PATH_RE.findall(text)]
            for segs in names:
                absolute = self.absolute(m, segs)
                if absolute is None:
                    continue
                target = self.resolve(absolute)
                # A module naming its ancestors is Rust's tree, not a dependency; naming a
                # descendant counts only for a re-export (whoever uses it depends on it).
                if target == () or target == m or target == m[: len(target)]:
                    continue
                if target[: len(m)] != m or target in self.reexports[m].values() or any(
                    v[: len(target)] == target for v in self.reexports[m].values()
                ):
                    graph[m].add(target)
        return graph


def cycles(graph):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def name(module):
    return "::".join(module) or "crate"


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "src")
    roots = [os.path.join(src, "lib.rs")]
    bin_dir = os.path.join(src, "bin")
    if os.path.isdir(bin_dir):
        for entry in sorted(os.listdir(bin_dir)):
            main_rs = os.path.join(bin_dir, entry, "main.rs")
            if os.path.exists(main_rs):
                roots.append(main_rs)
    failed = False
    seen = set()
    for root in roots:
        crate = Crate(root)
        graph = crate.edges()
        label = os.path.relpath(root, src)
        folders = {}
        for m, targets in graph.items():
            for t in targets:
                a, b = m[:1], t[:1]
                if a and b and a != b:
                    folders.setdefault(a, set()).add(b)
        for kind, g in (("module", graph), ("top-level folder", folders)):
            for comp in cycles(g):
                members = set(comp)
                links = [f"{name(a)} -> {name(b)}" for a in comp for b in sorted(g.get(a, ())) if b in members]
                members = tuple(name(m) for m in comp)
                seen.add(members)
                known = members in KNOWN
                failed |= not known
                print(f"check-cycles: {label}: {'known ' if known else ''}{kind} cycle: " + "; ".join(links))
        print(f"check-cycles: {label}: {len(graph)} modules, {sum(map(len, graph.values()))} dependencies")
    stale = KNOWN - seen
    for entry in sorted(stale):
        print(f"check-cycles: known cycle no longer occurs, remove it from KNOWN: {entry}")
    if failed or stale:
        sys.exit(1)
    print("check-cycles: ok: no cycles")


if __name__ == "__main__":
    main()
