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
