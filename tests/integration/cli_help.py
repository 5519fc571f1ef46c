#!/usr/bin/env python3
"""cli:help: every subcommand's --help ends with examples and the pages to read; the files the
examples and pages name exist, and the examples that create nothing (validate, plan, submit
--dry-run, version) run and exit 0 as written."""
import os
import re
import shlex

import cli_util
from cli_util import check

SUBCOMMANDS = [["run"], ["validate"], ["resume"], ["ckpt"], ["ckpt", "inspect"],
               ["ckpt", "verify"], ["ckpt", "export"], ["plan"], ["submit"], ["report"],
               ["data"], ["data", "encode"], ["version"]]
# Examples that write nothing (submit --dry-run prints the batch script): run as written.
RUNNABLE = ("validate", "plan", "version", "--version")


def footer(text):
    """(examples, read) of a --help text: the lines under 'Examples:' and the 'Read:' line."""
    check("\nExamples:\n" in text, f"no 'Examples:' section\n{text}")
    tail = text.split("\nExamples:\n", 1)[1]
    examples = [line.strip() for line in tail.splitlines() if line.startswith("  trainctl")]
    reads = [line for line in tail.splitlines() if line.startswith("Read: ")]
    check(len(reads) == 1, f"expected one 'Read:' line after the examples\n{text}")
    return examples, reads[0]


def main(binary, root):
    for path in SUBCOMMANDS:
        name = " ".join(path)
        text = cli_util.run_ok(binary, [*path, "--help"], root).stdout
        examples, read = footer(text)
        check(2 <= len(examples) <= 3, f"{name}: {len(examples)} examples, expected 2 or 3\n{text}")
        for example in examples:
            words = shlex.split(example)
            check(words[1:1 + len(path)] == path or (path == ["version"] and
                                                     words[1] == "--version"),
                  f"{name}: the example '{example}' is not of this subcommand")
            for word in words:
                if re.match(r"^(recipes|configs)/.+\.yaml$", word):
                    check(os.path.isfile(os.path.join(root, word)),
                          f"{name}: the example '{example}' names {word}, which does not exist")
            if words[1] in RUNNABLE or "--dry-run" in words:
                result = cli_util.run(binary, words[1:], root)
                check(result.rc == 0, f"{name}: the example '{example}' fails\n"
                                      f"{result.describe()}")
        pages = re.findall(r"[\w./-]+\.md", read)
        check(pages, f"{name}: the 'Read:' line names no page: {read}")
        for page in pages:
            check(os.path.isfile(os.path.join(root, page)),
                  f"{name}: '{read}' names {page}, which does not exist")


if __name__ == "__main__":
    cli_util.main_wrapper(main)
