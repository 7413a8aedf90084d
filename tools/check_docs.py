#!/usr/bin/env python3
"""Checks the documentation: README.md and every Markdown file under docs/.

1. Links: every relative link and image (`[text](path)`, `![alt](path)`,
   `<img src=...>`, `<a href=...>`) must name a file or directory of the
   repository, and a `#anchor` must name a heading (GitHub's slug) or an
   explicit `id`/`name` of the Markdown file it points into. Links with a
   scheme (https:, mailto:) are not fetched.
2. Runnable blocks: every fenced code block whose info string is
   `sh runnable` (```` ```sh runnable ````) is run with bash (`set -e -o
   pipefail`). A page's blocks run in order, in one fresh temporary
   directory, as a reader following the page would: every top-level entry of
   the repository except .git and build* is linked into it (so `samples/...`
   resolves), files the blocks write stay there, and the directory holding
   `reshard` is first on PATH (build/reshard, or RESHARD_BIN). A block that
   exits non-zero or runs past --timeout fails the check.

README.md must hold at least one runnable block (the five-minute path).

  tools/check_docs.py                 links and runnable blocks of all pages
  tools/check_docs.py --links-only    links only (no binary needed)
  tools/check_docs.py docs/cli.md     one page
Exit status: 0 all good, 1 a broken link or a failing block (each listed).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Set, Tuple

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
RUNNABLE = "runnable"
FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})(.*)$")


@dataclass
class Block:
    path: str  # relative to ROOT
    line: int  # 1-based line of the opening fence
    info: str
    text: str


def pages(args: List[str]) -> List[str]:
    if args:
        return [os.path.relpath(os.path.abspath(a), ROOT) for a in args]
    out = ["README.md"]
    for d, _, files in sorted(os.walk(os.path.join(ROOT, "docs"))):
        out += sorted(os.path.relpath(os.path.join(d, f), ROOT) for f in files if f.endswith(".md"))
    return out


def split(text: str, path: str) -> Tuple[List[Tuple[int, str]], List[Block]]:
    """The page's lines outside fenced blocks (with their numbers), and its blocks."""
    prose: List[Tuple[int, str]] = []
    blocks: List[Block] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        marker, info = m.group(2), m.group(3).strip()
        body: List[str] = []
        j = i + 1
        while j < len(lines):
            c = FENCE.match(lines[j])
            if c and c.group(2)[0] == marker[0] and len(c.group(2)) >= len(marker) and not c.group(3).strip():
                break
            body.append(lines[j])
            j += 1
        blocks.append(Block(path, i + 1, info, "\n".join(body) + "\n"))
        i = j + 1
    return prose, blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text in lower case, every
    character but letters, digits, spaces, '-' and '_' removed, spaces as '-'."""
    h = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    h = re.sub(r"<[^>]+>", "", h)  # inline HTML
    h = h.strip().lower()
    h = "".join(c for c in h if c.isalnum() or c in " -_")
    return h.replace(" ", "-")


_anchor_cache: Dict[str, Set[str]] = {}


def anchors(path: str) -> Set[str]:
    """Every anchor a Markdown file defines: its headings' slugs (duplicates
    numbered -1, -2, ... as GitHub does) and explicit id= / name= attributes."""
    if path in _anchor_cache:
        return _anchor_cache[path]
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        prose, _ = split(f.read(), path)
    seen: Dict[str, int] = {}
    out: Set[str] = set()
    for _, line in prose:
        m = re.match(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(2))
            n = seen.get(s, 0)
            out.add(s if n == 0 else f"{s}-{n}")
            seen[s] = n + 1
        for a in re.findall(r"""\b(?:id|name)=["']([^"']+)["']""", line):
            out.add(a)
    _anchor_cache[path] = out
    return out


LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_REF = re.compile(r"""<(?:a|img)\b[^>]*\b(?:href|src)=["']([^"']+)["']""")


def check_links(path: str) -> List[str]:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        prose, _ = split(f.read(), path)
    problems = []
    for number, line in prose:
        if line.startswith("    ") and not line.lstrip().startswith(("-", "*", "|")):
            continue  # an indented code block
        text = re.sub(r"(`+)(.+?)\1", "code", line)  # inline code is not a link
        for target in LINK.findall(text) + HTML_REF.findall(text):
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                continue  # https:, mailto:, ...
            file, _, anchor = target.partition("#")
            where = f"{path}:{number}: link '{target}'"
            if file:
                resolved = os.path.normpath(os.path.join(os.path.dirname(path), file))
                if resolved.startswith(".."):
                    problems.append(f"{where}: leaves the repository")
                    continue
                if not os.path.exists(os.path.join(ROOT, resolved)):
                    problems.append(f"{where}: {resolved} does not exist")
                    continue
            else:
                resolved = path
            if anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
                close = sorted(a for a in anchors(resolved) if a[:4] == anchor[:4])[:3]
                hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
                problems.append(f"{where}: {resolved} has no heading or id '{anchor}'{hint}")
    return problems


def runnable(block: Block) -> bool:
    words = block.info.split()
    return len(words) >= 2 and words[0] in ("sh", "bash", "console") and RUNNABLE in words[1:]


def workdir() -> str:
    d = tempfile.mkdtemp(prefix="reshard-docs-")
    for name in sorted(os.listdir(ROOT)):
        if name == ".git" or name.startswith("build"):
            continue
        os.symlink(os.path.join(ROOT, name), os.path.join(d, name))
    return d


def bin_dir() -> Tuple[str, Optional[str]]:
    """A directory whose `reshard` is the binary to test (and a temporary
    directory to remove, where one was made)."""
    binary = os.environ.get("RESHARD_BIN", os.path.join(ROOT, "build", "reshard"))
    binary = os.path.abspath(binary)
    if not os.access(binary, os.X_OK):
        sys.exit(f"check_docs: {binary} is missing: build first (ninja -C build reshard) or set RESHARD_BIN")
    if os.path.basename(binary) == "reshard":
        return os.path.dirname(binary), None
    d = tempfile.mkdtemp(prefix="reshard-bin-")
    os.symlink(binary, os.path.join(d, "reshard"))
    return d, d


def run_blocks(path: str, blocks: List[Block], path_dir: str, timeout: float, verbose: bool) -> List[str]:
    problems = []
    d = workdir()
    env = dict(os.environ, PATH=path_dir + os.pathsep + os.environ.get("PATH", ""))
    try:
        for b in blocks:
            start = time.monotonic()
            # A session of its own, so that a timeout ends the block's children too
            # (reshard run forks a process per rank).
            p = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", b.text], cwd=d, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                raw, _ = p.communicate(timeout=timeout)
                rc = p.returncode
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                raw, _ = p.communicate()
                rc = None
            out = raw.decode("utf-8", "replace")
            took = time.monotonic() - start
            if verbose:
                print(f"  {path}:{b.line}: {'ok' if rc == 0 else 'FAILED'} in {took:.1f} s")
            if rc != 0:
                why = f"timed out after {timeout:.0f} s" if rc is None else f"exited with status {rc}"
                tail = "\n".join("      " + l for l in out.rstrip("\n").split("\n")[-25:])
                problems.append(f"{path}:{b.line}: runnable block {why}:\n{textwrap_block(b.text)}    output:\n{tail}")
                break  # later blocks of the page build on this one
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return problems


def textwrap_block(text: str) -> str:
    return "".join("      $ " + l + "\n" if i == 0 or not l.startswith(" ") else "        " + l + "\n"
                   for i, l in enumerate(text.rstrip("\n").split("\n")))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pages", nargs="*", help="Markdown files (default: README.md and docs/**/*.md)")
    ap.add_argument("--links-only", action="store_true", help="check links only; run no block")
    ap.add_argument("--timeout", type=float, default=120, help="seconds a block may run (default 120)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every block's result and time")
    args = ap.parse_args()

    problems: List[str] = []
    todo: List[Tuple[str, List[Block]]] = []
    count = 0
    for path in pages(args.pages):
        if not os.path.isfile(os.path.join(ROOT, path)):
            problems.append(f"{path}: no such file")
            continue
        problems += check_links(path)
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            _, blocks = split(f.read(), path)
        mine = [b for b in blocks if runnable(b)]
        if path == "README.md" and not mine:
            problems.append("README.md: no runnable block (```sh runnable): the five-minute path must be checked")
        if mine:
            todo.append((path, mine))
            count += len(mine)

    if not args.links_only and todo:
        path_dir, made = bin_dir()
        try:
            for path, blocks in todo:
                problems += run_blocks(path, blocks, path_dir, args.timeout, args.verbose)
        finally:
            if made:
                shutil.rmtree(made, ignore_errors=True)

    for p in problems:
        print(p)
    ran = "" if args.links_only else f", {count} runnable blocks run"
    print(f"check_docs: {len(pages(args.pages))} pages{ran}: "
          f"{'ok' if not problems else str(len(problems)) + ' problems'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
