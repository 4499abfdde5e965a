"""Golden bytes for burn-vision's TensorBoard writer (src/train/tensorboard.rs), made with
TensorBoard's own event-file writer and protobuf messages.

    python3 -m venv /tmp/tb && /tmp/tb/bin/pip install tensorboard
    /tmp/tb/bin/python burn-vision/tests/golden/make_tfevents.py > burn-vision/tests/golden/tfevents.hex

Made with TensorBoard 2.21.0, protobuf 7.36.2.
"""
import glob, os, sys, tempfile

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.record_writer import RecordWriter

with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "events")
    with open(path, "wb") as f:
        w = RecordWriter(f)
        w.write(Event(wall_time=1764547200.25, file_version="brain.Event:2").SerializeToString())
        for tag, value, step in [("val/acc", 0.8125, 3), ("train/loss", 0.4375, 12)]:
            e = Event(wall_time=1764547260.5, step=step, summary=Summary(value=[Summary.Value(tag=tag, simple_value=value)]))
            w.write(e.SerializeToString())
        w.flush()
    print(open(path, "rb").read().hex())
