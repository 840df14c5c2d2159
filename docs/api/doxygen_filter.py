#!/usr/bin/env python3
"""Doxygen's input filter for include/ember/*.h (docs/api/Doxyfile). The headers document with
plain C comments; this marks them for doxygen on the fly, so the files stay as they are:
  - the file's first comment              ->  /** @file NAME ... */
  - a comment on lines of its own          ->  /** ... */    (documents what follows)
  - a comment after code on its line       ->  /**< ... */   (documents that member)
  - `int64_t hidden, layers; /* doc */`    ->  each declarator gets the comment
  - one-line banners such as /* ---- views ---- */ stay plain comments (they document nothing).
Comments written for doxygen already (/** or /*!) are left alone. Line numbers are kept."""
import os
import re
import sys

NAME = r"[A-Za-z_]\w*(?:\[[^\]]*\])?"
MULTI = re.compile(rf"((?:const\s+)?[A-Za-z_]\w*(?:\s+[A-Za-z_]\w*)*?)\s+({NAME}(?:\s*,\s*{NAME})+)\s*;(\s*)"
                   r"/\*(?![*!<])(.*?)\*/")
TRAILING = re.compile(r"/\*(?![*!<])")


def expand_multi(m):
    typ, names, _, doc = m.groups()
    return " ".join(f"{typ} {n.strip()}; /**<{doc}*/" for n in names.split(","))


def filter_text(path, text):
    out, seen_first, in_comment = [], False, False
    for line in text.split("\n"):
        if in_comment:  # the rest of a comment opened earlier
            out.append(line)
            in_comment = "*/" not in line
            continue
        m = re.match(r"^(\s*)/\*(?![*!])(.*)$", line)
        if m:  # a comment that starts its line
            indent, rest = m.groups()
            if not seen_first:
                line = f"{indent}/** @file {os.path.basename(path)} {rest.lstrip()}"
            elif not re.match(r"\s*-{2,}.*\*/\s*$", rest):  # a one-line banner documents nothing
                line = f"{indent}/**{rest}"
            seen_first = True
            in_comment = "*/" not in rest
            out.append(line)
            continue
        if re.match(r"^\s*(//|#\s*(?!define))", line) or line.rstrip().endswith("\\"):  # directives, macro bodies
            out.append(line)
            in_comment = line.count("/*") > line.count("*/")
            continue
        line = MULTI.sub(expand_multi, line)
        line = TRAILING.sub("/**<", line)
        in_comment = line.rfind("/*") > line.rfind("*/")
        out.append(line)
    return "\n".join(out)


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        sys.stdout.write(filter_text(sys.argv[1], f.read()))
