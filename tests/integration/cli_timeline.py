#!/usr/bin/env python3
"""cli:timeline: the pipeline schedule as a picture.

`trainctl plan --timeline` draws the previewed layout's 1F1B schedule on the planner's stage times
(a row per stage, the bubble), puts it into the document with --json, and --timeline-svg writes it
as an SVG page. A run with logging.timeline_step writes timeline.json (every stage's measured
actions, transfers included, and the planner's schedule for the same layout) and timeline.svg
beside metrics.jsonl. Every stage's actions follow each other in time; both pages, rendered by
headless Chromium, show each stage's row with its forward (blue) and backward (orange) boxes, and
no two boxes of a stage overlap. The planner's ZB-H1 picture (`--layout ...,schedule=zb-h1`) adds
the weight-gradient passes: W/w in the text, green boxes in the SVG, on every stage. Bad input exits 2 before anything is written: an SVG path in a
folder that does not exist, a timeline_step past training.steps."""
import json
import os
import re

import cli_util
from cli_util import check

H100 = "configs/clusters/dgx-h100.yaml"
FORWARD_BLUE = (0x4C, 0x78, 0xA8)
BACKWARD_ORANGE = (0xF5, 0x85, 0x18)
WEIGHT_GREEN = (0x54, 0xA2, 0x4B)


def boxes(svg):
    """{stage: [(x0, x1, y, op, micro_batch)]} of the page's forward, backward and (ZB-H1)
    weight-gradient boxes."""
    found = {}
    for m in re.finditer(r'data-stage="(\d+)" data-op="(forward|backward|weight_grad)" '
                         r'data-micro-batch="(\d+)" x="([0-9.]+)" y="([0-9.]+)" '
                         r'width="([0-9.]+)"', svg):
        x, w = float(m.group(4)), float(m.group(6))
        found.setdefault(int(m.group(1)), []).append(
            (x, x + w, float(m.group(5)), m.group(2), int(m.group(3))))
    return found


def check_page(path, stages, micro_batches, label, tmp, weight=False):
    """The SVG has 2 m boxes per stage (3 m with the weight-gradient passes), none overlapping
    another of its stage, and Chromium draws each stage's row with both colours (all three)."""
    per_micro_batch = 3 if weight else 2
    with open(path, encoding="utf-8") as f:
        svg = f.read()
    check(svg.startswith('<svg xmlns="http://www.w3.org/2000/svg"'), f"{label}: not an SVG page")
    found = boxes(svg)
    check(sorted(found) == list(range(stages)), f"{label}: stages {sorted(found)}")
    for stage, spans in found.items():
        check(len(spans) == per_micro_batch * micro_batches,
              f"{label}: stage {stage} has {len(spans)} boxes, not "
              f"{per_micro_batch * micro_batches}")
        check(sum(1 for s in spans if s[3] == "weight_grad") == (micro_batches if weight else 0),
              f"{label}: stage {stage}'s weight-gradient boxes")
        spans.sort()
        for a, b in zip(spans, spans[1:]):
            check(b[0] >= a[1] - 0.011, f"{label}: stage {stage}: {a} overlaps {b}")
    width, height = (int(float(v)) for v in
                     re.search(r'<svg [^>]*width="([0-9.]+)" height="([0-9.]+)"', svg).groups())
    shot = os.path.join(tmp, os.path.basename(path) + ".png")
    cli_util.screenshot(path, shot, (width, height))
    _, _, rows = cli_util.png_pixels(shot)

    def near(p, colour):
        return all(abs(a - b) <= 30 for a, b in zip(p, colour))

    for stage, spans in found.items():
        y = int(spans[0][2]) + 15  # the middle of the row (30 px high)
        line = rows[y]
        blue = sum(1 for p in line if near(p, FORWARD_BLUE))
        orange = sum(1 for p in line if near(p, BACKWARD_ORANGE))
        check(blue > 3 and orange > 3,
              f"{label}: stage {stage}'s row (y={y}) shows {blue} blue and {orange} orange pixels")
        green = sum(1 for p in line if near(p, WEIGHT_GREEN))
        check(green > 3 if weight else green == 0,
              f"{label}: stage {stage}'s row (y={y}) shows {green} green pixels")


