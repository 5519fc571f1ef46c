#!/usr/bin/env python3
"""Load a TensorBoard log directory with TensorBoard's own reader and print its scalars as JSON.

Usage: read_tensorboard.py DIR

Prints {"tag": [[step, value], ...], ...} on stdout, values as Python floats (exact float32
values widened to double; JSON keeps them exact). Used by tests/unit/telemetry_*_test.cpp to prove
that trainctl's hand-written event files load in the real reader.

Exit codes: 0 ok, 2 bad usage, 3 the tensorboard package is missing (run scripts/setup --tests).
"""
import json
import sys


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: read_tensorboard.py DIR", file=sys.stderr)
        return 2
    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError as error:
        print(f"cannot import tensorboard ({error}): run scripts/setup --tests", file=sys.stderr)
        return 3
    # size_guidance 0 = keep every scalar (the default samples down to 10,000 per tag).
    accumulator = event_accumulator.EventAccumulator(
        sys.argv[1], size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    scalars = {
        tag: [[event.step, event.value] for event in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }
    json.dump(scalars, sys.stdout, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
