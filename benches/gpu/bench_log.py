"""The results a GPU run script's log holds: (step name, framework, result) for every step that
printed one — PyTorch's `RESULT {...}` lines and burn-vision bench's JSON lines."""
import json


def results(path):
    name = None
    for line in open(path):
        if line.startswith("=== ") and ":" in line:
            name = line[4:].split(":")[0]
        elif line.startswith("RESULT {"):
            yield name, "pytorch", json.loads(line[7:])
        elif line.startswith("{") and '"first_step"' in line:
            yield name, "burn", json.loads(line)


def verdict(line):
    """A GPU check's `RESULT check=...` line's verdict, "ok" or "FAIL"; None for the lines
    that print a figure or a note ("info: outside the bound", timings) rather than judge."""
    line = line.strip()
    return next((v for v in ("ok", "FAIL") if line.endswith(" " + v)), None)
