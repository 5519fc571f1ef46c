#!/usr/bin/env python3
"""Turn the output of Debian's `bible` reader (package bible-kjv) into data/kjv.txt.

Input: `bible -p <dir with bible.data> -l10000 "gen1:1-rev22:21"` (one verse per line, numbered).
Output (stdout): the books Genesis through Ruth as plain prose: the book name, a blank line, then
one paragraph per chapter (verse numbers stripped, verses joined by spaces, wrapped at 79 columns),
paragraphs separated by blank lines. See data/README.md for the full recipe.
"""
import re
import sys
import textwrap

LAST_BOOK = "Ruth"  # Genesis..Ruth is about 1 MiB of text


def parse(lines):
    books = []  # [(name, [[verse, ...] per chapter])]
    verses = None
    for line in lines:
        heading = re.fullmatch(r"(\S.*?) (\d+)", line)
        if heading:
            name = heading.group(1)
            if not books or books[-1][0] != name:
                books.append((name, []))
            verses = []
            books[-1][1].append(verses)
            continue
        verse = re.fullmatch(r"\s+\d+ (.*)", line)
        if verse:
            verses.append(verse.group(1).strip())
        elif line.strip():
            raise SystemExit(f"make_kjv_text: unexpected line {line!r}")
    return books


def main():
    books = parse(open(sys.argv[1], encoding="ascii").read().split("\n"))
    out = []
    for name, chapters in books:
        out.append(name + "\n")
        for verses in chapters:
            out.append("\n" + textwrap.fill(" ".join(verses), width=79) + "\n")
        out.append("\n\n")
        if name == LAST_BOOK:
            break
    sys.stdout.write("".join(out).rstrip("\n") + "\n")


if __name__ == "__main__":
    main()