def main(binary, root):
    with cli_util.temp_dir("timeline") as tmp:
        # The planner's picture of a 4-stage layout of a 1.3B-class model on two H100 nodes (the
        # last stage's 32K-token head shows as its longer boxes).
        sets = ["training.global_batch=64", "training.micro_batch=2", "model.layers=8",
                "model.hidden=2048", "model.heads=16", "model.kv_heads=16",
                "model.ffn_hidden=8192", "model.seq_len=2048", "model.vocab=32000"]
        plan = ["plan", "recipes/tiny.yaml", "--cluster", H100, "--nodes", "2",
                "--layout", "tp=1,pp=4", *[a for s in sets for a in ("--set", s)]]
        result = cli_util.run_ok(binary, plan + ["--timeline"], root)
        out = result.stdout
        check("pipeline timeline of tp=1 pp=4 dp=4" in out, f"no timeline header\n{out}")
        for stage in range(4):
            check(re.search(rf"^stage {stage} +\|[FfBb.]+( \.\.\. [FfBb.]+)?\|$", out, re.M),
                  f"no row for stage {stage}\n{out}")
        check(re.search(r"1f1b, 4 stages, 8 micro-batches: step .*, bubble \d+\.\d% of the "
                        r"stages' time", out), f"no bubble line\n{out}")

        doc = json.loads(cli_util.run_ok(binary, plan + ["--timeline", "--json"], root).stdout)
        timeline = doc["timeline"]
        check(timeline["micro_batches"] == 8 and len(timeline["stages"]) == 4,
              f"timeline: {timeline['micro_batches']} micro-batches, "
              f"{len(timeline['stages'])} stages")
        check(0 < timeline["bubble_share"] < 1 and timeline["step_s"] > 0,
              f"timeline figures {timeline['bubble_share']}, {timeline['step_s']}")
        check(all(len(s) == 16 for s in timeline["stages"]), "each stage: 8 forwards, 8 backwards")

        page = os.path.join(tmp, "plan.svg")
        result = cli_util.run_ok(binary, plan + ["--timeline-svg", page], root)
        check(os.path.isfile(page) and page in result.stderr,
              f"no SVG written or named\n{result.describe()}")
        check_page(page, 4, 8, "plan --timeline-svg", tmp)

        # The same layout under ZB-H1: F, B and W on every stage, a smaller bubble.
        zb = ["plan", "recipes/tiny.yaml", "--cluster", H100, "--nodes", "2",
              "--layout", "tp=1,pp=4,schedule=zb-h1", *[a for s in sets for a in ("--set", s)]]
        out = cli_util.run_ok(binary, zb + ["--timeline"], root).stdout
        check("pipeline timeline of tp=1 pp=4 dp=4" in out and "schedule=zb-h1" in out,
              f"no zb-h1 timeline header\n{out}")
        for stage in range(4):
            row = re.search(rf"^stage {stage} +\|([FfBbWw.]+)( \.\.\. [FfBbWw.]+)?\|$", out, re.M)
            check(row and re.search("[Ww]", row.group(0)), f"no W in stage {stage}'s row\n{out}")
        check("W/w weight gradient" in out, f"no W in the legend\n{out}")
        zb_doc = json.loads(cli_util.run_ok(binary, zb + ["--timeline", "--json"], root).stdout)
        check(zb_doc["preview"]["runs"] and zb_doc["preview"]["layout"]["pp_schedule"] == "zb-h1",
              f"zb-h1 preview: {zb_doc['preview']}")
        zb_timeline = zb_doc["timeline"]
        check(zb_timeline["schedule"] == "zb-h1", f"schedule {zb_timeline['schedule']}")
        check(all(sorted({a["op"] for a in s}) == ["backward", "forward", "weight_grad"] and
                  len(s) == 24 for s in zb_timeline["stages"]),
              "each zb-h1 stage: 8 forwards, 8 backwards, 8 weight-gradient passes")
        check(zb_timeline["bubble_share"] < timeline["bubble_share"],
              f"zb-h1 bubble {zb_timeline['bubble_share']} vs 1f1b {timeline['bubble_share']}")
        zb_page = os.path.join(tmp, "plan-zb.svg")
        cli_util.run_ok(binary, zb + ["--timeline-svg", zb_page], root)
        check_page(zb_page, 4, 8, "plan --timeline-svg (zb-h1)", tmp, weight=True)

        missing = os.path.join(tmp, "no-such-folder", "plan.svg")
        result = cli_util.run(binary, plan + ["--timeline-svg", missing], root)
        check(result.rc == 2 and "no-such-folder" in result.stderr,
              f"a missing folder: expected exit 2 naming it\n{result.describe()}")
        check(not os.path.exists(os.path.dirname(missing)), "the missing folder was created")

        # A run: pp2 over 4 micro-batches, step 2 of 3 timed.
        run_dir = os.path.join(tmp, "run")
        cli_util.run_ok(binary, cli_util.small_run_args(run_dir, 3, [
            "parallel.pp=2", "training.micro_batch=2", "logging.timeline_step=2",
            "logging.eval_every_steps=0", "logging.tensorboard=false"]), root)
        with open(os.path.join(run_dir, "timeline.json"), encoding="utf-8") as f:
            written = json.load(f)
        check(written["schema"] == "trainctl.timeline/1" and written["step"] == 2,
              f"timeline.json: {written.get('schema')} step {written.get('step')}")
        check("pp=2" in written["layout"], f"layout {written['layout']}")
        measured = written["measured"]
        check(len(measured["stages"]) == 2 and measured["micro_batches"] == 4,
              f"measured: {len(measured['stages'])} stages, {measured['micro_batches']} "
              "micro-batches")
        for stage, actions in enumerate(measured["stages"]):
            # 4 forwards, 4 backwards, and one transfer of each per micro-batch.
            check(len(actions) == 16, f"stage {stage}: {len(actions)} actions, not 16")
            ops = {a["op"] for a in actions}
            want = {"forward", "backward"} | ({"send_activation", "recv_grad"} if stage == 0 else
                                              {"recv_activation", "send_grad"})
            check(ops == want, f"stage {stage}: ops {sorted(ops)}")
            for a, b in zip(actions, actions[1:]):
                check(b["start_s"] >= a["end_s"] - 1e-9 and a["end_s"] >= a["start_s"],
                      f"stage {stage}: {a} and {b} are not in order")
        check(0 <= measured["bubble_share"] < 1, f"measured bubble {measured['bubble_share']}")
        planned = written["planned"]
        check(len(planned["stages"]) == 2 and 0 < planned["bubble_share"] < 1,
              f"planned: {planned}")
        check_page(os.path.join(run_dir, "timeline.svg"), 2, 4, "the run's timeline.svg", tmp)

        late = os.path.join(tmp, "late")
        result = cli_util.run(binary, cli_util.small_run_args(late, 3, [
            "parallel.pp=2", "logging.timeline_step=5"]), root)
        check(result.rc == 2 and "logging.timeline_step <= training.steps fails: 5 > 3"
              in result.stderr, f"timeline_step past the end: expected exit 2\n{result.describe()}")
        check(not os.path.exists(late), "the run directory was created")
        print(f"plan: bubble {100 * timeline['bubble_share']:.1f}% (zb-h1: "
              f"{100 * zb_timeline['bubble_share']:.1f}%); run: measured "
              f"{100 * measured['bubble_share']:.1f}%, planned {100 * planned['bubble_share']:.1f}%")


if __name__ == "__main__":
    cli_util.main_wrapper(main)
