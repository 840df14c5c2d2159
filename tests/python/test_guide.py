"""The user guide's code blocks, run: every ```c block of docs/GUIDE.md is
compiled against the built library with -Wall -Wextra -Werror and run; it must exit 0, or 77
for a skip whose reason it prints (reported as a skip, never a pass). Info strings:
  c               a whole program
  c fragment      statements, compiled and run inside a main() that includes <ember/ember.h>
  c launch=N      a whole program run as N processes by `ember launch -n N`
  c args=A B ...  a whole program run with arguments A B ..., each a path under the repository
                  (tests/data/models/gpt2: a model folder the program reads)
  c skip: WHY     not compiled; WHY is printed
  sh run          each line run with the built ember (a leading build/ember is replaced); exit 0
  sh norun: WHY   not run; WHY is printed
Any other block, or a c/sh block without one of these, fails the test: nothing is left out
silently. Every em_/EM_ name the guide mentions must be declared in include/ember/*.h.
The library and command: $EMBER_LIBRARY and $EMBER_TOOL (ctest sets them), else build/.
$EMBER_GUIDE_CFLAGS adds compiler flags: with EMBER_LIBRARY=build-asan/libember.so and
-fsanitize=address,undefined the blocks run under ASan/UBSan (leaks fail them)."""
import glob
import os
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
LIB = os.environ.get("EMBER_LIBRARY") or os.path.join(ROOT, "build", "libember.so")
TOOL = os.environ.get("EMBER_TOOL") or os.path.join(ROOT, "build", "ember")
GUIDES = [os.path.join(ROOT, "docs", "GUIDE.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "guide", "*.md")))
CC = os.environ.get("CC", "cc")
TIMEOUT = 240


def blocks(path):
    """(first line number, info string, text) of every fenced block in a Markdown file."""
    out, cur = [], None
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if cur is None:
                m = re.match(r"^```([^`]*)$", line.rstrip("\n"))  # (an info string has no backtick)
                if m:
                    cur = (n, m.group(1).strip(), [])
            elif line.rstrip("\n") == "```":
                out.append((cur[0], cur[1], "".join(cur[2])))
                cur = None
            else:
                cur[2].append(line)
    if cur is not None:
        raise SystemExit(f"{path}:{cur[0]}: a code block is never closed")
    return out


def header_names():
    text = "".join(open(h, encoding="utf-8").read() for h in glob.glob(os.path.join(ROOT, "include", "ember", "*.h")))
    return set(re.findall(r"\b(?:em|EM)_[A-Za-z0-9_]*[A-Za-z0-9]\b", text))


def run(cmd, **kw):
    env = dict(os.environ, POCL_DEVICES=os.environ.get("POCL_DEVICES", "pthread pthread"))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env, **kw)


def c_block(where, info, text, tmp):
    """Returns ("pass" | "skip" | "fail", message)."""
    launch = None
    args = []
    if info.startswith("c args="):
        args = [os.path.join(ROOT, a) for a in info.split("=", 1)[1].split()]
        if not args or not all(os.path.exists(a) for a in args):
            return "fail", f"'{info}': every argument must be a path under the repository"
    elif info == "c fragment":
        text = "#include <stdio.h>\n#include <ember/ember.h>\nint main(void) {\n" + text + "return em_failed() ? 1 : 0;\n}\n"
    elif info.startswith("c launch="):
        launch = info.split("=", 1)[1]
        if not launch.isdigit():
            return "fail", f"bad process count in '{info}'"
    elif info != "c":
        return "fail", f"unknown info string '{info}' (expected c, c fragment, c launch=N, c args=... or c skip: WHY)"
    src = os.path.join(tmp, "block.c")
    exe = os.path.join(tmp, "block")
    with open(src, "w") as f:
        f.write(text)
    libdir = os.path.dirname(os.path.realpath(LIB))
    extra = shlex.split(os.environ.get("EMBER_GUIDE_CFLAGS", ""))  # e.g. -fsanitize=address,undefined
    p = run([CC, "-std=c11", "-Wall", "-Wextra", "-Werror", *extra, "-I", os.path.join(ROOT, "include"), src,
             "-o", exe, "-L", libdir, "-l:" + os.path.basename(LIB), "-Wl,-rpath," + libdir, "-lm"])
    if p.returncode != 0:
        return "fail", "does not compile:\n" + p.stdout + p.stderr
    cmd = [exe, *args] if launch is None else [TOOL, "launch", "-n", launch, "--", exe]
    p = run(cmd, cwd=tmp)
    out = (p.stdout + p.stderr).strip()
    if p.returncode == 77 or (launch and p.returncode != 0 and "skip:" in out):
        return "skip", out.splitlines()[-1] if out else "(exit 77 with no reason printed)"
    if p.returncode != 0:
        return "fail", f"exit status {p.returncode}:\n{out}"
    return "pass", out.splitlines()[-1] if out else ""


def sh_block(where, info, text):
    if info != "sh run":
        return "fail", f"unknown info string '{info}' (expected sh run or sh norun: WHY)"
    last = ""
    for line in text.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if not line or line.startswith("#"):
            continue
        args = shlex.split(line)
        if args[0] != "build/ember":
            return "fail", f"'sh run' lines must start with build/ember: {line}"
        p = run([TOOL] + args[1:])
        if p.returncode != 0:
            return "fail", f"'{line}' exited {p.returncode}:\n{p.stdout}{p.stderr}"
        last = f"{line}: {len(p.stdout.splitlines())} lines"
    return "pass", last


TORCH_NAME = r"\btorch(?:\.[A-Za-z_][A-Za-z_0-9]*)+"


def seed_coverage(guide_text):
    """Every torch.X name of the seed programs (examples/seed_*.c quote them; the original
    seeds where $EMBER_SEEDS_DIR or /work/shared/seeds has them) must be in the guide."""
    sources = sorted(glob.glob(os.path.join(ROOT, "examples", "seed_*.c")))
    seeds_dir = os.environ.get("EMBER_SEEDS_DIR", "/work/shared/seeds")
    if os.path.isdir(seeds_dir):
        sources += sorted(glob.glob(os.path.join(seeds_dir, "*")))
    else:
        print(f"note: {seeds_dir} is missing; seed names checked from examples/seed_*.c only")
    names = set()
    for src in sources:
        names.update(re.findall(TORCH_NAME, open(src, encoding="utf-8", errors="replace").read()))
    missing = sorted(n for n in names if n not in guide_text)
    for n in missing:
        print(f"FAIL docs/GUIDE.md: {n} (used by a seed) is not in \"Coming from PyTorch\"")
    print(f"seed coverage: {len(names) - len(missing)} of {len(names)} torch names from {len(sources)} files")
    return len(missing)


def main():
    if not os.path.exists(LIB) or not os.path.exists(TOOL):
        print(f"skip: build the library and the command first ({LIB}, {TOOL})")
        return 77
    known = header_names()
    counts = {"pass": 0, "skip": 0, "fail": 0}
    for guide in GUIDES:
        rel = os.path.relpath(guide, ROOT)
        text = open(guide, encoding="utf-8").read()
        # Every em_/EM_ name in the guide must be declared somewhere in the public headers.
        for n, line in enumerate(text.splitlines(), 1):
            for name in re.findall(r"\b(?:em|EM)_[A-Za-z0-9_]*[A-Za-z0-9]\b", line):
                if name not in known:
                    print(f"FAIL {rel}:{n}: {name} is not declared in include/ember/*.h")
                    counts["fail"] += 1
        if guide == GUIDES[0]:
            counts["fail"] += seed_coverage(text)
        for line, info, body in blocks(guide):
            where = f"{rel}:{line}"
            m = re.match(r"^(c|sh) (skip|norun): (.+)$", info)
            if m:
                verdict, msg = "skip", m.group(3)
            elif info == "c" or info.startswith("c "):
                with tempfile.TemporaryDirectory(prefix="ember-guide-") as tmp:
                    verdict, msg = c_block(where, info, body, tmp)
            elif info.startswith("sh"):
                verdict, msg = sh_block(where, info, body)
            else:
                verdict, msg = "fail", f"a '{info}' block: the test runs c and sh blocks only; mark it or remove it"
            counts[verdict] += 1
            print(f"{verdict.upper()} {where} [{info}]: {msg}")
    print(f"guide: {counts['pass']} passed, {counts['skip']} skipped, {counts['fail']} failed")
    if counts["fail"]:
        return 1
    if counts["pass"] == 0:
        print("skip: no block ran")
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main())
