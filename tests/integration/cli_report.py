#!/usr/bin/env python3
"""cli:report: a run draws itself at its end, and `trainctl report RUN_DIR` at any time, as one
self-contained HTML page (the same page from the same files). The page's
charts carry axes that span the run's steps and values (checked against metrics.jsonl), a dashed
line per kept checkpoint and the memory by category of summary.json; headless Chromium (Debian's
package) renders it to a picture that is not blank and shows the loss curve's colour (skipped, 77,
without chromium, except in CI). A folder that is not a run directory is exit 2, naming
metrics.jsonl; a page the run cannot write is a note, not a failed run."""
import os
import re
import shutil

import cli_util
from cli_util import check

STEPS = 12
LOSS_BLUE = (0x1F, 0x77, 0xB4)  # the train-loss line's colour (run_report.cpp)


def charts(html):
    """{chart id: {attribute: float}} of the page's <svg> elements."""
    out = {}
    for tag in re.findall(r"<svg [^>]*>", html):
        attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', tag))
        out[attrs["data-chart"]] = {k[5:]: float(v) for k, v in attrs.items()
                                    if k.startswith("data-") and k != "data-chart"}
    return out


def main(binary, root):
    with cli_util.temp_dir("report") as tmp:
        run_dir = os.path.join(tmp, "run")
        trained = cli_util.run_ok(binary, cli_util.small_run_args(run_dir, STEPS, [
            "logging.eval_every_steps=4", "checkpoint.every_steps=4", "checkpoint.keep_last=2",
            "logging.tensorboard=false"]), root)
        # The run draws its page at its end; `trainctl report` draws the same page again.
        page = os.path.join(run_dir, "report.html")
        check(f"report: {page}" in trained.stdout + trained.stderr and os.path.isfile(page),
              f"the run wrote no report.html\n{trained.describe()}")
        with open(page, encoding="utf-8") as f:
            at_end = f.read()
        result = cli_util.run_ok(binary, ["report", run_dir], root)
        with open(page, encoding="utf-8") as f:
            html = f.read()
        check(html == at_end, "trainctl report drew another page than the run did at its end")
        check("<script" not in html and "http://" not in html.replace(
            'xmlns="http://www.w3.org/2000/svg"', ""), "the page is not self-contained")

        records = cli_util.read_metrics(run_dir)
        summary = cli_util.read_summary(run_dir)
        found = charts(html)
        check(set(found) == {"loss", "lr", "throughput", "mfu", "memory"},
              f"charts {sorted(found)}")
        for chart, field, scale in (("loss", "loss", 1), ("lr", "lr", 1),
                                    ("throughput", "tokens_per_s", 1), ("mfu", "mfu", 100)):
            axes = found[chart]
            values = [r[field] * scale for r in records]
            if chart == "loss":
                values += [r["val_loss"] for r in records if "val_loss" in r]
            check(axes["x-min"] <= 1 and STEPS <= axes["x-max"] < 2 * STEPS,
                  f"{chart}: the step axis {axes['x-min']}..{axes['x-max']} is not about 1..{STEPS}")
            span = max(values) - min(values)
            check(axes["y-min"] <= min(values) and max(values) <= axes["y-max"] and
                  axes["y-max"] - axes["y-min"] <= 4 * max(span, 1e-9 * abs(max(values))) + 1e-12,
                  f"{chart}: the axis {axes['y-min']}..{axes['y-max']} does not fit "
                  f"{min(values)}..{max(values)}")
        kept = sorted(int(m) for m in re.findall(r"checkpoint at step (\d+)", html))
        check(kept == [8, 12], f"dashed checkpoint lines at {kept}, expected the kept 8 and 12")
        for category in ("params", "grads", "optimizer", "activations"):
            bytes_ = summary["memory_bytes"][category]
            check(f">{category}</text>" in html, f"the memory chart lacks {category}")
            check(found["memory"]["x-max"] >= bytes_, f"memory axis below {category}'s {bytes_}")

        # A run still training may be halfway through appending a line: the report leaves it out.
        with open(os.path.join(run_dir, "metrics.jsonl"), "a", encoding="utf-8") as f:
            f.write('{"step": 13, "lo')
        result = cli_util.run_ok(binary, ["report", run_dir, "--out", os.path.join(tmp, "p.html")],
                                 root)
        check(f"({STEPS} steps" in result.stdout, f"a partial line was read\n{result.describe()}")

        # Not a run directory: exit 2 naming the missing file, nothing written.
        empty = os.path.join(tmp, "empty")
        os.mkdir(empty)
        result = cli_util.run(binary, ["report", empty], root)
        check(result.rc == 2 and "metrics.jsonl" in result.stderr,
              f"expected exit 2 naming metrics.jsonl\n{result.describe()}")
        check(os.listdir(empty) == [], "report wrote into a folder that is not a run directory")

        # A page that cannot be written (a folder in its place here; a full disk in life) does not
        # fail a run that trained: it says so and how to draw the page later, and exits 0.
        os.remove(page)
        os.makedirs(os.path.join(page, "in-the-way"))
        result = cli_util.run_ok(binary, ["resume", run_dir, "--set",
                                          f"training.steps={STEPS + 2}"], root)
        check(re.search(rf"report: not written \(.*{re.escape(page)}.*\); trainctl report "
                        rf"{re.escape(run_dir)} draws it later", result.stdout + result.stderr),
              f"no 'report: not written (...)' line\n{result.describe()}")
        shutil.rmtree(page)
        with open(page, "w", encoding="utf-8") as f:
            f.write(html)

        # Rendered by Chromium: a picture with the loss line's blue in it, mostly not blank.
        shot = os.path.join(tmp, "report.png")
        cli_util.screenshot(page, shot, (800, 1400))
        width, height, rows = cli_util.png_pixels(shot)
        pixels = [p for row in rows for p in row]
        inked = sum(1 for p in pixels if p != (255, 255, 255))
        blue = sum(1 for p in pixels if all(abs(a - b) <= 40 for a, b in zip(p, LOSS_BLUE)))
        check(inked > 0.02 * len(pixels), f"the picture is nearly blank: {inked} inked pixels")
        check(blue > 100, f"the loss curve's blue is missing from the picture ({blue} pixels)")

        print(f"{width}x{height} picture, {inked} inked pixels, {blue} of the loss blue")


if __name__ == "__main__":
    cli_util.main_wrapper(main)
