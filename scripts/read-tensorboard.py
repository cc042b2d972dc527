#!/usr/bin/env python3
"""Prints every scalar of the TensorBoard event files under DIR as TensorBoard shows them
(its own EventAccumulator: files in order, a restarted session's START purging the points it
replaces), as JSON {tag: [[step, value], ...]}.

  python3 scripts/read-tensorboard.py runs/<run>/tb
"""
import json
import sys

from tensorboard.backend.event_processing import event_accumulator

ea = event_accumulator.EventAccumulator(sys.argv[1], size_guidance={event_accumulator.SCALARS: 0})
ea.Reload()
print(json.dumps({t: [[s.step, s.value] for s in ea.Scalars(t)] for t in ea.Tags()["scalars"]}))
