#!/usr/bin/env python3
"""Lists C functions longer than N lines, so that the count is reproducible.

    scripts/long-functions.py [--min N] [PATH ...]     default: --min 150, src/

A function is a top-level brace block whose opening line ends a declarator "name(...)", whatever
its return type (`static enum MHD_Result completions(...)` counts); struct/enum/union bodies and
`= {` initialisers are not functions. Its length counts lines from the line of its name to the line
of its closing brace. Comments, strings and character literals are skipped when matching braces.
Prints "lines  file:line  name", longest first, then the count.
"""
import os
import re
import sys


def strip_code(text):
    """Returns text with comments, strings and char literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + re.sub(r"[^\n]", " ", text[i + 1:j - 1]) + c if j - i >= 2 else text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def blank_attributes(head):
    """head with every __attribute__((...)) blanked (balanced parentheses), so that the declarator
    "name(...)" is what NAME finds in "__attribute__((target("avx2"))) static void f(...)"."""
    out = head
    for m in re.finditer(r"__attribute__\s*\(", head):
        depth, j = 0, m.end() - 1
        while j < len(head):
            depth += {"(": 1, ")": -1}.get(head[j], 0)
            j += 1
            if depth == 0:
                break
        out = out[:m.start()] + " " * (j - m.start()) + out[j:]
    return out


NAME = re.compile(r"([A-Za-z_]\w*)\s*\([^;{}]*\)\s*$", re.S)


def functions(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        code = strip_code(f.read())
    depth, start, head_begin = 0, None, 0
    for m in re.finditer(r"[{};]", code):
        ch, pos = m.group(), m.start()
        if ch == "{":
            if depth == 0:
                head = blank_attributes(code[head_begin:pos])
                fm = NAME.search(head.rstrip())
                # A declarator "name(...)" names a function, whatever its return type (an enum or a
                # struct too); "= {" is data.
                if fm and "=" not in head.split("(")[0]:
                    start = (fm.group(1), code.count("\n", 0, head_begin + fm.start(1)) + 1)
                else:
                    start = None
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                if start:
                    end_line = code.count("\n", 0, pos) + 1
                    yield start[0], start[1], end_line - start[1] + 1
                start = None
                head_begin = pos + 1
        elif depth == 0:
            head_begin = pos + 1


def main(argv):
    minimum, paths = 150, []
    i = 0
    while i < len(argv):
        if argv[i] == "--min" and i + 1 < len(argv):
            minimum = int(argv[i + 1])
            i += 2
            continue
        paths.append(argv[i])
        i += 1
    files = []
    for p in paths or ["src"]:
        if os.path.isdir(p):
            for root, _, names in os.walk(p):
                files += [os.path.join(root, x) for x in names if x.endswith(".c")]
        else:
            files.append(p)
    rows = []
    for f in sorted(files):
        for name, line, n in functions(f):
            if n > minimum:
                rows.append((n, f"{f}:{line}", name))
    rows.sort(key=lambda r: (-r[0], r[1]))
    for n, where, name in rows:
        print(f"{n:5d}  {where}  {name}")
    print(f"{len(rows)} functions over {minimum} lines")


if __name__ == "__main__":
    main(sys.argv[1:])
